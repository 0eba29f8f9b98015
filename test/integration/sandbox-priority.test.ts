// Guests run below the main thread's CPU priority: when the cores are contended (guests at their
// deadlines, a load spike), the thread that answers the apiserver is scheduled first. Linux only.
import { readdirSync, readFileSync } from 'node:fs';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { SandboxPool } from '../../host/src/sandbox/pool.ts';
import { load } from '../helpers/policies.ts';

/** Nice value of each thread of this process, by thread id (field 19 of /proc/<pid>/task/<tid>/stat). */
function niceByThread(): Map<number, number> {
  const threads = new Map<number, number>();
  for (const tid of readdirSync('/proc/self/task')) {
    const stat = readFileSync(`/proc/self/task/${tid}/stat`, 'utf8');
    // The command name (field 2) may hold spaces: count fields after its closing parenthesis.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    threads.set(Number(tid), Number(fields[16]));
  }
  return threads;
}

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
  const self = Number(readFileSync('/proc/thread-self/stat', 'utf8').split(' ')[0]);
  expect(after.get(self)).toBe(before.get(self));
  expect(after.get(self)).not.toBe(10);
});
