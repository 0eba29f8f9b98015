// A worker collects what it discarded once it passes a budget, instead of leaving linear
// memories of dropped instances to V8's schedule (red team F8: host RSS past 1 GB).
import { runInNewContext } from 'node:vm';
import { describe, expect, it } from 'vitest';
import { Garbage, GARBAGE_BUDGET_BYTES } from '../../host/src/sandbox/garbage.ts';

describe('Garbage', () => {
  it('collects only once the discarded bytes reach the budget, then counts afresh', () => {
    let runs = 0;
    const garbage = new Garbage(() => runs++, 100);
    garbage.discarded(60);
    garbage.settle();
    expect(runs).toBe(0);
    garbage.discarded(40);
    garbage.settle();
    expect(runs).toBe(1);
    garbage.discarded(99);
    garbage.settle();
    expect(runs).toBe(1);
    expect(garbage.collections).toBe(1);
  });

  it('defaults to one 64 MiB memory cap of garbage', () => {
    expect(GARBAGE_BUDGET_BYTES).toBe(64 * 2 ** 20);
  });

  it('really collects: an unreachable object is gone after the default collector runs', async () => {
    const ref = new WeakRef({ payload: new Array(1000).fill(1) });
    // A WeakRef's target lives at least until the job that made it ends.
    await new Promise((resolve) => setImmediate(resolve));
    const garbage = new Garbage(undefined, 1);
    garbage.discarded(1);
    garbage.settle();
    expect(garbage.collections).toBe(1);
    expect(ref.deref()).toBeUndefined();
  });

  it('leaves no gc global behind for other code of the worker', () => {
    const garbage = new Garbage(undefined, 1); // the collector is made at its first use
    garbage.discarded(1);
    garbage.settle();
    expect(garbage.collections).toBe(1);
    expect((globalThis as { gc?: unknown }).gc).toBeUndefined();
    // Contexts made later do not get one either.
    expect(runInNewContext('typeof gc')).toBe('undefined');
  });
});
