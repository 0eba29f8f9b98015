// Leader election rules against an in-memory Lease with the apiserver's optimistic
// concurrency (404 on a missing lease, 409 on a stale resourceVersion) and a fake clock.
import { ApiException, type CoordinationV1Api, type V1Lease } from '@kubernetes/client-node';
import { describe, expect, it } from 'vitest';
import { createLogger } from '../../host/src/util/log.ts';
import { describeKubeError, KubeApiError } from '../../host/src/webhooks/kube.ts';
import { LeaderElector, NotLeaderError, microTimeMs } from '../../host/src/webhooks/lease.ts';

class FakeLeases {
  lease: V1Lease | undefined;
  version = 0;
  writes = 0;
  down = false;

  api(): CoordinationV1Api {
    const fail = (code: number) => new ApiException(code, 'x', JSON.stringify({ message: `status ${code}` }), {});
    const check = () => {
      if (this.down) throw new TypeError('fetch failed', { cause: Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:6443'), { code: 'ECONNREFUSED' }) });
    };
    const store = (body: V1Lease): V1Lease => {
      this.writes++;
      // As the apiserver: what comes back is JSON, MicroTimes as strings.
      this.lease = JSON.parse(JSON.stringify({ ...body, metadata: { ...body.metadata, resourceVersion: String(++this.version) } })) as V1Lease;
      return this.lease;
    };
    return {
      readNamespacedLease: async () => {
        check();
        if (!this.lease) throw fail(404);
        return structuredClone(this.lease);
      },
      createNamespacedLease: async ({ body }: { body: V1Lease }) => {
        check();
        if (this.lease) throw fail(409);
        return store(body);
      },
      replaceNamespacedLease: async ({ body }: { body: V1Lease }) => {
        check();
        if (body.metadata?.resourceVersion !== this.lease?.metadata?.resourceVersion) throw fail(409);
        return store(body);
      },
    } as unknown as CoordinationV1Api;
  }
}

function elector(leases: FakeLeases, identity: string, clock: { now: number }, events: string[] = [], eligible?: () => boolean) {
  return new LeaderElector({
    api: leases.api(), server: 'https://apiserver', name: 'portcullis.dev', namespace: 'portcullis', identity, leaseDurationSeconds: 15,
    log: createLogger('error', () => {}), now: () => clock.now, monotonic: () => clock.now,
    onStartedLeading: () => events.push(`${identity} started`), onStoppedLeading: () => events.push(`${identity} stopped`),
    ...(eligible ? { eligible } : {}),
  });
}

describe('LeaderElector', () => {
  it('creates the lease, renews it, and keeps acquireTime and transitions', async () => {
    const leases = new FakeLeases();
    const clock = { now: 1_000_000 };
    const events: string[] = [];
    const a = elector(leases, 'a', clock, events);
    await a.round();
    expect(a.isLeader).toBe(true);
    expect(leases.lease!.spec).toMatchObject({ holderIdentity: 'a', leaseDurationSeconds: 15, leaseTransitions: 0 });
    expect(leases.lease!.spec!.renewTime).toBe('1970-01-01T00:16:40.000000Z'); // MicroTime: six fraction digits
    clock.now += 5_000;
    await a.round();
    expect(microTimeMs(leases.lease!.spec!.renewTime)).toBe(clock.now);
    expect(microTimeMs(leases.lease!.spec!.acquireTime)).toBe(1_000_000);
    expect(leases.lease!.spec!.leaseTransitions).toBe(0);
    expect(events).toEqual(['a started']);
    expect(a.retryMs).toBe(5_000);
  });

  it('does not take a live lease; takes it once unchanged for a whole duration on its own clock', async () => {
    const leases = new FakeLeases();
    const clock = { now: 0 };
    const a = elector(leases, 'a', clock);
    const said: string[] = [];
    const b = new LeaderElector({
      api: leases.api(), server: 'https://apiserver', name: 'portcullis.dev', namespace: 'portcullis', identity: 'b', leaseDurationSeconds: 15,
      log: createLogger('info', (line) => said.push(line)), now: () => clock.now, monotonic: () => clock.now, onStartedLeading: () => {}, onStoppedLeading: () => {},
    });
    await a.round();
    await b.round();
    await b.round();
    expect(b.isLeader).toBe(false);
    // Said once, naming the holder: a follower's webhooks are another's to write meanwhile.
    const waiting = said.filter((l) => l.includes('another holder has the lease; waiting'));
    expect(waiting).toHaveLength(1);
    expect(JSON.parse(waiting[0]!)).toMatchObject({ holder: 'a', identity: 'b', leaseDurationSeconds: 15 });
    // A stops renewing. B first saw this record at t=0 and waits 15 s from then, whatever
    // renewTime says (clocks on two machines need not agree).
    clock.now = 14_999;
    await b.round();
    expect(b.isLeader).toBe(false);
    clock.now = 15_000;
    await b.round();
    expect(b.isLeader).toBe(true);
    expect(leases.lease!.spec).toMatchObject({ holderIdentity: 'b', leaseTransitions: 1 });
  });

  it('steps down when another holder shows up, and when it cannot renew for 2/3 of the duration', async () => {
    const leases = new FakeLeases();
    const clock = { now: 0 };
    const events: string[] = [];
    const a = elector(leases, 'a', clock, events);
    await a.round();
    leases.lease = { ...leases.lease!, metadata: { ...leases.lease!.metadata, resourceVersion: String(++leases.version) }, spec: { ...leases.lease!.spec, holderIdentity: 'thief' } };
    await a.round();
    expect(a.isLeader).toBe(false);
    expect(events).toEqual(['a started', 'a stopped']);

    const other = new FakeLeases();
    const b = elector(other, 'b', clock, events);
    await b.round();
    other.down = true;
    clock.now += 5_000;
    await b.round();
    expect(b.isLeader).toBe(true); // one failed renewal is not yet a reason
    clock.now += 5_000;
    await b.round();
    expect(b.isLeader).toBe(false); // 10 s without renewal: others may take over at 15 s
    expect(events.at(-1)).toBe('b stopped');
  });

  it('fences every write by the renew deadline on the monotonic clock, with no round needed (a paused leader)', async () => {
    const leases = new FakeLeases();
    const clock = { now: 0 };
    const a = elector(leases, 'a', clock);
    await a.round();
    const writes: string[] = [];
    await a.fence('config one', async () => writes.push('one'));
    // Frozen (SIGSTOP) past the renew deadline: no round has run since, yet the next write is refused.
    clock.now += 10_000;
    expect(a.isLeader).toBe(false);
    await expect(a.fence('config two', async () => writes.push('two'))).rejects.toThrow(NotLeaderError);
    await expect(a.fence('config two', async () => writes.push('two'))).rejects.toThrow(/not writing config two: this replica is not the leader/);
    expect(writes).toEqual(['one']);
    // Once renewed (nobody else took the lease meanwhile), it may write again.
    await a.round();
    await a.fence('config three', async () => writes.push('three'));
    expect(writes).toEqual(['one', 'three']);
  });

  it('loses a race on the resourceVersion instead of overwriting', async () => {
    const leases = new FakeLeases();
    const clock = { now: 0 };
    const a = elector(leases, 'a', clock);
    await a.round();
    leases.lease!.spec!.holderIdentity = '';
    const api = leases.api();
    const b = new LeaderElector({
      api: { ...api, readNamespacedLease: async () => { const read = await api.readNamespacedLease({ name: '', namespace: '' }); leases.version++; leases.lease!.metadata!.resourceVersion = String(leases.version); return read; } } as unknown as CoordinationV1Api,
      server: 's', name: 'portcullis.dev', namespace: 'portcullis', identity: 'b', leaseDurationSeconds: 15, log: createLogger('error', () => {}),
      now: () => clock.now, onStartedLeading: () => {}, onStoppedLeading: () => {},
    });
    await b.round();
    expect(b.isLeader).toBe(false);
  });

  it('releases on stop so another replica can take over at once', async () => {
    const leases = new FakeLeases();
    const clock = { now: 0 };
    const a = elector(leases, 'a', clock);
    const b = elector(leases, 'b', clock);
    await a.round();
    await b.round();
    await a.stop();
    expect(leases.lease!.spec).toMatchObject({ holderIdentity: '', leaseDurationSeconds: 1 });
    await b.round();
    expect(b.isLeader).toBe(true);
  });

  it('a replica that is not ready does not take a free lease, so a ready one can; once ready it may', async () => {
    // Red team: an unready pod of a rollout (one policy failed to load) took the lease the healthy
    // leader released, registered nothing while unready, and no policy was enforced at all.
    const leases = new FakeLeases();
    const clock = { now: 0 };
    let ready = false;
    const unready = elector(leases, 'new', clock, [], () => ready);
    await unready.round();
    expect(unready.isLeader).toBe(false);
    expect(leases.lease).toBeUndefined();
    const healthy = elector(leases, 'old', clock);
    await healthy.round();
    expect(healthy.isLeader).toBe(true);
    await healthy.stop();
    await unready.round();
    expect(unready.isLeader).toBe(false);
    expect(leases.lease!.spec!.holderIdentity).toBe('');
    ready = true;
    await unready.round();
    expect(unready.isLeader).toBe(true);
  });

  it('a leader that stops being ready keeps the lease (no flapping)', async () => {
    const leases = new FakeLeases();
    const clock = { now: 0 };
    let ready = true;
    const a = elector(leases, 'a', clock, [], () => ready);
    await a.round();
    ready = false;
    clock.now += 5_000;
    await a.round();
    expect(a.isLeader).toBe(true);
  });
});

describe('Kubernetes API errors', () => {
  const op = { verb: 'patch' as const, resource: 'validatingwebhookconfigurations' as const, name: 'portcullis.dev' };
  const api = (code: number, message: string) => new ApiException(code, 'x', JSON.stringify({ kind: 'Status', message }), {});

  it('tell what to grant on 403', () => {
    const error = describeKubeError(api(403, 'forbidden'), op, 'https://k');
    expect(error).toBeInstanceOf(KubeApiError);
    expect(error.message).toBe('403 Forbidden: cannot patch validatingwebhookconfigurations "portcullis.dev": forbidden; grant the host\'s ServiceAccount \'patch\' on validatingwebhookconfigurations (deploy/10-rbac.yaml has the exact rules)');
    expect([error.retryable, error.transient]).toEqual([true, false]);
  });

  it('say where the apiserver was when it cannot be reached, and that reviews go on', () => {
    const cause = Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:6443'), { code: 'ECONNREFUSED' });
    const error = describeKubeError(new TypeError('fetch failed', { cause }), { ...op, verb: 'get', resource: 'leases', namespace: 'portcullis' }, 'https://127.0.0.1:6443');
    expect(error.message).toBe('cannot reach the apiserver at https://127.0.0.1:6443 to get leases "portcullis.dev" in namespace "portcullis": connect ECONNREFUSED 127.0.0.1:6443; admission reviews are still served; retrying');
    expect(error.transient).toBe(true);
  });

  it('say to create the namespace, or set webhooks.namespace, when the namespace does not exist', () => {
    const lease = { verb: 'create' as const, resource: 'leases' as const, name: 'portcullis.dev', namespace: 'policies' };
    const error = describeKubeError(api(404, 'namespaces "policies" not found'), lease, 'https://k');
    expect(error.message).toBe('404 Not Found: cannot create leases "portcullis.dev" in namespace "policies": namespace "policies" does not exist; ' +
      'create it (kubectl create namespace policies) or set webhooks.namespace to the namespace the host runs in; retrying');
    expect(error.retryable).toBe(true);
    // Any other 404 is what it says.
    expect(describeKubeError(api(404, 'leases.coordination.k8s.io "portcullis.dev" not found'), lease, 'https://k').message)
      .toBe('404 Not Found: leases "portcullis.dev" in namespace "policies" does not exist: leases.coordination.k8s.io "portcullis.dev" not found');
  });

  it('do not retry what only a configuration change can fix', () => {
    const error = describeKubeError(api(422, 'webhooks[0].name: Invalid value'), op, 'https://k');
    expect(error.message).toContain('422 Invalid: the apiserver refused to patch validatingwebhookconfigurations "portcullis.dev": webhooks[0].name: Invalid value; check the webhooks section');
    expect(error.retryable).toBe(false);
    expect(describeKubeError(api(409, 'conflict'), op, 'https://k').transient).toBe(true);
  });
});
