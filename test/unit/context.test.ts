// Context reads without a sandbox: grants, the guest request's validation, sync states, the
// size cap, selectors, the store's changes, offline files and the configuration's grants.
import { describe, expect, it } from 'vitest';
import type { JsonObject } from '@portcullis/sdk';
import { parseConfig } from '../../host/src/config/load.ts';
import { kindsToCache } from '../../host/src/context/needs.ts';
import { ContextHub } from '../../host/src/context/hub.ts';
import { parseContextObjects, loadOffline } from '../../host/src/context/offline.ts';
import { answerRead, parseRequest, readLimit, type ReadScope } from '../../host/src/context/read.ts';
import type { Grant } from '../../host/src/context/grants.ts';
import { parseLabelSelector } from '../../host/src/context/selectors.ts';
import { ContextStore, toEntry } from '../../host/src/context/store.ts';
import { labelSelectorMatches } from '../../host/src/select/match.ts';

const NS = { apiVersion: 'v1', kind: 'Namespace' };
const ING = { apiVersion: 'networking.k8s.io/v1', kind: 'Ingress' };

function namespace(name: string, labels: Record<string, string> = {}): JsonObject {
  return { apiVersion: 'v1', kind: 'Namespace', metadata: { name, labels } };
}
function ingress(ns: string, name: string, labels: Record<string, string> = {}, host = `${name}.example.com`): JsonObject {
  return { apiVersion: 'networking.k8s.io/v1', kind: 'Ingress', metadata: { namespace: ns, name, labels }, spec: { rules: [{ host }] } };
}

function storeWith(objects: JsonObject[], synced = true): ContextStore {
  const hub = new ContextHub();
  loadOffline(hub, objects, [NS, ING]);
  if (!synced) for (const kind of ['v1 Namespace', 'networking.k8s.io/v1 Ingress']) hub.apply({ type: 'context', op: 'synced', kind, synced: false });
  return hub.store;
}

const scope = (grants = [NS, ING], maxBytes = 1 << 20): ReadScope => ({ policy: 'p', grants, maxBytes });
const read = (store: ContextStore, request: object, s = scope()) => JSON.parse(answerRead(store, s, JSON.stringify(request))) as {
  object?: JsonObject | null; items?: JsonObject[]; error?: { kind: string; code: string; message: string };
};
const names = (items: JsonObject[] | undefined) => (items ?? []).map((o) => (o.metadata as { name: string }).name);

describe('context grants', () => {
  const store = storeWith([namespace('shop', { owner: 'ann' }), ingress('shop', 'web')]);

  it('answers a granted get, and null for an object that does not exist', () => {
    expect(read(store, { verb: 'get', ...NS, name: 'shop' }).object).toMatchObject({ metadata: { name: 'shop', labels: { owner: 'ann' } } });
    expect(read(store, { verb: 'get', ...ING, namespace: 'shop', name: 'web' }).object).toMatchObject({ spec: { rules: [{ host: 'web.example.com' }] } });
    expect(read(store, { verb: 'get', ...NS, name: 'nope' })).toEqual({ object: null });
  });

  it('refuses a kind outside the grants permanently, naming the grant to add', () => {
    const answer = read(store, { verb: 'list', ...ING }, scope([NS]));
    expect(answer.error).toEqual({
      kind: 'permanent', code: 'CONTEXT_NOT_GRANTED',
      message: 'may not read Ingress (networking.k8s.io/v1): its grants are { apiVersion: v1, kind: Namespace }; ' +
        'add context: [{ apiVersion: networking.k8s.io/v1, kind: Ingress }] to policy "p" in the configuration',
    });
    expect(read(store, { verb: 'get', ...NS, name: 'shop' }, scope([])).error?.message).toContain('it has no context grants');
  });

  it('a request text seen before is still checked against each reader\'s own grants, and refusals name each policy', () => {
    const text = JSON.stringify({ verb: 'get', ...NS, name: 'shop' });
    const answer = (policy: string, grants: Grant[], request = text) =>
      JSON.parse(answerRead(store, { policy, grants, maxBytes: 1 << 20 }, request)) as { object?: JsonObject; error?: { code: string; message: string } };
    expect(answer('granted', [NS]).object).toMatchObject({ metadata: { name: 'shop' } });
    expect(answer('ungranted', []).error).toMatchObject({ code: 'CONTEXT_NOT_GRANTED', message: expect.stringContaining('policy "ungranted"') });
    expect(answer('granted', [NS]).object).toMatchObject({ metadata: { name: 'shop' } });
    for (const policy of ['first', 'second']) {
      expect(answer(policy, [NS], '{"verb":"get"}').error).toMatchObject({ code: 'CONTEXT_BAD_REQUEST', message: expect.stringContaining(`policy "${policy}"`) });
    }
  });

  it('matches grants exactly: another version of the same kind is another grant', () => {
    expect(read(store, { verb: 'list', apiVersion: 'networking.k8s.io/v1beta1', kind: 'Ingress' }).error?.code).toBe('CONTEXT_NOT_GRANTED');
    expect(read(store, { verb: 'list', apiVersion: 'v1', kind: 'namespace' }).error?.code).toBe('CONTEXT_NOT_GRANTED');
  });
});

