// Every way a policy can misbehave is stopped, named, and leaves the host, the other
// policies, and later requests unharmed.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { evaluatePolicy } from '../../host/src/evaluate/evaluate.ts';
import { SandboxPool } from '../../host/src/sandbox/pool.ts';
import { DEFAULT_LIMITS } from '../../host/src/config/limits.ts';
import { input, load } from '../helpers/policies.ts';

let pool: SandboxPool;
beforeAll(() => { pool = new SandboxPool(2); });
afterAll(() => pool.close());

const quick = { ...DEFAULT_LIMITS, timeoutMs: 500 };

describe('CPU deadline', () => {
  it('stops an infinite loop, names the policy and the deadline, and rebuilds the instance', async () => {
    const spin = await load(pool, 'spin', { limits: quick });
    const outcome = await evaluatePolicy(pool, spin, 'validate', input());
    expect(outcome).toMatchObject({ policy: 'spin', status: 'failed', failure: 'temporary', message: 'exceeded its 500ms CPU deadline' });
    // The same policy answers the next request from a rebuilt instance. On a loaded machine the
    // replacement worker may still be loading past the call's 500 ms, which the call may wait at
    // most: such a call is refused, not started (seen beside two other sandbox test files). The
    // rebuilt instance must answer within 5 s all the same.
    const rebuiltBy = performance.now() + 5000;
    let next = await evaluatePolicy(pool, spin, 'mutate', input());
    while (performance.now() < rebuiltBy && next.status === 'failed' && /for a sandbox, past its 500ms deadline; not started$/.test(next.message)) {
      next = await evaluatePolicy(pool, spin, 'mutate', input());
    }
    expect({ status: next.status, warnings: next.warnings, message: next.status === 'failed' ? next.message : undefined })
      .toEqual({ status: 'allowed', warnings: ['spun 0'], message: undefined });
    expect(pool.stats.restarts).toBeGreaterThanOrEqual(1);
  });

  it('does not hold up another policy of the same request, nor the event loop', async () => {
    const spin = await load(pool, 'spin', { limits: { ...DEFAULT_LIMITS, timeoutMs: 1000 } });
    const numbers = await load(pool, 'numbers');
    let ticks = 0;
    const ticker = setInterval(() => ticks++, 10);
    const stuck = evaluatePolicy(pool, spin, 'validate', input());
    const fine = await evaluatePolicy(pool, numbers, 'validate', input({ object: { spec: { numbers: [1] } } }));
    expect(fine.status).toBe('allowed');
    expect((await stuck).status).toBe('failed');
    clearInterval(ticker);
    // A blocked event loop would have fired the 10 ms ticker a handful of times at most.
    expect(ticks).toBeGreaterThan(20);
  });
});

