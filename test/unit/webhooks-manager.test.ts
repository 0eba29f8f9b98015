// The webhook manager's sync loop against a fake admission API: a foreign same-named
// configuration is reported once and neither blocks the other kind nor delays a CA rotation.
import { ApiException, type AdmissionregistrationV1Api, type CoordinationV1Api, type VersionApi } from '@kubernetes/client-node';
import { describe, expect, it } from 'vitest';
import { createLogger } from '../../host/src/util/log.ts';
import { kubernetesVersion, WebhookManager } from '../../host/src/webhooks/manager.ts';
import type { WebhooksConfig } from '../../host/src/config/types.ts';
import { DEFAULT_LIMITS } from '../../host/src/config/limits.ts';
import type { ManagedPolicy } from '../../host/src/webhooks/build.ts';

const policies: ManagedPolicy[] = [{
  modes: ['validate', 'mutate'],
  config: {
    name: 'p', module: '/p.wasm', settings: {}, limits: DEFAULT_LIMITS, failurePolicy: 'Fail', enforcement: 'enforce', isolation: 'reuse',
    persistent: false, rules: [{ operations: ['CREATE'], apiGroups: [''], apiVersions: ['v1'], resources: ['pods'] }], match: [],
    sideEffects: 'None', reinvocationPolicy: 'Never',
  },
}];

type Stored = {
  metadata: { name: string; resourceVersion: string; labels?: Record<string, string>; annotations?: Record<string, string> };
  webhooks?: { clientConfig?: { caBundle?: string } }[];
};

/** Validating and mutating configurations in memory; `foreign` marks the validating one as someone else's. */
function fakeAdmission() {
  const store: Record<'validating' | 'mutating', Stored | undefined> = { validating: undefined, mutating: undefined };
  let version = 1;
  const notFound = () => new ApiException(404, 'not found', {}, {});
  const read = (kind: 'validating' | 'mutating') => async () => {
    if (!store[kind]) throw notFound();
    return structuredClone(store[kind]);
  };
  const create = (kind: 'validating' | 'mutating') => async ({ body }: { body: Stored }) => {
    store[kind] = { ...structuredClone(body), metadata: { ...body.metadata, resourceVersion: String(++version) } };
    return structuredClone(store[kind]);
  };
  const patch = (kind: 'validating' | 'mutating') => async ({ body }: { body: Stored }) => {
    store[kind] = { ...store[kind]!, ...structuredClone(body), metadata: { ...store[kind]!.metadata, ...body.metadata, resourceVersion: String(++version) } };
    return structuredClone(store[kind]);
  };
  const api = {
    readValidatingWebhookConfiguration: read('validating'), readMutatingWebhookConfiguration: read('mutating'),
    createValidatingWebhookConfiguration: create('validating'), createMutatingWebhookConfiguration: create('mutating'),
    patchValidatingWebhookConfiguration: patch('validating'), patchMutatingWebhookConfiguration: patch('mutating'),
    deleteValidatingWebhookConfiguration: async () => { store.validating = undefined; return {}; },
    deleteMutatingWebhookConfiguration: async () => { store.mutating = undefined; return {}; },
  };
  return { store, api: api as unknown as AdmissionregistrationV1Api };
}

const webhooks: WebhooksConfig = {
  managed: 'portcullis.dev', singleWebhook: true, timeoutSeconds: 10, url: 'https://127.0.0.1:8443', excludeNamespaces: ['kube-system'], ignoreLabel: 'portcullis.dev/ignore',
  leaderElection: false, leaseDurationSeconds: 15, resyncSeconds: 60,
};

