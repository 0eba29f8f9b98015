// A policy loaded again (a reload) must never take the sandbox from the one still serving, and a
// load that waits behind a long call is not blamed for the wait. Found by a red-team read of the
// pool: a refused reload with the same module unloaded the serving policy's sandbox.
import { afterAll, beforeAll, expect, it } from 'vitest';
import { evaluatePolicy } from '../../host/src/evaluate/evaluate.ts';
import { SandboxPool } from '../../host/src/sandbox/pool.ts';
import { DEFAULT_LIMITS } from '../../host/src/config/limits.ts';
import { input, load, wasm } from '../helpers/policies.ts';
import { answering } from '../helpers/wasm.ts';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseConfig } from '../../host/src/config/load.ts';
import { loadPolicySet, PolicyRegistry } from '../../host/src/policy/policy-set.ts';

let pool: SandboxPool;
let dir: string;
beforeAll(async () => {
  pool = new SandboxPool(1);
  dir = await mkdtemp(join(tmpdir(), 'portcullis-reload-'));
});
afterAll(async () => {
  await pool.close();
  await rm(dir, { recursive: true, force: true });
});

it('a reload of the same module that refuses its settings leaves the serving policy answering', async () => {
  const serving = await load(pool, 'added-by', { settings: { value: 'portcullis' } });
  const before = await evaluatePolicy(pool, serving, 'mutate', input());
  expect(before.status).toBe('allowed');
  await expect(load(pool, 'added-by', { settings: { value: 42 } })).rejects.toThrow(/added-by/);
  expect(await evaluatePolicy(pool, serving, 'mutate', input())).toEqual({ ...before, totalMicros: expect.any(Number), guestMicros: expect.any(Number) });
});

it('loading the same policy twice at once gives one sandbox both can use', async () => {
  const [a, b] = await Promise.all([load(pool, 'numbers'), load(pool, 'numbers')]);
  expect(a.key).toBe(b.key);
  expect(pool.instancesOf(a.key)).toBe(1);
  for (const p of [a, b]) expect((await evaluatePolicy(pool, p, 'validate', input({ object: { spec: { numbers: [500] } } }))).status).toBe('denied');
});

it('a policy loaded while its worker runs a long call is not blamed for the wait, nor is the call', async () => {
  // A pool of its own whose loads have 1 s, with modules that load in milliseconds: the file's
  // pool had the 1 s for all, and a TypeScript policy's first load (340-420 ms idle) beside other
  // test files came near it (clean-clone CI failed one at 500 ms).
  const own = new SandboxPool(1, { loadTimeoutMs: 1000 });
  try {
    const module = join(dir, 'loop.wasm');
    await writeFile(module, await answering({ outcome: 'allow' }, { loopsAfter: 0 }));
    const loop = await load(own, 'loop', { module, limits: { ...DEFAULT_LIMITS, timeoutMs: 1500 } });
    const running = evaluatePolicy(own, loop, 'validate', input());
    await new Promise((r) => setTimeout(r, 100));
    // The load deadline is 1 s; the worker reads the load only after the 1.5 s call is stopped.
    const late = await load(own, 'no-delete', { name: 'no-delete-late' });
    const stuck = await running;
    expect(stuck).toMatchObject({ status: 'failed', failure: 'temporary' });
    expect(stuck.status === 'failed' && stuck.message).toContain('exceeded its 1.5s CPU deadline');
    expect((await evaluatePolicy(own, late, 'validate', input())).status).toBe('allowed');
  } finally {
    await own.close();
  }
}, 20_000);

it('a reload back to settings a draining set still serves keeps that sandbox, though the draining set ends while it loads', async () => {
  // Red team: a settings change and its revert 1.5 s apart, beside a looping policy that kept
  // the first set held; its drain unloaded the sandbox the revert was loading onto, and every
  // call of the policy then failed as not loaded (10,892 of 13,947 reviews), until a reload.
  const configOf = (value: string) => parseConfig(`policies:\n  - { name: tag, module: ${wasm('added-by')}, settings: { value: ${value} } }\n`, '/x/p.yaml');
  const first = await loadPolicySet(pool, configOf('first'));
  const registry = new PolicyRegistry(pool, first);
  first.hold(); // a review still running on the first set
  const second = await loadPolicySet(pool, configOf('second'));
  registry.swap(second);
  const loaded = registry.loading();
  const third = await loadPolicySet(pool, configOf('first')); // the first set's sandbox
  const key = third.entries[0]!.loaded!.key;
  expect(key).toBe(first.entries[0]!.loaded!.key);
  first.release(); // its review answers while the third set is not yet swapped in
  await new Promise((resolve) => setImmediate(resolve));
  registry.swap(third);
  loaded();
  await new Promise((resolve) => setImmediate(resolve));
  expect(pool.instancesOf(key)).toBe(1);
  expect(await evaluatePolicy(pool, third.entries[0]!.loaded!, 'mutate', input())).toMatchObject({ status: 'allowed' });
  // What nothing serves any more still goes.
  expect(pool.instancesOf(second.entries[0]!.loaded!.key)).toBe(0);
});

it('a set whose reviews still run keeps its sandboxes when a later set that shares them drains first', async () => {
  // Review: A, then B with the same sandbox, then C without it. B drained before A (A's reviews
  // were slower) and unloaded the sandbox A's reviews still called; a refused reload sharing it
  // (discard) did the same.
  const configOf = (value: string) => parseConfig(`policies:\n  - { name: kept, module: ${wasm('added-by')}, settings: { value: ${value} } }\n`, '/x/p.yaml');
  const a = await loadPolicySet(pool, configOf('same'));
  const registry = new PolicyRegistry(pool, a);
  const key = a.entries[0]!.loaded!.key;
  a.hold(); // a review still running on A
  const b = await loadPolicySet(pool, configOf('same'));
  registry.swap(b);
  const refused = await loadPolicySet(pool, configOf('same'));
  registry.discard(refused);
  registry.swap(await loadPolicySet(pool, configOf('other')));
  await new Promise((resolve) => setImmediate(resolve));
  expect(pool.instancesOf(key)).toBe(1);
  expect(await evaluatePolicy(pool, a.entries[0]!.loaded!, 'mutate', input())).toMatchObject({ status: 'allowed' });
  a.release();
  await new Promise((resolve) => setImmediate(resolve));
  expect(pool.instancesOf(key)).toBe(0); // nothing serves it any more
});
