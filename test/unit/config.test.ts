import { describe, expect, it } from 'vitest';
import { parseConfig } from '../../host/src/config/load.ts';
import { policyMatches, ruleMatches, resourceSelectorMatches, fieldSelectorMatches, labelSelectorMatches } from '../../host/src/select/match.ts';
import type { PolicyConfig } from '../../host/src/config/types.ts';
import { request } from '@portcullis/sdk/testing';

describe('configuration', () => {
  it('fills in defaults and resolves module paths against the file', () => {
    const config = parseConfig('policies:\n  - { name: a, module: mods/a.wasm }\n  - { name: b, module: "oci://reg.example/b:1" }', '/etc/portcullis/config.yaml');
    expect(config.policies[0]).toMatchObject({ module: '/etc/portcullis/mods/a.wasm', failurePolicy: 'Fail', enforcement: 'enforce', isolation: 'reuse', limits: { timeoutMs: 2000, memoryMiB: 64 } });
    expect(config.policies[1]!.module).toBe('oci://reg.example/b:1');
    expect(config.server).toMatchObject({ host: '0.0.0.0', port: 8443, maxBodyBytes: 8 * 2 ** 20, tls: { mode: 'self-signed' } });
  });

  it.each([
    ['policies: [{ name: a, module: a.wasm, limits: { timeoutMs: "slow" } }]', 'c.yaml: /policies/0/limits/timeoutMs must be integer'],
    ['policies: [{ name: a, module: a.wasm, failurePolicy: Sometimes }]', 'c.yaml: /policies/0/failurePolicy must be one of "Fail", "Ignore"'],
    ['policies: [{ name: a, module: a.wasm, colour: red }]', 'c.yaml: /policies/0: unknown field "colour"'],
    ['policies: [{ name: a }]', 'c.yaml: /policies/0: missing required field "module"'],
    ['server: { port: 1 }', 'c.yaml: /: missing required field "policies"'],
    ['policies: [{ name: a, module: a.wasm }, { name: a, module: b.wasm }]', 'c.yaml: /policies/1/name: "a" is used twice; policy names must be unique'],
    ['policies: [{ name: a, module: a.wasm, limits: { timeoutMs: 12000 } }]', 'c.yaml: /policies/0/limits/timeoutMs (12000) must be below the webhook timeout (10s)'],
    ['policies: [', /^c\.yaml: not valid YAML/],
    // The line the parser points at, not a message ending in "column 4:" (newcomer).
    ['policies:\n  - name: a\n    module: a.wasm\n   - name: b\n', 'c.yaml: not valid YAML: All sequence items must start at the same column at line 4, column 4 (near "- name: b")'],
    // Rules the apiserver refuses: caught at load, not by a webhook sync that fails after a reload (red team).
    ['policies: [{ name: a, module: a.wasm, rules: [{ operations: [CREATE], apiGroups: ["*", apps], apiVersions: [v1], resources: [pods] }] }]',
      'c.yaml: /policies/0/rules/0/apiGroups: "*" stands alone (the apiserver refuses it beside other values: ["*","apps"])'],
    ['policies: [{ name: a, module: a.wasm, rules: [{ operations: ["*", DELETE], apiGroups: [""], apiVersions: [v1], resources: [pods] }] }]', /rules\/0\/operations: "\*" stands alone/],
    ['policies: [{ name: a, module: a.wasm, rules: [{ operations: [CREATE], apiGroups: [""], apiVersions: [v1], resources: ["*", pods] }] }]', /rules\/0\/resources: "\*" covers every resource/],
    ['policies: [{ name: a, module: a.wasm, rules: [{ operations: [CREATE], apiGroups: [""], apiVersions: [v1], resources: ["*/*", pods/status] }] }]', /rules\/0\/resources: "\*\/\*" stands alone/],
  ])('refuses %s', (yaml, message) => {
    expect(() => parseConfig(yaml, 'c.yaml')).toThrow(message);
  });
});

