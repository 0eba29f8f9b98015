// Context reads from inside real sandboxes: a component guest reads the workers' replicas,
// sees changes, is refused outside its grants, gets a temporary error before sync, cannot
// take the host down with a huge list or a read loop, and a replaced worker gets the state.
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { JsonObject } from '@portcullis/sdk';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ContextHub } from '../../host/src/context/hub.ts';
import { loadOffline } from '../../host/src/context/offline.ts';
import { toEntry } from '../../host/src/context/store.ts';
import { evaluatePolicy } from '../../host/src/evaluate/evaluate.ts';
import type { LoadedPolicy } from '../../host/src/policy/loaded.ts';
import { SandboxPool } from '../../host/src/sandbox/pool.ts';
import { DEFAULT_LIMITS } from '../../host/src/config/limits.ts';
import { input, load } from '../helpers/policies.ts';
import { contextReading } from '../helpers/wasm.ts';

const NS = { apiVersion: 'v1', kind: 'Namespace' };
const ING = { apiVersion: 'networking.k8s.io/v1', kind: 'Ingress' };
const namespace = (name: string, labels: Record<string, string> = {}): JsonObject => ({ apiVersion: 'v1', kind: 'Namespace', metadata: { name, labels } });
const ingress = (ns: string, name: string): JsonObject => ({
  apiVersion: 'networking.k8s.io/v1', kind: 'Ingress', metadata: { namespace: ns, name }, spec: { rules: [{ host: `${name}.example.com` }] },
});

type Read = { verb: 'get' | 'list'; apiVersion: string; kind: string; namespace?: string; name?: string; labelSelector?: string };

let pool: SandboxPool;
let hub: ContextHub;
let probe: LoadedPolicy;
beforeAll(async () => {
  pool = new SandboxPool(2);
  hub = new ContextHub();
  loadOffline(hub, [namespace('shop', { owner: 'ann' }), namespace('blog'), ingress('shop', 'web')], [NS]);
  hub.attach(pool);
  probe = await load(pool, 'context-probe', { context: [NS, ING], limits: { ...DEFAULT_LIMITS, timeoutMs: 1500 } });
});
afterAll(() => pool.close());

const reading = (spec: { reads?: Read[]; spin?: Read }, policy = probe) => evaluatePolicy(pool, policy, 'validate', input({ object: { spec } }));