describe('kubernetesVersion', () => {
  it('reads major.minor from the fields, else from gitVersion; an unversioned build says nothing', () => {
    expect(kubernetesVersion({ major: '1', minor: '27+', gitVersion: 'v1.27.3-eks' })).toEqual({ major: 1, minor: 27 });
    expect(kubernetesVersion({ major: '', minor: '', gitVersion: 'v1.20.2' })).toEqual({ major: 1, minor: 20 });
    // What the end-to-end tests' apiserver, built from Debian's source package, reports.
    expect(kubernetesVersion({ major: '', minor: '', gitVersion: 'v0.0.0-master+faecb196815e2' })).toBeUndefined();
    expect(kubernetesVersion({})).toBeUndefined();
  });
});

describe('WebhookManager', () => {
  it('reports a foreign same-named configuration once, keeps the other kind in sync, and publishes a new CA at once', async () => {
    const { store, api } = fakeAdmission();
    store.validating = { metadata: { name: 'portcullis.dev', resourceVersion: '1', labels: { owner: 'someone-else' } }, webhooks: [] };
    const lines: string[] = [];
    const manager = new WebhookManager({
      clients: { admission: api, coordination: {} as CoordinationV1Api, version: { getCode: async () => ({ major: '1', minor: '20' }) } as unknown as VersionApi, server: 'https://fake' },
      log: createLogger('info', (line) => lines.push(line)), webhooks: () => webhooks, policies: () => policies, caBundle: 'OLD-CA', caPublishTimeoutMs: 30_000,
    });
    manager.start();
    await manager.syncNow();
    await manager.syncNow();
    expect(lines.some((l) => l.includes('Kubernetes before 1.21 does not label namespaces'))).toBe(true);
    expect(lines.some((l) => l.includes('webhooks.namespace is not set, so this host takes \\"default\\" as its own namespace'))).toBe(true);
    expect(store.mutating?.webhooks?.[0]?.clientConfig?.caBundle).toBeDefined();
    // Not retried, but failing (portcullis_webhook_sync_failing): requests it covers are someone else's to answer.
    expect(manager.syncFailing).toBe(true);
    const started = performance.now();
    expect(await manager.publishCa('NEW-CA')).toBe(true);
    // Not the 30 s publication timeout: the foreign configuration is no reason to wait.
    expect(performance.now() - started).toBeLessThan(5_000);
    expect(Buffer.from(store.mutating!.webhooks![0]!.clientConfig!.caBundle!, 'base64').toString()).toContain('NEW-CA');
    expect(store.validating?.metadata.labels).toEqual({ owner: 'someone-else' });
    const reports = lines.filter((l) => l.includes('belongs to someone else'));
    expect(reports).toHaveLength(1);
    expect(reports[0]).toContain('ValidatingWebhookConfiguration');
    await manager.stop();
  });

  it('leaves alone a configuration another installation (another Lease) manages, and adopts one written before installations were recorded', async () => {
    // Red team: two installations with one managed name, in two namespaces, rewrote it in turn.
    const { store, api } = fakeAdmission();
    const managed = { 'app.kubernetes.io/managed-by': 'portcullis' };
    store.validating = { metadata: { name: 'portcullis.dev', resourceVersion: '1', labels: managed, annotations: { 'portcullis.dev/installation': 'staging/portcullis.dev' } }, webhooks: [] };
    store.mutating = { metadata: { name: 'portcullis.dev', resourceVersion: '1', labels: managed }, webhooks: [] };
    const lines: string[] = [];
    const manager = new WebhookManager({
      clients: { admission: api, coordination: {} as CoordinationV1Api, version: { getCode: async () => ({ major: '1', minor: '21' }) } as unknown as VersionApi, server: 'https://fake' },
      log: createLogger('info', (line) => lines.push(line)), webhooks: () => ({ ...webhooks, namespace: 'portcullis' }), policies: () => policies, caBundle: 'CA',
    });
    manager.start();
    await manager.syncNow();
    expect(store.validating?.metadata.annotations).toEqual({ 'portcullis.dev/installation': 'staging/portcullis.dev' });
    expect(store.validating?.webhooks).toEqual([]);
    expect(lines.filter((l) => l.includes('is managed by another Portcullis installation (Lease staging/portcullis.dev; this one\'s is portcullis/portcullis.dev)'))).toHaveLength(1);
    expect(store.mutating?.metadata.annotations).toEqual({ 'portcullis.dev/installation': 'portcullis/portcullis.dev' });
    expect(store.mutating?.webhooks).toHaveLength(1);
    await manager.stop();
  });

  it('registers nothing until the host is ready, says why, and registers once it is', async () => {
    // Red team: a leader whose context caches could not sync (RBAC missing) registered its Fail
    // webhooks anyway, and every request they covered was denied until a person acted.
    const { store, api } = fakeAdmission();
    const lines: string[] = [];
    let readiness: { ready: boolean; why?: string } = { ready: false, why: 'the context caches of v1/Namespace have not synced' };
    const manager = new WebhookManager({
      clients: { admission: api, coordination: {} as CoordinationV1Api, version: { getCode: async () => ({ major: '1', minor: '21' }) } as unknown as VersionApi, server: 'https://fake' },
      log: createLogger('info', (line) => lines.push(line)), webhooks: () => webhooks, policies: () => policies, caBundle: 'CA',
      ready: () => readiness,
    });
    manager.start();
    await new Promise((r) => setTimeout(r, 300));
    expect(store.validating).toBeUndefined();
    expect(store.mutating).toBeUndefined();
    expect(lines.filter((l) => l.includes('not registering webhooks until this host is ready') && l.includes('v1/Namespace have not synced'))).toHaveLength(1);
    // Visible outside the log too (portcullis_webhook_sync_failing).
    expect(manager.syncFailing).toBe(true);
    readiness = { ready: true };
    // The manager looks at readiness every second: registered at its next look.
    await expect.poll(() => store.mutating?.webhooks?.length, { timeout: 10_000, interval: 50 }).toBe(1);
    expect(lines.some((l) => l.includes('ready; registering webhooks'))).toBe(true);
    expect(manager.syncFailing).toBe(false);
    await manager.stop();
  });

  it('a CA rotation while the host is not ready publishes the CA in what is registered, and registers nothing new', async () => {
    // Re-test of the red team's F3: publishCa took a path around the readiness check and
    // registered an unready host's new Fail webhook.
    const { store, api } = fakeAdmission();
    let readiness = { ready: true };
    let current: ManagedPolicy[] = [...policies];
    const manager = new WebhookManager({
      clients: { admission: api, coordination: {} as CoordinationV1Api, version: { getCode: async () => ({ major: '1', minor: '21' }) } as unknown as VersionApi, server: 'https://fake' },
      log: createLogger('error', () => {}), webhooks: () => webhooks, policies: () => current, caBundle: 'CA-1', caPublishTimeoutMs: 2000,
      ready: () => readiness,
    });
    manager.start();
    await new Promise((r) => setTimeout(r, 200));
    const rules = () => JSON.stringify(store.mutating?.webhooks?.map((w) => (w as { rules?: unknown }).rules));
    const registered = rules();
    readiness = { ready: false };
    const secrets = { operations: ['CREATE' as const], apiGroups: [''], apiVersions: ['v1'], resources: ['secrets'] };
    current = [...policies, { ...policies[0]!, config: { ...policies[0]!.config, name: 'context-policy', rules: [secrets] } }];
    expect(await manager.publishCa('CA-2')).toBe(true);
    expect(rules()).toBe(registered);
    expect(rules()).not.toContain('secrets');
    expect(Buffer.from(store.mutating!.webhooks![0]!.clientConfig!.caBundle!, 'base64').toString()).toContain('CA-2');
    await manager.stop();
    // Never ready: a rotation creates nothing.
    const fresh = fakeAdmission();
    const unready = new WebhookManager({
      clients: { admission: fresh.api, coordination: {} as CoordinationV1Api, version: { getCode: async () => ({ major: '1', minor: '21' }) } as unknown as VersionApi, server: 'https://fake' },
      log: createLogger('error', () => {}), webhooks: () => webhooks, policies: () => policies, caBundle: 'CA-1', ready: () => ({ ready: false }),
    });
    unready.start();
    expect(await unready.publishCa('CA-2')).toBe(true);
    expect(fresh.store.mutating).toBeUndefined();
    expect(fresh.store.validating).toBeUndefined();
    await unready.stop();
  });

  it('re-reads and writes again when a write conflicts (409), and removes non-persistent webhooks on stop', async () => {
    const { store, api } = fakeAdmission();
    const conflicts = { left: 2 };
    const patch = api.patchMutatingWebhookConfiguration.bind(api);
    Object.assign(api, {
      patchMutatingWebhookConfiguration: (args: Parameters<typeof patch>[0]) => {
        if (conflicts.left-- > 0) return Promise.reject(new ApiException(409, 'conflict', {}, {}));
        return patch(args);
      },
    });
    const lines: string[] = [];
    const manager = new WebhookManager({
      clients: { admission: api, coordination: {} as CoordinationV1Api, version: { getCode: async () => ({ major: '1', minor: '21' }) } as unknown as VersionApi, server: 'https://fake' },
      log: createLogger('info', (line) => lines.push(line)), webhooks: () => webhooks, policies: () => policies, caBundle: 'CA',
    });
    manager.start();
    await manager.syncNow();
    expect(store.mutating?.webhooks).toHaveLength(1);
    // A change that needs a patch: the first two attempts conflict, the third lands.
    expect(await manager.publishCa('CA-2')).toBe(true);
    expect(conflicts.left).toBeLessThan(0);
    expect(Buffer.from(store.mutating!.webhooks![0]!.clientConfig!.caBundle!, 'base64').toString()).toContain('CA-2');
    // The only policy is not persistent: on stop both configurations are left empty and deleted.
    await manager.stop();
    expect(store.validating).toBeUndefined();
    expect(store.mutating).toBeUndefined();
    expect(lines.some((l) => l.includes('removed the webhooks of non-persistent policies'))).toBe(true);
    expect(lines.some((l) => l.includes('does not label namespaces'))).toBe(false);
  });

  it('on stop, a replica that does not lead removes the webhooks only while the Lease still names it: never for another holder, even one its own clock finds expired', async () => {
    const cases = [
      { holder: 'me', removed: true, said: 'as the last one out' },
      // Renewed an hour ago by this machine's clock: a clock skew, or a leader that just crashed
      // while its replicas still serve (red team). Not this replica's to judge.
      { holder: 'other', removed: false, said: 'left to the replicas still running' },
      { holder: '', removed: false, said: 'left to the replicas still running' },
    ];
    for (const { holder, removed, said } of cases) {
      const { store, api } = fakeAdmission();
      const managed = { 'app.kubernetes.io/managed-by': 'portcullis' };
      store.validating = { metadata: { name: 'portcullis.dev', resourceVersion: '1', labels: managed }, webhooks: [{}] };
      const lease = { metadata: { resourceVersion: '7' }, spec: { holderIdentity: holder, leaseDurationSeconds: 15, renewTime: new Date(Date.now() - 3_600_000).toISOString() } };
      const coordination = { readNamespacedLease: async () => structuredClone(lease) } as unknown as CoordinationV1Api;
      const lines: string[] = [];
      const manager = new WebhookManager({
        clients: { admission: api, coordination, version: { getCode: async () => ({ major: '1', minor: '21' }) } as unknown as VersionApi, server: 'https://fake' },
        log: createLogger('info', (line) => lines.push(line)), webhooks: () => ({ ...webhooks, leaderElection: true }), policies: () => policies, identity: 'me',
      });
      await manager.stop({ timeoutMs: 2_000 });
      expect({ holder, removed: store.validating === undefined }).toEqual({ holder, removed });
      expect(lines.some((l) => l.includes(said))).toBe(true);
    }
  });

  it('on stop, a leader whose renew deadline passes while the apiserver is away still removes the webhooks once it is back, the Lease being still its own', async () => {
    // Red team: renewals stop at the exit, so 5-10 s into it the host was no leader by its own
    // clock; with the apiserver away for 8.5 s the configurations were left behind, blamed on a
    // new leader there was not.
    const { store, api } = fakeAdmission();
    let down = false;
    const unreachable = () => new TypeError('fetch failed', { cause: Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:6443'), { code: 'ECONNREFUSED' }) });
    let lease: Record<string, unknown> | undefined;
    let version = 0;
    const keep = (body: Record<string, unknown>) =>
      (lease = { ...structuredClone(body), metadata: { ...(body.metadata as object), resourceVersion: String(++version) } });
    const coordination = {
      readNamespacedLease: async () => {
        if (down) throw unreachable();
        if (!lease) throw new ApiException(404, 'not found', {}, {});
        return structuredClone(lease);
      },
      createNamespacedLease: async ({ body }: { body: Record<string, unknown> }) => keep(body),
      replaceNamespacedLease: async ({ body }: { body: Record<string, unknown> }) => keep(body),
    } as unknown as CoordinationV1Api;
    for (const name of ['deleteValidatingWebhookConfiguration', 'deleteMutatingWebhookConfiguration'] as const) {
      const original = (api[name] as (args: unknown) => Promise<unknown>).bind(api);
      Object.assign(api, { [name]: (args: unknown) => (down ? Promise.reject(unreachable()) : original(args)) });
    }
    const lines: string[] = [];
    const manager = new WebhookManager({
      clients: { admission: api, coordination, version: { getCode: async () => ({ major: '1', minor: '21' }) } as unknown as VersionApi, server: 'https://fake' },
      log: createLogger('info', (line) => lines.push(line)), policies: () => policies, identity: 'me',
      webhooks: () => ({ ...webhooks, leaderElection: true, leaseDurationSeconds: 1 }),
    });
    manager.start();
    for (let i = 0; i < 100 && !(manager.isLeader && store.validating); i++) await new Promise((r) => setTimeout(r, 20));
    expect(store.validating).toBeDefined();
    down = true;
    // Back after the 0.67 s renew deadline, well within the exit's grace period.
    setTimeout(() => { down = false; }, 1_500);
    await manager.stop({ timeoutMs: 5_000 });
    expect({ validating: store.validating, mutating: store.mutating }).toEqual({ validating: undefined, mutating: undefined });
    expect(lines.filter((l) => l.includes('could not remove the webhooks on exit'))).toEqual([]);
  });

  it('on stop with the apiserver never reached, says this host registered nothing (newcomer: told to remove webhooks never created)', async () => {
    const { api } = fakeAdmission();
    const refused = () => Promise.reject(new TypeError('fetch failed', { cause: Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:6443'), { code: 'ECONNREFUSED' }) }));
    const coordination = { readNamespacedLease: refused, createNamespacedLease: refused, replaceNamespacedLease: refused } as unknown as CoordinationV1Api;
    const lines: string[] = [];
    const manager = new WebhookManager({
      clients: { admission: api, coordination, version: { getCode: refused } as unknown as VersionApi, server: 'https://fake' },
      log: createLogger('info', (line) => lines.push(line)), policies: () => policies, identity: 'me',
      webhooks: () => ({ ...webhooks, leaderElection: true, leaseDurationSeconds: 1 }),
    });
    manager.start();
    await new Promise((r) => setTimeout(r, 100));
    await manager.stop({ timeoutMs: 1_000 });
    const exit = lines.filter((l) => l.includes('"level":"error"') && l.includes('on exit'));
    expect(exit).toHaveLength(1);
    expect(exit[0]).toContain('this host registered none');
    expect(lines.some((l) => l.includes('left the webhooks in place'))).toBe(false);
  });

  it('on stop, retries a transient failure within the grace period, and gives up on a permanent one with one line', async () => {
    for (const [status, removed] of [[503, true], [403, false]] as const) {
      const { store, api } = fakeAdmission();
      let failures = 1;
      const del = api.deleteMutatingWebhookConfiguration.bind(api);
      Object.assign(api, {
        deleteMutatingWebhookConfiguration: (args: Parameters<typeof del>[0]) => {
          if (failures-- > 0 || status === 403) return Promise.reject(new ApiException(status, 'nope', {}, {}));
          return del(args);
        },
      });
      const lines: string[] = [];
      const manager = new WebhookManager({
        clients: { admission: api, coordination: {} as CoordinationV1Api, version: { getCode: async () => ({ major: '1', minor: '21' }) } as unknown as VersionApi, server: 'https://fake' },
        log: createLogger('info', (line) => lines.push(line)), webhooks: () => webhooks, policies: () => policies,
      });
      manager.start();
      await manager.syncNow();
      await manager.stop({ timeoutMs: 5_000 });
      expect({ status, removed: store.mutating === undefined }).toEqual({ status, removed });
      expect(lines.filter((l) => l.includes('could not remove the webhooks on exit'))).toHaveLength(removed ? 0 : 1);
    }
  });
});

describe('WebhookManager on exit, when the apiserver refuses what the host would leave (422)', () => {
  it('takes the non-persistent webhooks out of what is registered and keeps the persistent ones as the apiserver last accepted them', async () => {
    const { store, api } = fakeAdmission();
    const keep: ManagedPolicy = { ...policies[0]!, config: { ...policies[0]!.config, name: 'keep', persistent: true } };
    const go: ManagedPolicy = { ...policies[0]!, config: { ...policies[0]!.config, name: 'go' } };
    let caBundle = 'CA';
    const patch = api.patchValidatingWebhookConfiguration.bind(api);
    // The apiserver refuses the persistent webhook as the host would write it at exit (here: with a new CA).
    Object.assign(api, {
      patchValidatingWebhookConfiguration: (args: { body: Stored }) => {
        if ((args.body.webhooks ?? []).some((w) => Buffer.from(w.clientConfig?.caBundle ?? '', 'base64').toString().includes('REFUSED'))) {
          return Promise.reject(new ApiException(422, 'ValidatingWebhookConfiguration.admissionregistration.k8s.io "portcullis.dev" is invalid', {}, {}));
        }
        return patch(args as Parameters<typeof patch>[0]);
      },
    });
    const lines: string[] = [];
    const manager = new WebhookManager({
      clients: { admission: api, coordination: {} as CoordinationV1Api, version: { getCode: async () => ({ major: '1', minor: '21' }) } as unknown as VersionApi, server: 'https://fake' },
      log: createLogger('info', (line) => lines.push(line)), webhooks: () => ({ ...webhooks, singleWebhook: false }), policies: () => [keep, go], caBundle, caPublishTimeoutMs: 500,
    });
    manager.start();
    await manager.syncNow();
    const names = () => (store.validating?.webhooks as { name: string }[] | undefined)?.map((w) => w.name);
    expect(names()).toEqual(['keep.portcullis.dev', 'go.portcullis.dev']);
    const registered = structuredClone(store.validating!.webhooks![0]);
    caBundle = 'REFUSED';
    await manager.publishCa(caBundle).catch(() => undefined); // refused while running: retried by the sync, not our concern here
    await manager.stop({ timeoutMs: 5_000 });
    expect(names()).toEqual(['keep.portcullis.dev']);
    expect(store.validating!.webhooks![0]).toEqual(registered);
    expect(lines.filter((l) => l.includes('refused them as this host would leave them'))).toHaveLength(1);
    expect(lines.some((l) => l.includes('could not remove the webhooks on exit'))).toBe(false);
  });
});
