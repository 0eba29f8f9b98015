// One webhook per policy, managed by a real `portcullis serve` and called by a real apiserver:
// what kubectl users see (denials, warnings, mutations), the configuration's fields, reload,
// the namespace exclusion, a foreign same-named object, and cleanup on SIGTERM.
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cli } from '../helpers/cli.ts';
import {
  configMap, getMutating, getObject, getValidating, hookNames, HOST_NAMESPACE, kubectl, kubectlOk, leaderIdentity, policy, prepareNamespaces,
  readCa, removeWebhookConfigurations, startHost, stopAllHosts, waitFor, WORK_NAMESPACE, type Host,
} from './helpers.ts';

const NAME = 'portcullis.e2e.dev';
const configmaps = (operations: string[]) => ({ operations, apiGroups: [''], apiVersions: ['v1'], resources: ['configmaps'] });

const policies = [
  policy('require-labels', { modes: ['validate'], settings: { labels: { team: 'unowned' } }, rules: [configmaps(['CREATE', 'UPDATE'])] }),
  policy('added-by', { settings: { value: 'e2e' }, rules: [configmaps(['CREATE'])], reinvocationPolicy: 'IfNeeded' }),
  // After added-by, changing its annotation: the apiserver calls added-by again (IfNeeded), and
  // run --config must say so too.
  { ...policy('added-by'), name: 'added-by-late', settings: { value: 'late' }, rules: [configmaps(['CREATE'])] },
  policy('show-auth', { failurePolicy: 'Ignore', rules: [configmaps(['CREATE'])], match: [{ kind: 'ConfigMap', labelSelector: { matchLabels: { 'portcullis.dev/show-auth': 'true' } } }] }),
  policy('no-delete', { persistent: true, sideEffects: 'NoneOnDryRun', rules: [configmaps(['DELETE'])] }),
];

let host: Host;

beforeAll(async () => {
  await removeWebhookConfigurations();
  await prepareNamespaces();
  host = await startHost({ managed: NAME, policies });
  await waitFor('managed configurations', async () => hookNames(await getValidating(NAME)).length === 3 && hookNames(await getMutating(NAME)).length === 2);
});

afterAll(async () => {
  await stopAllHosts();
  await removeWebhookConfigurations();
});