describe('context sync states', () => {
  it('a read before the cache has synced is a temporary error', () => {
    const store = storeWith([namespace('shop')], false);
    expect(read(store, { verb: 'get', ...NS, name: 'shop' }).error).toMatchObject({ kind: 'temporary', code: 'CONTEXT_NOT_SYNCED' });
  });

  it('a granted kind the host does not cache at all is also temporary, not a crash', () => {
    const store = new ContextStore();
    expect(read(store, { verb: 'get', ...NS, name: 'shop' }).error).toMatchObject({ kind: 'temporary', code: 'CONTEXT_NOT_SYNCED' });
  });

  it('follows upserts, deletes and resync, and the hub reports what /readyz waits for', () => {
    const hub = new ContextHub();
    hub.apply({ type: 'context', op: 'reset', kind: 'v1 Namespace', entries: [], synced: false });
    expect(hub.waiting()).toEqual([]); // cached for selectors only: readiness does not wait
    hub.require([NS]);
    expect(hub.waiting()).toEqual(['v1 Namespace']);
    expect(hub.namespaceLabels('shop')).toBeUndefined();
    hub.apply({ type: 'context', op: 'upsert', kind: 'v1 Namespace', entry: toEntry(namespace('shop', { a: '1' }))! });
    hub.apply({ type: 'context', op: 'synced', kind: 'v1 Namespace', synced: true });
    expect(hub.waiting()).toEqual([]);
    expect(hub.namespaceLabels('shop')).toEqual({ a: '1' });
    hub.apply({ type: 'context', op: 'upsert', kind: 'v1 Namespace', entry: toEntry(namespace('shop', { a: '2' }))! });
    expect(hub.namespaceLabels('shop')).toEqual({ a: '2' });
    hub.apply({ type: 'context', op: 'delete', kind: 'v1 Namespace', namespace: '', name: 'shop' });
    expect(hub.namespaceLabels('shop')).toBeUndefined();
    const replica = new ContextStore();
    for (const change of hub.store.snapshot()) replica.apply(change);
    expect(replica.synced('v1', 'Namespace')).toBe(true);
  });
});

describe('context limits', () => {
  it('a list larger than the limit fails permanently with what to do, before building the answer', () => {
    const many = Array.from({ length: 10_000 }, (_, i) => ingress(`ns-${i % 50}`, `ing-${i}`));
    const store = storeWith(many);
    const answer = read(store, { verb: 'list', ...ING }, scope(undefined, 256 * 1024));
    expect(answer.error).toMatchObject({ kind: 'permanent', code: 'CONTEXT_TOO_LARGE' });
    expect(answer.error?.message).toMatch(/the list of Ingress \(networking\.k8s\.io\/v1\) exceeds the 262144-byte limit .*narrow it with namespace, labelSelector or fieldSelector/);
    // Narrowed to one namespace it fits.
    expect(names(read(store, { verb: 'list', ...ING, namespace: 'ns-7' }, scope(undefined, 256 * 1024)).items)).toHaveLength(200);
  });

  it('the per-read limit is 4 MiB, or a quarter of a smaller memory cap', () => {
    expect(readLimit(64 * 2 ** 20)).toBe(4 * 2 ** 20);
    expect(readLimit(8 * 2 ** 20)).toBe(2 * 2 ** 20);
  });
});

describe('context list selectors', () => {
  const store = storeWith([
    ingress('a', 'one', { team: 'web', tier: 'front' }), ingress('a', 'two', { team: 'db' }),
    ingress('b', 'three', { team: 'web' }), ingress('b', 'four'),
  ]);
  it.each([
    [{}, ['one', 'two', 'three', 'four']],
    [{ namespace: 'b' }, ['three', 'four']],
    [{ labelSelector: 'team=web' }, ['one', 'three']],
    [{ labelSelector: 'team!=web' }, ['two', 'four']],
    [{ labelSelector: 'team in (web,db),!tier' }, ['two', 'three']],
    [{ labelSelector: 'tier' }, ['one']],
    [{ labelSelector: 'team notin (web)' }, ['two', 'four']],
    [{ fieldSelector: 'metadata.name=two' }, ['two']],
    [{ fieldSelector: 'metadata.namespace!=a', labelSelector: 'team' }, ['three']],
    [{ fieldSelector: 'spec.rules=[{"host":"two.example.com"}]' }, ['two']],
    [{ fieldSelector: 'kind==Ingress,metadata.name!=one' }, ['two', 'three', 'four']],
  ])('list %j', (options, expected) => {
    expect(names(read(store, { verb: 'list', ...ING, ...options }).items).sort()).toEqual([...expected].sort());
  });

  it('parses label selector strings as the apiserver does', () => {
    const s = parseLabelSelector('app.kubernetes.io/name=web, env in (prod, staging) ,!legacy,tier==db');
    expect(labelSelectorMatches(s, { 'app.kubernetes.io/name': 'web', env: 'prod', tier: 'db' })).toBe(true);
    expect(labelSelectorMatches(s, { 'app.kubernetes.io/name': 'web', env: 'dev', tier: 'db' })).toBe(false);
    expect(labelSelectorMatches(s, { 'app.kubernetes.io/name': 'web', env: 'prod', tier: 'db', legacy: '' })).toBe(false);
  });
});

