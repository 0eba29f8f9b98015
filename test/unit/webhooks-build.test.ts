import { describe, expect, it } from 'vitest';
import type { PolicyConfig, WebhooksConfig } from '../../host/src/config/types.ts';
import { ConfigError } from '../../host/src/errors.ts';
import { DEFAULT_LIMITS } from '../../host/src/config/limits.ts';
import {
  andSelectors,
  buildConfigurations,
  checkManagedName,
  DEFAULT_RULES,
  excludedNamespaces,
  hostNamespace,
  ignoredButFailing,
  persistentOnly,
  type BuildInput,
  type ManagedPolicy,
} from '../../host/src/webhooks/build.ts';

function policy(name: string, overrides: Partial<PolicyConfig> = {}, modes: ManagedPolicy['modes'] = ['validate', 'mutate']): ManagedPolicy {
  return {
    modes,
    config: {
      name, module: `/p/${name}.wasm`, settings: {}, limits: DEFAULT_LIMITS, failurePolicy: 'Fail', enforcement: 'enforce', isolation: 'reuse',
      persistent: false, rules: [], match: [], sideEffects: 'None', reinvocationPolicy: 'Never', ...overrides,
    },
  };
}

const webhooks: WebhooksConfig = {
  managed: 'portcullis.example.com', singleWebhook: false, timeoutSeconds: 7, url: 'https://127.0.0.1:8443/',
  excludeNamespaces: ['kube-system'], ignoreLabel: 'portcullis.dev/ignore', leaderElection: true, leaseDurationSeconds: 15, resyncSeconds: 60,
};

const CA = '-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n';

function build(policies: ManagedPolicy[], overrides: Partial<BuildInput> = {}) {
  return buildConfigurations({ name: 'portcullis.example.com', policies, webhooks, caBundle: CA, excludeNamespaces: ['kube-system', 'portcullis'], ...overrides });
}

const configmaps = { operations: ['CREATE', 'UPDATE'], apiGroups: [''], apiVersions: ['v1'], resources: ['configmaps'] };