describe('per-policy webhooks against a real apiserver', () => {
  it('registers one webhook per policy and mode, with every field', async () => {
    const validating = (await getValidating(NAME))!;
    const mutating = (await getMutating(NAME))!;
    expect(validating.metadata.labels).toMatchObject({ 'app.kubernetes.io/managed-by': 'portcullis' });
    expect(hookNames(validating)).toEqual([`require-labels.${NAME}`, `show-auth.${NAME}`, `no-delete.${NAME}`]);
    expect(hookNames(mutating)).toEqual([`added-by.${NAME}`, `added-by-late.${NAME}`]);
    const ca = Buffer.from(await readCa(host)).toString('base64');
    const [requireLabels, showAuth, noDelete] = validating.webhooks!;
    expect(requireLabels).toMatchObject({
      clientConfig: { url: `${host.url}/validate/require-labels`, caBundle: ca },
      rules: [{ ...configmaps(['CREATE', 'UPDATE']), scope: '*' }],
      objectSelector: {},
      namespaceSelector: { matchExpressions: [
        { key: 'kubernetes.io/metadata.name', operator: 'NotIn', values: ['kube-node-lease', 'kube-system', HOST_NAMESPACE].sort() },
        { key: 'portcullis.dev/ignore', operator: 'NotIn', values: ['true'] },
      ] },
      failurePolicy: 'Fail', sideEffects: 'None', timeoutSeconds: 5, matchPolicy: 'Equivalent', admissionReviewVersions: ['v1', 'v1beta1'],
    });
    // The single match selector's labelSelector went to the apiserver as an objectSelector.
    expect(showAuth!.objectSelector).toEqual({ matchLabels: { 'portcullis.dev/show-auth': 'true' } });
    expect(showAuth!.failurePolicy).toBe('Ignore');
    expect(noDelete!.sideEffects).toBe('NoneOnDryRun');
    expect(mutating.webhooks![0]).toMatchObject({ clientConfig: { url: `${host.url}/mutate/added-by`, caBundle: ca }, reinvocationPolicy: 'IfNeeded' });
    const lease = await getObject<{ spec: Record<string, unknown> }>('lease', NAME, HOST_NAMESPACE);
    expect(lease!.spec).toMatchObject({ holderIdentity: leaderIdentity(host), leaseDurationSeconds: 3, leaseTransitions: 0 });
    expect(lease!.spec.renewTime).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$/);
  });

  it('denies with the policy message as kubectl shows it', async () => {
    const result = await kubectl(['create', '-f', '-'], { input: configMap('unlabelled', WORK_NAMESPACE) });
    expect(result.code).not.toBe(0);
    expect(result.stderr).toContain(`admission webhook "require-labels.${NAME}" denied the request: policy "require-labels": missing required label: team`);
    expect(await getObject('configmap', 'unlabelled', WORK_NAMESPACE)).toBeUndefined();
  });

  it('stores the mutating policy’s patch and shows warnings', async () => {
    const result = await kubectl(['create', '-f', '-'], { input: configMap('labelled', WORK_NAMESPACE, { team: 'a', 'portcullis.dev/show-auth': 'true' }) });
    expect(result.stderr).toContain('Warning: policy "show-auth": TLS peer: none');
    expect(result.stderr).toContain('Warning: policy "show-auth": Authorization header: absent');
    expect(result.code).toBe(0);
    const stored = await getObject<{ metadata: { annotations?: Record<string, string> } }>('configmap', 'labelled', WORK_NAMESPACE);
    // added-by-late set "late" after added-by; added-by, IfNeeded, was called again.
    expect(stored!.metadata.annotations).toMatchObject({ 'portcullis.dev/added-by': 'e2e' });
    // portcullis run --config on the host's own configuration says what the apiserver stored.
    const manifest = join(host.dir, 'labelled.json');
    await writeFile(manifest, configMap('labelled', WORK_NAMESPACE, { team: 'a' }));
    const offline = await cli(['run', '--config', host.configFile, '--request', manifest, '--namespace', WORK_NAMESPACE, '--mode', 'mutate', '--show', 'patched']);
    expect(offline.code, offline.stderr).toBe(0);
    expect((JSON.parse(offline.stdout) as { metadata: { annotations: Record<string, string> } }).metadata.annotations).toEqual({ 'portcullis.dev/added-by': 'e2e' });
    // No show-auth label: the apiserver does not call show-auth at all (objectSelector), so no warning.
    const quiet = await kubectl(['create', '-f', '-'], { input: configMap('quiet', WORK_NAMESPACE, { team: 'a' }) });
    expect(quiet.code).toBe(0);
    expect(quiet.stderr).not.toContain('Warning');
  });

  it('denies DELETE of a protected object', async () => {
    await kubectlOk(['create', '-f', '-'], { input: configMap('protected', WORK_NAMESPACE, { team: 'a', 'portcullis.dev/no-delete': 'true' }) });
    const result = await kubectl(['delete', 'configmap', 'protected', '-n', WORK_NAMESPACE]);
    expect(result.code).not.toBe(0);
    expect(result.stderr).toContain(`admission webhook "no-delete.${NAME}" denied the request`);
    expect(result.stderr).toContain('protected is protected by the label portcullis.dev/no-delete="true"');
  });

  it('never applies to the host’s namespace, kube-system, or a namespace labelled portcullis.dev/ignore', async () => {
    for (const ns of [HOST_NAMESPACE, 'kube-system', 'e2e-ignored']) {
      const result = await kubectl(['create', '-f', '-'], { input: configMap(`free-${Date.now()}`, ns) });
      expect(result.stderr).toBe('');
      expect(result.code).toBe(0);
    }
  });

  it('follows a reload: removed policies lose their webhooks, changed ones are updated', async () => {
    const before = (await getValidating(NAME))!.metadata.resourceVersion;
    await host.rewrite((config) => {
      const list = config.policies as { name: string; failurePolicy?: string }[];
      config.policies = list.filter((p) => p.name !== 'require-labels').map((p) => (p.name === 'show-auth' ? { ...p, failurePolicy: 'Fail' } : p));
    });
    const after = await waitFor('the reload to reach the cluster', async () => {
      const config = await getValidating(NAME);
      return hookNames(config).join() === `show-auth.${NAME},no-delete.${NAME}` ? config : undefined;
    });
    expect(after.metadata.resourceVersion).not.toBe(before);
    expect(after.webhooks![0]!.failurePolicy).toBe('Fail');
    const result = await kubectl(['create', '-f', '-'], { input: configMap('unlabelled-after-reload', WORK_NAMESPACE) });
    expect(result.code).toBe(0);
  });

  it('removes non-persistent webhooks on SIGTERM, keeps persistent ones, and releases the lease', async () => {
    await kubectlOk(['create', '-f', '-'], { input: configMap('doomed', WORK_NAMESPACE, { team: 'a' }) });
    expect(await host.stop('SIGTERM')).toBe(0);
    expect(host.output()).toMatch(/removed the webhooks of non-persistent policies/);
    expect(hookNames(await getValidating(NAME))).toEqual([`no-delete.${NAME}`]);
    expect(await getMutating(NAME)).toBeUndefined();
    const lease = await getObject<{ spec: { holderIdentity?: string } }>('lease', NAME, HOST_NAMESPACE);
    expect(lease!.spec.holderIdentity ?? '').toBe('');
    // The persistent webhook still points at the stopped host and fails closed: by design.
    const result = await kubectl(['delete', 'configmap', 'doomed', '-n', WORK_NAMESPACE]);
    expect(result.code).not.toBe(0);
    expect(result.stderr).toMatch(/failed calling webhook "no-delete\.portcullis\.e2e\.dev"/);
    await removeWebhookConfigurations();
  });
});

