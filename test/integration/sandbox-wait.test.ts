// A call waits for a worker only as long as it could still answer before the caller (the
// apiserver's ?timeout=) gives up: one that waited its whole deadline and then ran for it was
// answered after the apiserver had left, on a worker nobody was waiting for (red team).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { evaluatePolicy } from '../../host/src/evaluate/evaluate.ts';
import { SandboxPool } from '../../host/src/sandbox/pool.ts';
import { goDurationMs } from '../../host/src/server/caller.ts';
import { DEFAULT_LIMITS } from '../../host/src/config/limits.ts';
import { input, load } from '../helpers/policies.ts';

let pool: SandboxPool;
beforeAll(() => { pool = new SandboxPool(1); });
afterAll(() => pool.close());

describe('the time left to answer', () => {
  it('a call that could not finish in time is not started; without a caller timeout it waits its deadline', async () => {
    const spin = await load(pool, 'spin', { limits: { ...DEFAULT_LIMITS, timeoutMs: 1500 } });
    const numbers = await load(pool, 'numbers', { limits: { ...DEFAULT_LIMITS, timeoutMs: 2000 } });
    const ok = input({ object: { spec: { numbers: [1] } } });
    // The only worker is held by a loop for 1.5 s.
    const held = evaluatePolicy(pool, spin, 'validate', input());
    await new Promise((r) => setTimeout(r, 50));
    // The caller waits 2.3 s in all: a call of a 2 s policy may wait 0.3 s, not 2 s.
    const late = await evaluatePolicy(pool, numbers, 'validate', ok, 2300);
    expect(late).toMatchObject({ status: 'failed', failure: 'temporary', message: expect.stringMatching(/could not finish before the apiserver's timeout; not started$/) });
    // No caller timeout: it waits for the worker, and runs.
    const patient = await evaluatePolicy(pool, numbers, 'validate', ok);
    expect(patient.status).toBe('allowed');
    await held;
  });
});

describe('goDurationMs', () => {
  it.each([
    ['10s', 10_000], ['2.5s', 2500], ['1m30s', undefined], ['1m0s', 60_000], ['500ms', 500], ['30s', 30_000],
    ['abc', undefined], ['0s', undefined], ['10', undefined], [null, undefined], ['5h', undefined],
  ])('%s -> %s ms', (text, ms) => {
    expect(goDurationMs(text)).toBe(ms);
  });
});