describe('per-policy webhooks', () => {
  it('gives each policy one webhook per mode, with every field the apiserver needs', () => {
    const { validating, mutating } = build([policy('require-labels', { rules: [configmaps], failurePolicy: 'Ignore', sideEffects: 'NoneOnDryRun' }, ['validate'])]);
    expect(validating.metadata).toEqual({ name: 'portcullis.example.com', labels: { 'app.kubernetes.io/managed-by': 'portcullis' } });
    expect(validating.webhooks).toEqual([{
      name: 'require-labels.portcullis.example.com',
      clientConfig: { url: 'https://127.0.0.1:8443/validate/require-labels', caBundle: Buffer.from(CA).toString('base64') },
      rules: [{ ...configmaps, scope: '*' }],
      objectSelector: {},
      namespaceSelector: { matchExpressions: [
        { key: 'kubernetes.io/metadata.name', operator: 'NotIn', values: ['kube-system', 'portcullis'] },
        { key: 'portcullis.dev/ignore', operator: 'NotIn', values: ['true'] },
      ] },
      failurePolicy: 'Ignore',
      sideEffects: 'NoneOnDryRun',
      timeoutSeconds: 7,
      matchPolicy: 'Equivalent',
      admissionReviewVersions: ['v1', 'v1beta1'],
    }]);
    expect(mutating.webhooks).toEqual([]);
  });

  it('gives mutators their path and reinvocationPolicy, in policy order', () => {
    const { validating, mutating } = build([policy('a', {}, ['mutate']), policy('b', { reinvocationPolicy: 'IfNeeded' })]);
    expect(mutating.webhooks!.map((w) => [w.name, w.clientConfig.url, w.reinvocationPolicy])).toEqual([
      ['a.portcullis.example.com', 'https://127.0.0.1:8443/mutate/a', 'Never'],
      ['b.portcullis.example.com', 'https://127.0.0.1:8443/mutate/b', 'IfNeeded'],
    ]);
    expect(validating.webhooks!.map((w) => w.name)).toEqual(['b.portcullis.example.com']);
    expect('reinvocationPolicy' in validating.webhooks![0]!).toBe(false);
  });

  it('uses the documented default rules for a policy that names none', () => {
    const { validating } = build([policy('any', {}, ['validate'])]);
    // Namespaced only: no namespace exclusion reaches cluster-scoped objects (Nodes, RBAC, TokenReviews).
    expect(validating.webhooks![0]!.rules).toEqual([{ operations: ['CREATE', 'UPDATE', 'DELETE'], apiGroups: ['*'], apiVersions: ['*'], resources: ['*'], scope: 'Namespaced' }]);
    expect(DEFAULT_RULES[0]!.resources).toEqual(['*']); // main resources only: no */* status floods
  });

  it('reaches an in-cluster Service when no url is given', () => {
    const service = { ...webhooks, url: undefined, service: { name: 'portcullis', namespace: 'portcullis', port: 443 } } as WebhooksConfig;
    delete (service as { url?: string }).url;
    const { validating } = build([policy('p', {}, ['validate'])], { webhooks: service });
    expect(validating.webhooks![0]!.clientConfig).toEqual({ service: { name: 'portcullis', namespace: 'portcullis', port: 443, path: '/validate/p' }, caBundle: Buffer.from(CA).toString('base64') });
  });

  it('leaves caBundle out when serving without TLS', () => {
    const { validating } = build([policy('p', {}, ['validate'])], { caBundle: undefined });
    expect(validating.webhooks![0]!.clientConfig).toEqual({ url: 'https://127.0.0.1:8443/validate/p' });
  });

  it('pushes the labelSelector of a single match selector down as an objectSelector', () => {
    const one = build([policy('p', {
      objectSelector: { matchLabels: { tier: 'web' } },
      match: [{ kind: 'ConfigMap', labelSelector: { matchLabels: { audit: 'true' }, matchExpressions: [{ key: 'x', operator: 'Exists' }] } }],
    }, ['validate'])]);
    expect(one.validating.webhooks![0]!.objectSelector).toEqual({ matchLabels: { tier: 'web', audit: 'true' }, matchExpressions: [{ key: 'x', operator: 'Exists' }] });
    // Two alternatives: neither is necessary on its own, so nothing can be pushed down.
    const two = build([policy('p', { match: [{ labelSelector: { matchLabels: { a: '1' } } }, { labelSelector: { matchLabels: { b: '1' } } }] }, ['validate'])]);
    expect(two.validating.webhooks![0]!.objectSelector).toEqual({});
  });

  it('keeps the policy namespaceSelector and adds the exclusion to it', () => {
    const { validating } = build([policy('p', { namespaceSelector: { matchLabels: { env: 'prod' }, matchExpressions: [{ key: 'team', operator: 'In', values: ['a'] }] } }, ['validate'])]);
    expect(validating.webhooks![0]!.namespaceSelector).toEqual({
      matchLabels: { env: 'prod' },
      matchExpressions: [
        { key: 'team', operator: 'In', values: ['a'] },
        { key: 'kubernetes.io/metadata.name', operator: 'NotIn', values: ['kube-system', 'portcullis'] },
        { key: 'portcullis.dev/ignore', operator: 'NotIn', values: ['true'] },
      ],
    });
  });

  it('names the opt-out label of webhooks.ignoreLabel, and none when it is "" (anyone who may label a namespace could take it)', () => {
    const labels = (ignoreLabel: string) => build([policy('a', { rules: [configmaps] })], { webhooks: { ...webhooks, ignoreLabel } })
      .validating.webhooks![0]!.namespaceSelector!.matchExpressions!.map((e) => e.key);
    expect(labels('portcullis.dev/ignore')).toEqual(['kubernetes.io/metadata.name', 'portcullis.dev/ignore']);
    expect(labels('example.com/exempt')).toEqual(['kubernetes.io/metadata.name', 'example.com/exempt']);
    expect(labels('')).toEqual(['kubernetes.io/metadata.name']);
  });

  it('produces no webhooks, and so no configuration, for no policies', () => {
    const { validating, mutating } = build([]);
    expect([validating.webhooks, mutating.webhooks]).toEqual([[], []]);
  });
});

