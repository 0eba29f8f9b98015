// Guests run below the main thread's CPU priority: when the cores are contended (guests at their
// deadlines, a load spike), the thread that answers the apiserver is scheduled first. Linux only.
import { afterAll, beforeAll, expect, it } from 'vitest';
import { SandboxPool } from '../../host/src/sandbox/pool.ts';
import { load } from '../helpers/policies.ts';
import { niceByThread, thisThread } from '../helpers/threads.ts';

let pool: SandboxPool;
let before: Map<number, number>;

beforeAll(async () => {
  before = niceByThread();
  pool = new SandboxPool(2);
  // Loading into both workers means both have run their start-up code.
  await load(pool, 'no-delete');
}, 60_000);
afterAll(() => pool.close());

it('runs its sandbox workers at nice 10 and leaves the calling thread at its own priority', () => {
  const after = niceByThread();
  const added = [...after].filter(([tid]) => !before.has(tid));
  expect(added.filter(([, nice]) => nice === 10).length).toBeGreaterThanOrEqual(2);
  const self = thisThread();
  expect(after.get(self)).toBe(before.get(self));
  expect(after.get(self)).not.toBe(10);
});