describe('context requests from guests are validated', () => {
  it.each([
    ['not json', 'the request is not JSON'],
    ['[1]', 'the request is not a JSON object'],
    ['{"verb":"get","apiVersion":"v1","kind":"Namespace"}', '"name" is required'],
    ['{"verb":"watch","apiVersion":"v1","kind":"Namespace"}', '"verb" must be "get" or "list", not "watch"'],
    ['{"verb":"list","apiVersion":"v1","kind":"Namespace","name":"x"}', 'list takes no name'],
    ['{"verb":"list","apiVersion":"v1","kind":"Namespace","extra":1}', 'unknown field "extra"'],
    ['{"verb":"list","apiVersion":"v1","kind":7}', '"kind" must be a string'],
    ['{"verb":"list","apiVersion":"v1","kind":"Namespace","labelSelector":"a in b"}', 'cannot read the label selector term "a in b"'],
    ['{"verb":"list","apiVersion":"v1","kind":"Namespace","fieldSelector":"spec"}', 'cannot read the field selector "spec"'],
    [JSON.stringify({ verb: 'get', apiVersion: 'v1', kind: 'Namespace', name: 'x'.repeat(20_000) }), 'at most 16384 bytes'],
  ])('refuses %s', (text, message) => {
    expect(() => parseRequest('p', text)).toThrow(message);
    const answer = JSON.parse(answerRead(new ContextStore(), scope(), text)) as { error: { kind: string; code: string; message: string } };
    expect(answer.error).toMatchObject({ kind: 'permanent', code: 'CONTEXT_BAD_REQUEST' });
    expect(answer.error.message).toContain('policy "p" made a context read the host cannot use');
  });
});

describe('offline context files', () => {
  it('reads a YAML list, a kind: List and several documents', () => {
    const text = '- {apiVersion: v1, kind: Namespace, metadata: {name: a}}\n---\n' +
      'apiVersion: v1\nkind: List\nitems:\n  - {apiVersion: v1, kind: Namespace, metadata: {name: b}}\n---\n' +
      'apiVersion: v1\nkind: Namespace\nmetadata: {name: c}\n';
    expect(parseContextObjects(text, 'ctx.yaml').map((o) => (o.metadata as { name: string }).name)).toEqual(['a', 'b', 'c']);
  });
  it.each([
    ['- 7', 'ctx.yaml: document 1, item 1 is not an object'],
    ['- {kind: Namespace, metadata: {name: a}}', 'ctx.yaml: document 1, item 1 has no apiVersion'],
    ['- {apiVersion: v1, kind: Namespace, metadata: {}}', 'ctx.yaml: document 1, item 1 (Namespace) has no metadata.name'],
    ['- [', /^ctx\.yaml: document 1 is not valid YAML/],
  ])('refuses %s', (text, message) => {
    expect(() => parseContextObjects(text, 'ctx.yaml')).toThrow(message);
  });
});

