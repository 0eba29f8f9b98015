// Single-webhook mode: one validating webhook (/validate) and one mutating webhook (/mutate)
// carry every policy; the host picks the policies per request.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  configMap, getMutating, getObject, getValidating, hookNames, kubectl, policy, prepareNamespaces, readCa, removeWebhookConfigurations,
  startHost, stopAllHosts, waitFor, WORK_NAMESPACE, type Host,
} from './helpers.ts';

const NAME = 'single.e2e.dev';
const rule = (resources: string[], operations: string[]) => ({ operations, apiGroups: [''], apiVersions: ['v1'], resources });

let host: Host;

beforeAll(async () => {
  await removeWebhookConfigurations();
  await prepareNamespaces();
  host = await startHost({
    managed: NAME,
    webhooks: { singleWebhook: true },
    policies: [
      policy('require-labels', { modes: ['validate'], settings: { labels: { team: 'unowned' } }, rules: [rule(['configmaps'], ['CREATE']), rule(['pods'], ['CREATE'])], failurePolicy: 'Ignore' }),
      policy('added-by', { settings: { value: 'single' }, rules: [rule(['configmaps'], ['CREATE'])], failurePolicy: 'Ignore' }),
      policy('show-auth', { rules: [rule(['configmaps'], ['CREATE'])], match: [{ labelSelector: { matchLabels: { 'portcullis.dev/show-auth': 'true' } } }] }),
    ],
  });
  await waitFor('managed configurations', async () => hookNames(await getValidating(NAME)).length === 1 && hookNames(await getMutating(NAME)).length === 1);
});

afterAll(async () => {
  await stopAllHosts();
  await removeWebhookConfigurations();
});

describe('single-webhook mode against a real apiserver', () => {
  it('registers validate.<name> and mutate.<name> with the union of the rules', async () => {
    const validating = (await getValidating(NAME))!;
    const mutating = (await getMutating(NAME))!;
    const ca = Buffer.from(await readCa(host)).toString('base64');
    expect(validating.webhooks).toHaveLength(1);
    expect(validating.webhooks![0]).toMatchObject({
      name: `validate.${NAME}`,
      clientConfig: { url: `${host.url}/validate`, caBundle: ca },
      rules: [{ ...rule(['configmaps'], ['CREATE']), scope: '*' }, { ...rule(['pods'], ['CREATE']), scope: '*' }],
      objectSelector: {},
      // Fail: show-auth is Fail, so the union cannot be Ignore.
      failurePolicy: 'Fail',
    });
    expect(mutating.webhooks![0]).toMatchObject({ name: `mutate.${NAME}`, clientConfig: { url: `${host.url}/mutate`, caBundle: ca }, failurePolicy: 'Ignore', reinvocationPolicy: 'Never' });
  });

  it('denies, mutates and warns through the single webhooks', async () => {
    const denied = await kubectl(['create', '-f', '-'], { input: configMap('single-unlabelled', WORK_NAMESPACE) });
    expect(denied.code).not.toBe(0);
    expect(denied.stderr).toContain(`admission webhook "validate.${NAME}" denied the request: policy "require-labels": missing required label: team`);
    const allowed = await kubectl(['create', '-f', '-'], { input: configMap('single-labelled', WORK_NAMESPACE, { team: 'a', 'portcullis.dev/show-auth': 'true' }) });
    expect(allowed.code).toBe(0);
    expect(allowed.stderr).toContain('Warning: policy "show-auth": TLS peer: none');
    const stored = await getObject<{ metadata: { annotations?: Record<string, string> } }>('configmap', 'single-labelled', WORK_NAMESPACE);
    expect(stored!.metadata.annotations).toMatchObject({ 'portcullis.dev/added-by': 'single' });
  });

  it('denies a Pod too (it stays Pending: there are no nodes)', async () => {
    const pod = { apiVersion: 'v1', kind: 'Pod', metadata: { name: 'single-pod', namespace: WORK_NAMESPACE }, spec: { containers: [{ name: 'c', image: 'example.invalid/none' }] } };
    const denied = await kubectl(['create', '-f', '-'], { input: JSON.stringify(pod) });
    expect(denied.stderr).toContain(`admission webhook "validate.${NAME}" denied the request: policy "require-labels": missing required label: team`);
    const labelled = await kubectl(['create', '-f', '-'], { input: JSON.stringify({ ...pod, metadata: { ...pod.metadata, labels: { team: 'a' } } }) });
    expect(labelled.code).toBe(0);
  });

  it('removes both webhooks on SIGTERM (no policy is persistent)', async () => {
    expect(await host.stop('SIGTERM')).toBe(0);
    expect(await getValidating(NAME)).toBeUndefined();
    expect(await getMutating(NAME)).toBeUndefined();
  });
});