describe('single-webhook mode', () => {
  const single = { ...webhooks, singleWebhook: true };

  it('has one webhook per mode with the union of rules and no object selector', () => {
    const pods = { operations: ['CREATE'], apiGroups: [''], apiVersions: ['v1'], resources: ['pods'] };
    const { validating, mutating } = build([
      policy('a', { rules: [configmaps], objectSelector: { matchLabels: { a: '1' } }, failurePolicy: 'Ignore' }, ['validate']),
      policy('b', { rules: [configmaps, pods], failurePolicy: 'Ignore', reinvocationPolicy: 'IfNeeded' }),
    ], { webhooks: single });
    expect(validating.webhooks).toHaveLength(1);
    const hook = validating.webhooks![0]!;
    expect(hook.name).toBe('validate.portcullis.example.com');
    expect(hook.clientConfig.url).toBe('https://127.0.0.1:8443/validate');
    expect(hook.rules).toEqual([{ ...configmaps, scope: '*' }, { ...pods, scope: '*' }]);
    expect(hook.objectSelector).toEqual({});
    expect(hook.failurePolicy).toBe('Ignore');
    expect(mutating.webhooks!.map((w) => [w.name, w.clientConfig.url, w.reinvocationPolicy])).toEqual([['mutate.portcullis.example.com', 'https://127.0.0.1:8443/mutate', 'IfNeeded']]);
  });

  it('fails closed unless every policy fails open, and covers everything if any policy has no rules', () => {
    const { validating } = build([policy('a', { rules: [configmaps], failurePolicy: 'Ignore' }), policy('b')], { webhooks: single });
    expect(validating.webhooks![0]!.failurePolicy).toBe('Fail');
    expect(validating.webhooks![0]!.rules).toEqual([...DEFAULT_RULES]);
  });

  it('drops a mode no policy serves', () => {
    const { mutating } = build([policy('a', {}, ['validate'])], { webhooks: single });
    expect(mutating.webhooks).toEqual([]);
  });

  it('names the Ignore policies that a Fail webhook serves (warned at start), per mode', () => {
    const policies = [policy('strict', {}, ['validate']), policy('lenient', { failurePolicy: 'Ignore' }), policy('lax', { failurePolicy: 'Ignore' }, ['mutate'])];
    expect(ignoredButFailing(policies, single)).toEqual([{ mode: 'validate', policies: ['lenient'] }]);
    expect(ignoredButFailing(policies, webhooks)).toEqual([]);
    expect(ignoredButFailing([policy('x', { failurePolicy: 'Ignore' })], single)).toEqual([]);
  });
});

describe('names, namespaces and selectors', () => {
  it('refuses a managed name the apiserver would refuse as a webhook name', () => {
    expect(() => checkManagedName('portcullis')).toThrow(ConfigError);
    expect(() => checkManagedName('portcullis.dev')).not.toThrow();
    expect(() => checkManagedName(`${'a'.repeat(200)}.dev`, [policy('p'.repeat(60))])).toThrow(/longer than 253/);
  });

  it('finds the host namespace from config, then POD_NAMESPACE, then the Service, then default', () => {
    expect(hostNamespace({ ...webhooks, namespace: 'cfg' }, { POD_NAMESPACE: 'env' })).toBe('cfg');
    expect(hostNamespace(webhooks, { POD_NAMESPACE: 'env' })).toBe('env');
    expect(hostNamespace({ ...webhooks, service: { name: 's', namespace: 'svc', port: 443 } }, {})).toBe('svc');
    expect(hostNamespace(webhooks, {})).toBe('default');
    expect(excludedNamespaces(webhooks, { POD_NAMESPACE: 'portcullis' })).toEqual(['kube-node-lease', 'kube-system', 'portcullis']);
    // excludeNamespaces adds; it never takes the system namespaces out (red team: [monitoring] dropped kube-system).
    expect(excludedNamespaces({ ...webhooks, excludeNamespaces: ['monitoring'] }, { POD_NAMESPACE: 'portcullis' })).toEqual(['kube-node-lease', 'kube-system', 'monitoring', 'portcullis']);
  });

  it('ANDs selectors; conflicting required values match nothing', () => {
    expect(andSelectors(undefined, {})).toEqual({});
    expect(andSelectors({ matchLabels: { a: '1' } }, { matchLabels: { a: '2' } })).toEqual({ matchLabels: { a: '1' }, matchExpressions: [{ key: 'a', operator: 'In', values: ['2'] }] });
  });

  it('keeps only persistent policies for the exit', () => {
    expect(persistentOnly([policy('a'), policy('b', { persistent: true })]).map((p) => p.config.name)).toEqual(['b']);
  });
});