describe('selection', () => {
  const pods = request({ resource: { group: '', version: 'v1', resource: 'pods' } });
  it('matches webhook rules like the apiserver', () => {
    const rule = (resources: string[], extra = {}) => ({ operations: ['CREATE'], apiGroups: [''], apiVersions: ['v1'], resources, ...extra });
    expect(ruleMatches(rule(['pods']), pods)).toBe(true);
    expect(ruleMatches(rule(['*']), pods)).toBe(true);
    expect(ruleMatches(rule(['pods/status']), pods)).toBe(false);
    expect(ruleMatches(rule(['pods/*']), { ...pods, subResource: 'status' })).toBe(true);
    expect(ruleMatches(rule(['pods']), { ...pods, subResource: 'status' })).toBe(false);
    expect(ruleMatches(rule(['pods'], { scope: 'Cluster' }), pods)).toBe(false);
    expect(ruleMatches(rule(['pods'], { operations: ['DELETE'] }), pods)).toBe(false);
  });

  it('takes a Namespace for cluster-scoped, though its UPDATE and DELETE name it as their namespace (as the apiserver)', () => {
    const rule = (scope: 'Cluster' | 'Namespaced') => ({ operations: ['*'], apiGroups: [''], apiVersions: ['v1'], resources: ['*'], scope });
    const namespaces = { group: '', version: 'v1', resource: 'namespaces' };
    for (const operation of ['UPDATE', 'DELETE'] as const) {
      const r = request({ operation, resource: namespaces, kind: { group: '', version: 'v1', kind: 'Namespace' }, name: 'team-a', namespace: 'team-a' });
      expect(ruleMatches(rule('Cluster'), r)).toBe(true);
      expect(ruleMatches(rule('Namespaced'), r)).toBe(false);
    }
    const created = request({ operation: 'CREATE', resource: namespaces, namespace: '' });
    expect(ruleMatches(rule('Cluster'), created)).toBe(true);
    expect(ruleMatches(rule('Namespaced'), created)).toBe(false);
    // Anything else in a namespace is namespaced, a namespaces resource of another group too.
    expect(ruleMatches(rule('Namespaced'), request({ namespace: 'team-a' }))).toBe(true);
    expect(ruleMatches(rule('Cluster'), request({ namespace: 'team-a', resource: { group: 'example.com', version: 'v1', resource: 'namespaces' } }))).toBe(false);
  });

  it('matches an object selector against the object or the old object, never a missing one or one without metadata', () => {
    const selecting = (objectSelector: PolicyConfig['objectSelector']) =>
      ({ config: { rules: [], match: [], objectSelector } as unknown as PolicyConfig, modes: ['validate' as const] });
    const unmanaged = selecting({ matchExpressions: [{ key: 'managed', operator: 'DoesNotExist' }] });
    const matches = (policy: ReturnType<typeof selecting>, overrides: Parameters<typeof request>[0]) => policyMatches(policy, 'validate', request(overrides));
    // DELETE: no object, so the old object's labels decide
    expect(matches(unmanaged, { operation: 'DELETE', object: null, oldObject: { metadata: { labels: { managed: 'true' } } } })).toBe(false);
    expect(matches(unmanaged, { operation: 'DELETE', object: null, oldObject: { metadata: { name: 'x' } } })).toBe(true);
    // CONNECT: PodExecOptions has no metadata
    expect(matches(unmanaged, { operation: 'CONNECT', object: { kind: 'PodExecOptions', command: ['sh'] }, oldObject: null })).toBe(false);
    // UPDATE: either object may match
    expect(matches(unmanaged, { operation: 'UPDATE', object: { metadata: { labels: { managed: 'x' } } }, oldObject: { metadata: {} } })).toBe(true);
    // An empty selector selects everything, objects or not.
    expect(matches(selecting({}), { operation: 'CONNECT', object: null, oldObject: null })).toBe(true);
    expect(matches(selecting({ matchLabels: {}, matchExpressions: [] }), { operation: 'DELETE', object: null, oldObject: null })).toBe(true);
  });

  it('evaluates label, resource and field selectors', () => {
    expect(labelSelectorMatches({ matchExpressions: [{ key: 'a', operator: 'In', values: ['1', '2'] }, { key: 'b', operator: 'DoesNotExist' }] }, { a: '2' })).toBe(true);
    expect(labelSelectorMatches({ matchExpressions: [{ key: 'a', operator: 'NotIn', values: ['2'] }] }, { a: '2' })).toBe(false);
    const r = request({ name: 'web-1', namespace: 'shop', object: { metadata: { name: 'web-1', labels: { app: 'web' } }, spec: { replicas: 3 } } });
    expect(resourceSelectorMatches({ apiVersion: 'v1', kind: 'Pod', namespace: 'sh*', name: 'web-*', labelSelector: { matchLabels: { app: 'web' } } }, r)).toBe(true);
    expect(resourceSelectorMatches({ name: 'db-*' }, r)).toBe(false);
    expect(fieldSelectorMatches('metadata.name=web-1,spec.replicas!=0', r.object!)).toBe(true);
    expect(fieldSelectorMatches('spec.replicas==4', r.object!)).toBe(false);
  });
});