describe('context grants in the configuration', () => {
  it('reads grants and caches exactly the granted kinds (plus Namespaces for managed namespaceSelectors)', () => {
    const config = parseConfig(
      'policies:\n  - { name: a, module: a.wasm, context: [{ apiVersion: networking.k8s.io/v1, kind: Ingress }, { apiVersion: v1, kind: Namespace }] }\n' +
      '  - { name: b, module: b.wasm, context: [{ apiVersion: v1, kind: Namespace }] }\n  - { name: c, module: c.wasm }', 'c.yaml');
    expect(config.policies.map((p) => p.context)).toEqual([[ING, NS], [NS], []]);
    expect(kindsToCache(config)).toEqual([ING, NS]);
    const selectors = parseConfig('policies: [{ name: a, module: a.wasm, namespaceSelector: { matchLabels: { a: b } } }]\n' +
      'webhooks: { managed: x.example.com, url: "https://h:1" }', 'c.yaml');
    expect(kindsToCache(selectors)).toEqual([NS]);
    expect(kindsToCache(parseConfig('policies: [{ name: a, module: a.wasm }]', 'c.yaml'))).toEqual([]);
  });
  it.each([
    ['policies: [{ name: a, module: a.wasm, context: [{ apiVersion: v1 }] }]', 'c.yaml: /policies/0/context/0: missing required field "kind"'],
    ['policies: [{ name: a, module: a.wasm, context: [{ apiVersion: v1, kind: namespace }] }]', 'c.yaml: /policies/0/context/0/kind must match pattern'],
    ['policies: [{ name: a, module: a.wasm, context: [{ apiVersion: "apps/", kind: Deployment }] }]', 'c.yaml: /policies/0/context/0/apiVersion must match pattern'],
    ['policies: [{ name: a, module: a.wasm, context: [{ apiVersion: v1, kind: Pod }, { apiVersion: v1, kind: Pod }] }]', 'c.yaml: /policies/0/context/1: Pod (v1) is granted twice'],
  ])('refuses %s', (yaml, message) => {
    expect(() => parseConfig(yaml, 'c.yaml')).toThrow(message);
  });
});

describe('context RBAC', () => {
  it('grants list and watch on exactly the cached kinds, grouped by API group', async () => {
    const { contextRbacYaml, guessResource } = await import('../../host/src/context/rbac.ts');
    expect(['Ingress', 'Namespace', 'NetworkPolicy', 'Endpoints', 'ConfigMap', 'Gateway'].map(guessResource))
      .toEqual(['ingresses', 'namespaces', 'networkpolicies', 'endpoints', 'configmaps', 'gateways']);
    const yaml = contextRbacYaml([ING, NS, { apiVersion: 'networking.k8s.io/v1', kind: 'NetworkPolicy' }], { name: 'r', serviceAccount: 'sa', namespace: 'n' });
    expect(yaml).toContain('rules:\n  - apiGroups: [""]\n    resources: [namespaces]\n    verbs: [list, watch]\n' +
      '  - apiGroups: ["networking.k8s.io"]\n    resources: [ingresses, networkpolicies]\n    verbs: [list, watch]\n---');
    expect(yaml).toContain('subjects:\n  - kind: ServiceAccount\n    name: sa\n    namespace: n');
  });
});

describe('single-webhook namespaceSelector from the Namespace cache', () => {
  it('skips a policy for a namespace that does not match, and evaluates it while the cache is unsynced', async () => {
    const { policyMatches } = await import('../../host/src/select/match.ts');
    const { request } = await import('@portcullis/sdk/testing');
    const config = parseConfig('policies: [{ name: a, module: a.wasm, namespaceSelector: { matchLabels: { strict: "true" } } }]', 'c.yaml');
    const selectable = { config: config.policies[0]!, modes: ['validate' as const] };
    const hub = new ContextHub();
    hub.apply({ type: 'context', op: 'reset', kind: 'v1 Namespace', synced: false, entries: [toEntry(namespace('relaxed'))!, toEntry(namespace('strict', { strict: 'true' }))!] });
    const lookup = (ns: string) => hub.namespaceLabels(ns);
    const inNamespace = (ns: string) => request({ namespace: ns });
    expect(policyMatches(selectable, 'validate', inNamespace('relaxed'), lookup)).toBe(true); // unsynced: evaluate
    hub.apply({ type: 'context', op: 'synced', kind: 'v1 Namespace', synced: true });
    expect(policyMatches(selectable, 'validate', inNamespace('relaxed'), lookup)).toBe(false);
    expect(policyMatches(selectable, 'validate', inNamespace('strict'), lookup)).toBe(true);
    expect(policyMatches(selectable, 'validate', inNamespace('unknown'), lookup)).toBe(true); // newer than the cache: evaluate
  });
});

describe('the shipped context example files', () => {
  it('policies/context.yaml is valid, and deploy-overlays/context/rbac-context.yaml is what the generator prints for it', async () => {
    const { readFile } = await import('node:fs/promises');
    const { loadConfigFile } = await import('../../host/src/config/load.ts');
    const { contextRbacYaml } = await import('../../host/src/context/rbac.ts');
    const root = new URL('../../', import.meta.url).pathname;
    const config = await loadConfigFile(`${root}policies/context.yaml`);
    expect(config.policies.map((p) => p.name)).toEqual(['unique-ingress-host', 'namespace-owner']);
    const generated = contextRbacYaml(kindsToCache(config), { name: 'portcullis-context', serviceAccount: 'portcullis', namespace: 'portcullis' }, 'policies/context.yaml');
    expect(await readFile(`${root}deploy-overlays/context/rbac-context.yaml`, 'utf8')).toBe(generated);
  });
});