describe('context reads in the sandbox', () => {
  it('get and list answer from the replica, with selectors', async () => {
    const outcome = await reading({ reads: [
      { verb: 'get', ...NS, name: 'shop' }, { verb: 'get', ...NS, name: 'nope' },
      { verb: 'list', ...NS, labelSelector: 'owner' }, { verb: 'list', ...ING },
    ] });
    expect(outcome).toMatchObject({ status: 'denied', code: 418, message: JSON.stringify(['shop', 'null', 'shop', 'shop/web']) });
  });

  it('every worker sees a change before the next call', async () => {
    hub.apply({ type: 'context', op: 'upsert', kind: 'v1 Namespace', entry: toEntry(namespace('blog', { owner: 'bob' }))! });
    hub.apply({ type: 'context', op: 'delete', kind: 'networking.k8s.io/v1 Ingress', namespace: 'shop', name: 'web' });
    // Two workers, two calls at once: both must answer from the updated replica.
    const outcomes = await Promise.all([0, 1].map(() => reading({ reads: [{ verb: 'list', ...NS, labelSelector: 'owner' }, { verb: 'list', ...ING }] })));
    for (const outcome of outcomes) expect(outcome).toMatchObject({ message: JSON.stringify(['shop,blog', '']) });
  });

  it('a read outside the grants is a permanent failure naming the missing grant', async () => {
    const narrow = await load(pool, 'narrow', { file: 'context-probe', context: [NS] });
    const outcome = await reading({ reads: [{ verb: 'list', ...ING }] }, narrow);
    expect(outcome).toMatchObject({ status: 'failed', failure: 'permanent' });
    expect(outcome.status === 'failed' && outcome.message).toBe(
      'may not read Ingress (networking.k8s.io/v1): its grants are { apiVersion: v1, kind: Namespace }; ' +
      'add context: [{ apiVersion: networking.k8s.io/v1, kind: Ingress }] to policy "narrow" in the configuration');
    const none = await load(pool, 'none', { file: 'context-probe' });
    expect(await reading({ reads: [{ verb: 'get', ...NS, name: 'shop' }] }, none)).toMatchObject({ status: 'failed', failure: 'permanent' });
  });

  it('a read before the cache has synced is a temporary failure', async () => {
    hub.apply({ type: 'context', op: 'synced', kind: 'v1 Namespace', synced: false });
    try {
      const outcome = await reading({ reads: [{ verb: 'get', ...NS, name: 'shop' }] });
      expect(outcome).toMatchObject({ status: 'failed', failure: 'temporary' });
      expect(outcome.status === 'failed' && outcome.message).toContain('has not synced with the cluster yet; retry shortly');
    } finally {
      hub.apply({ type: 'context', op: 'synced', kind: 'v1 Namespace', synced: true });
    }
  });

  it('a list of 10,000 objects fails with a clear error and leaves the worker serving', async () => {
    const many = Array.from({ length: 10_000 }, (_, i) => toEntry({ ...ingress(`ns-${i % 100}`, `ing-${i}`), spec: { rules: [{ host: 'x'.repeat(400) }] } })!);
    hub.apply({ type: 'context', op: 'reset', kind: 'networking.k8s.io/v1 Ingress', entries: many, synced: true });
    const restarts = pool.stats.restarts;
    const outcome = await reading({ reads: [{ verb: 'list', ...ING }] });
    expect(outcome).toMatchObject({ status: 'failed', failure: 'permanent' });
    expect(outcome.status === 'failed' && outcome.message).toMatch(/exceeds the 4194304-byte limit of one context read/);
    // Narrowed, it works, in the same workers.
    expect(await reading({ reads: [{ verb: 'list', ...ING, namespace: 'ns-3' }] })).toMatchObject({ status: 'denied' });
    expect(pool.stats.restarts).toBe(restarts);
  });

  it('a guest that reads in a loop is stopped by the CPU deadline; the replacement worker has the cache', async () => {
    const restarts = pool.stats.restarts;
    const outcome = await reading({ spin: { verb: 'get', ...NS, name: 'shop' } });
    expect(outcome).toMatchObject({ status: 'failed', failure: 'temporary', message: 'exceeded its 1.5s CPU deadline' });
    expect(pool.stats.restarts).toBe(restarts + 1);
    // Both workers, including the new one, answer from the cache (once a call of the policy has
    // answered: until then, a policy whose call was stopped takes only one worker).
    expect(await reading({ reads: [{ verb: 'get', ...NS, name: 'blog' }] })).toMatchObject({ status: 'denied' });
    const outcomes = await Promise.all([0, 1].map(() => reading({ reads: [{ verb: 'get', ...NS, name: 'blog' }] })));
    for (const o of outcomes) expect(o).toMatchObject({ status: 'denied', message: JSON.stringify(['blog']) });
  });
});

describe('context reads from an AssemblyScript guest (Extism host function)', () => {
  const asReading = (policy: LoadedPolicy, spec: JsonObject) => evaluatePolicy(pool, policy, 'validate', input({ object: { spec } }));

  it('get and list answer from the replica; a read outside the grants fails permanently', async () => {
    const as = await load(pool, 'as-context-probe', { context: [NS] });
    expect(await asReading(as, { get: 'shop', times: 3 })).toMatchObject({ status: 'allowed' });
    expect(await asReading(as, { list: 'owner' })).toMatchObject({ status: 'denied', code: 418, message: 'shop,blog' });
    const ungranted = await load(pool, 'as-ungranted', { file: 'as-context-probe' });
    const outcome = await asReading(ungranted, { get: 'shop' });
    expect(outcome).toMatchObject({ status: 'failed', failure: 'permanent' });
    expect(outcome.status === 'failed' && outcome.message).toContain('add context: [{ apiVersion: v1, kind: Namespace }] to policy "as-ungranted"');
  });

  it('a read before sync is a temporary failure', async () => {
    const as = await load(pool, 'as-context-probe', { context: [NS] });
    hub.apply({ type: 'context', op: 'synced', kind: 'v1 Namespace', synced: false });
    try {
      expect(await asReading(as, { get: 'shop' })).toMatchObject({ status: 'failed', failure: 'temporary' });
    } finally {
      hub.apply({ type: 'context', op: 'synced', kind: 'v1 Namespace', synced: true });
    }
  });

  it('answers land in the guest\'s own memory, under its cap: reading a large object in a loop is collected', async () => {
    const as = await load(pool, 'as-context-probe', { context: [NS], limits: { ...DEFAULT_LIMITS, memoryMiB: 16 } });
    hub.apply({ type: 'context', op: 'upsert', kind: 'v1 Namespace', entry: toEntry(big)! });
    expect(await asReading(as, { get: 'big', times: 100 })).toMatchObject({ status: 'allowed' });
  });
});