describe('a same-named configuration the host did not create', () => {
  it('is never modified; the error says what to do', async () => {
    const foreign = 'foreign.e2e.dev';
    await kubectlOk(['create', '-f', '-'], {
      input: JSON.stringify({
        apiVersion: 'admissionregistration.k8s.io/v1', kind: 'ValidatingWebhookConfiguration', metadata: { name: foreign },
        webhooks: [{
          name: 'someone-else.foreign.e2e.dev', clientConfig: { url: 'https://127.0.0.1:1/never' }, sideEffects: 'None', admissionReviewVersions: ['v1'], failurePolicy: 'Ignore',
          rules: [{ operations: ['CREATE'], apiGroups: ['e2e.example.com'], apiVersions: ['v1'], resources: ['widgets'] }],
        }],
      }),
    });
    const before = (await getValidating(foreign))!;
    const other = await startHost({ managed: foreign, policies: policies.slice(0, 2) });
    await other.waitForLog(/ValidatingWebhookConfiguration \\"foreign\.e2e\.dev\\" exists but is not managed by Portcullis.*?Delete it, or set webhooks.managed to another name/);
    // The mutating one is ours to create.
    await waitFor('the mutating configuration', async () => hookNames(await getMutating(foreign)).length === 1);
    expect(await other.stop('SIGTERM')).toBe(0);
    const after = (await getValidating(foreign))!;
    expect(after.metadata.resourceVersion).toBe(before.metadata.resourceVersion);
    expect(hookNames(after)).toEqual(['someone-else.foreign.e2e.dev']);
    expect(await getMutating(foreign)).toBeUndefined();
    await kubectlOk(['delete', 'validatingwebhookconfiguration', foreign]);
  });
});