describe('memory cap', () => {
  it('stops a TypeScript policy that allocates without bound', async () => {
    const bomb = await load(pool, 'memory-bomb', { limits: { ...DEFAULT_LIMITS, memoryMiB: 32 } });
    const outcome = await evaluatePolicy(pool, bomb, 'validate', input());
    expect(outcome).toMatchObject({ status: 'failed', failure: 'temporary', message: 'exceeded its 32 MiB memory cap' });
    expect(await evaluatePolicy(pool, bomb, 'mutate', input({ object: { metadata: {} } }))).toMatchObject({ status: 'allowed' });
  });

  it('gives two policies of one module each its own cap (the capped module is shared only by the same cap)', async () => {
    // prepare.ts shares a component's capped core modules by content and memory plan: were the
    // plan left out of that, the second policy would run with the first one's cap.
    // A long deadline: beside two other sandbox test files, one run failed the 64 MiB policy,
    // which only makes a 32 MiB string, with a message the old assertion did not show.
    const keep = { mib: 32 };
    const limits = (memoryMiB: number) => ({ ...DEFAULT_LIMITS, memoryMiB, timeoutMs: 20_000 });
    for (const [first, second] of [[64, 24], [20, 72]] as const) {
      const a = await load(pool, `bomb-${first}`, { file: 'memory-bomb', settings: keep, limits: limits(first) });
      const b = await load(pool, `bomb-${second}`, { file: 'memory-bomb', settings: keep, limits: limits(second) });
      const outcomes = (await Promise.all([a, b].map((policy) => evaluatePolicy(pool, policy, 'mutate', input({ object: { metadata: {} } }, keep)))))
        .map((o) => (o.status === 'failed' ? { status: o.status, failure: o.failure, message: o.message } : { status: o.status }));
      const expected = (cap: number) => (cap > 32
        ? { status: 'allowed' }
        // One 32 MiB string with the memory nearly empty: QuickJS's "out of memory" is the cap, said with what was left.
        : { status: 'failed', failure: 'temporary', message: expect.stringMatching(new RegExp(`^exceeded its ${cap} MiB memory cap: an allocation asked for more than the [\\d.]+ MiB left \\([\\d.]+ MiB in use\\)$`)) });
      expect(outcomes).toEqual([expected(first), expected(second)]);
    }
  });

  it('stops an AssemblyScript policy that allocates without bound', async () => {
    const bomb = await load(pool, 'as-memory-bomb', { limits: { ...DEFAULT_LIMITS, memoryMiB: 16 } });
    const outcome = await evaluatePolicy(pool, bomb, 'validate', input());
    // AssemblyScript's allocator traps when memory.grow fails: the message says so, and what the trap was.
    expect(outcome).toMatchObject({
      status: 'failed', failure: 'temporary',
      message: expect.stringMatching(/^exceeded its 16 MiB memory cap, most likely: it failed with 1[5-6](\.\d)? of its 16 MiB in use \(wasm trap: .*unreachable/),
    });
  });

  it('counts Extism kernel allocations (outside linear memory) against the cap', async () => {
    // A long deadline: on a loaded machine the allocation loop must still reach the cap first.
    const hog = await load(pool, 'kernel-hog', { limits: { ...DEFAULT_LIMITS, memoryMiB: 128, timeoutMs: 20_000 } });
    expect(await evaluatePolicy(pool, hog, 'validate', input())).toMatchObject({
      status: 'failed', failure: 'temporary', message: 'exceeded its 128 MiB memory cap (Extism kernel allocations)',
    });
  });

  it('refuses a cap below what the module needs to start', async () => {
    await expect(load(pool, 'numbers', { limits: { ...DEFAULT_LIMITS, memoryMiB: 0.5 } })).rejects.toThrow(/policy "numbers" could not be loaded: it declares .* MiB before running \(memories .* MiB, tables .* MiB\), above its 0\.5 MiB memory budget; raise limits\.memoryMiB/);
  });
});

describe('crashes and garbage', () => {
  it('reports an AssemblyScript abort with its message and location', async () => {
    const trap = await load(pool, 'trap');
    const outcome = await evaluatePolicy(pool, trap, 'validate', input());
    expect(outcome).toMatchObject({ status: 'failed', failure: 'crash' });
    expect(outcome.status === 'failed' && outcome.message).toMatch(/^crashed: wasm trap: .*unreachable.*\(abort: boom: the policy gave up at .*index\.ts:\d+:\d+\)$/);
  });

  it('reports a raw trap', async () => {
    const trap = await load(pool, 'trap');
    expect(await evaluatePolicy(pool, trap, 'mutate', input({ object: {} }))).toMatchObject({ status: 'failed', failure: 'crash', message: expect.stringMatching(/^crashed: wasm trap/) });
  });

  it('treats output that is not JSON, or not in the contract, as a crash', async () => {
    const garbage = await load(pool, 'garbage');
    expect(await evaluatePolicy(pool, garbage, 'validate', input())).toMatchObject({ status: 'failed', failure: 'crash', message: 'returned output that is not JSON (this is not JSON)' });
    expect(await evaluatePolicy(pool, garbage, 'mutate', input({ object: {} }))).toMatchObject({ status: 'failed', failure: 'crash', message: 'returned a patch that is not a list of operations' });
  });

  it('treats a non-zero return code as a failure, whatever the output says (Extism\'s convention)', async () => {
    const code = await load(pool, 'error-code');
    expect(await evaluatePolicy(pool, code, 'validate', input())).toMatchObject({
      status: 'failed', failure: 'crash', message: expect.stringMatching(/^crashed: returned 1 from validate, which says it failed/),
    });
    expect(await evaluatePolicy(pool, code, 'mutate', input({ object: {} }))).toMatchObject({
      status: 'failed', failure: 'crash', message: expect.stringMatching(/^crashed: returned 7 from mutate/),
    });
  });

  it('refuses output over the limit', async () => {
    const big = await load(pool, 'oversize');
    expect(await evaluatePolicy(pool, big, 'validate', input())).toMatchObject({ status: 'failed', failure: 'temporary', message: 'returned 2097152 bytes, more than its 1048576-byte output limit' });
  });

  it('turns an uncaught exception of a TypeScript policy into a crash with its message and where in the source it was thrown', async () => {
    const hostile = await load(pool, 'hostile', { settings: { probe: 'nope' } });
    expect(await evaluatePolicy(pool, hostile, 'validate', input())).toMatchObject({ status: 'failed', failure: 'crash', message: 'unknown probe nope (at validate, policy.ts:23)' });
  });
});

describe('long-lived instances', () => {
  it('keep answering an AssemblyScript policy past 16,384 calls (Extism blocks are freed per call)', async () => {
    const single = new SandboxPool(1);
    try {
      // A 10 s deadline: under a loaded clean-clone CI run its first calls took ~5 ms each, and a
      // burst of 100 behind them was 500 ms of work queued, past the quarter of a 2 s deadline a
      // call waits, so the pool shed 8 calls as overload. Shedding is not what this test is about.
      const policy = await load(single, 'no-delete', { limits: { ...DEFAULT_LIMITS, timeoutMs: 10_000 } });
      const payload = JSON.stringify(input({ object: { metadata: { name: 'x' } } }));
      const failures: string[] = [];
      for (let i = 0; i < 17_000; i += 100) {
        const batch = await Promise.all(Array.from({ length: 100 }, () => evaluatePolicy(single, policy, 'validate', payload)));
        for (const outcome of batch) if (outcome.status !== 'allowed') failures.push(`${outcome.status}: ${'message' in outcome ? outcome.message : ''}`);
      }
      expect(failures).toEqual([]);
    } finally {
      await single.close();
    }
  }, 120_000);
});

describe('state between requests', () => {
  it('reuses an instance by default, so globals persist', async () => {
    const counter = await load(pool, 'counter');
    // One worker of the two may serve each call: count per worker by loading into a pool of one.
    const single = new SandboxPool(1);
    try {
      const c = await load(single, 'counter');
      const seen = [];
      for (let i = 0; i < 3; i++) seen.push((await evaluatePolicy(single, c, 'validate', input())).warnings[0]);
      expect(seen).toEqual(['call 1', 'call 2', 'call 3']);
    } finally {
      await single.close();
    }
    expect(counter.isolation).toBe('reuse');
  });

  it('gives every evaluation a fresh instance with isolation: fresh', async () => {
    const counter = await load(pool, 'counter', { isolation: 'fresh' });
    const seen = [];
    for (let i = 0; i < 3; i++) seen.push((await evaluatePolicy(pool, counter, 'validate', input())).warnings[0]);
    expect(seen).toEqual(['call 1', 'call 1', 'call 1']);
  });
});

it('evaluates policies in parallel, one per worker', async () => {
  // Its own policy: the file's other spin calls were stopped, and a stopped policy is held to all
  // workers but one for a while. A long deadline, so that it never counts as slow either.
  const spin = await load(pool, 'spin-in-parallel', { file: 'spin', limits: { ...DEFAULT_LIMITS, timeoutMs: 20_000 } });
  expect((await evaluatePolicy(pool, spin, 'mutate', input())).status).toBe('allowed');
  const settingsInput = JSON.stringify({ ...input(), settings: { iterations: 2e6 } });
  const running = [evaluatePolicy(pool, spin, 'mutate', settingsInput), evaluatePolicy(pool, spin, 'mutate', settingsInput)];
  let sawBoth = false;
  for (let i = 0; i < 200 && !sawBoth; i++) {
    sawBoth = pool.stats.busy === 2;
    await new Promise((r) => setTimeout(r, 5));
  }
  const results = await Promise.all(running);
  expect(results.map((r) => r.status)).toEqual(['allowed', 'allowed']);
  expect(sawBoth).toBe(true);
});