const big = { ...namespace('big'), metadata: { name: 'big', annotations: { blob: 'x'.repeat(512 * 1024) } } };
const getBig = JSON.stringify({ verb: 'get', ...NS, namespace: '', name: 'big' });

describe('context reads from hand-written core modules', () => {
  const handMade = async (name: string, bytes: Uint8Array) => {
    const file = join(dir, `${name}.wasm`);
    await writeFile(file, bytes);
    return load(pool, name, { module: file, context: [NS], limits: { ...DEFAULT_LIMITS, memoryMiB: 16 } });
  };
  let dir: string;
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'portcullis-context-'));
    hub.apply({ type: 'context', op: 'upsert', kind: 'v1 Namespace', entry: toEntry(big)! });
  });
  afterAll(() => rm(dir, { recursive: true, force: true }));

  it('the older import (answers in Extism kernel memory) still counts them against the cap', async () => {
    const legacy = await handMade('legacy-reader', await contextReading(getBig, { legacy: { times: 100 } }));
    const outcome = await evaluatePolicy(pool, legacy, 'validate', input());
    expect(outcome).toMatchObject({ status: 'failed', failure: 'temporary', message: 'exceeded its 16 MiB memory cap (context read answers)' });
  });

  it('a request or an answer outside the guest\'s memory is the policy\'s crash, and the worker serves on', async () => {
    const cases = [
      { at: 0, length: 0x7fffffff, answerAt: 0, says: 'gave a context request at 0 (2147483647 bytes), outside its 65536-byte memory' },
      { at: 60_000, length: 6000, answerAt: 0, says: 'gave a context request at 60000 (6000 bytes), outside its 65536-byte memory' },
      // The answer is the 512 KiB object: it does not fit in the module's one page wherever it goes.
      { at: 0, length: getBig.length, answerAt: 0, says: /^crashed: gave room for a context answer at 0 \(\d{6} bytes\), outside its 65536-byte memory$/ },
      { at: 0, length: getBig.length, answerAt: -1, says: /^crashed: gave room for a context answer at 4294967295 / },
      // Declared i64: past 2^32 is no address, not one wrapped round (red team: this read offset 1024).
      { at: 0, length: getBig.length, answerAt: 2 ** 32 + 1024, wide: true, says: /^crashed: gave room for a context answer at 4294968320 \(\d{6} bytes\)/ },
      { at: 2 ** 32, length: getBig.length, answerAt: 0, wide: true, says: `gave a context request at 4294967296 (${getBig.length} bytes), outside its 65536-byte memory` },
    ];
    for (const [i, { says, ...oneCopy }] of cases.entries()) {
      const policy = await handMade(`bad-reader-${i}`, await contextReading(getBig, { oneCopy }));
      const outcome = await evaluatePolicy(pool, policy, 'validate', input());
      expect(outcome).toMatchObject({ status: 'failed', failure: 'crash' });
      if (typeof says === 'string') expect(outcome.status === 'failed' && outcome.message).toBe(`crashed: ${says}`);
      else expect(outcome.status === 'failed' && outcome.message).toMatch(says);
    }
    expect(await reading({ reads: [{ verb: 'get', ...NS, name: 'shop' }] })).toMatchObject({ status: 'denied', message: '["shop"]' });
  });
});
