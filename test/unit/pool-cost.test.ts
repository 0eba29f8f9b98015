// The pool's estimate of what a policy's call costs (sandbox/pool.ts nextCost): a first call,
// which also compiles and warms up, counts only while nothing better is known.
import { expect, it } from 'vitest';
import { nextCost } from '../../host/src/sandbox/pool.ts';

it('starts from the first call it hears of, first or not', () => {
  expect(nextCost(undefined, false, 106_000, true)).toEqual({ cost: 106_000, cold: true });
  expect(nextCost(undefined, false, 400, false)).toEqual({ cost: 400, cold: false });
});

it('replaces an estimate learnt from first calls only with the next call, first or not', () => {
  expect(nextCost(106_000, true, 400, false)).toEqual({ cost: 400, cold: false });
  expect(nextCost(106_000, true, 90_000, true)).toEqual({ cost: 90_000, cold: true });
});

it('leaves an estimate learnt from warm calls alone when a first call comes (a replaced or another worker)', () => {
  expect(nextCost(400, false, 106_000, true)).toEqual({ cost: 400, cold: false });
});

it('averages warm calls into a warm estimate, keeping three quarters of it', () => {
  expect(nextCost(400, false, 800, false)).toEqual({ cost: 500, cold: false });
});
