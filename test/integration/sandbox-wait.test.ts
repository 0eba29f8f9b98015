// A call waits for a worker only as long as it could still answer before the caller (the
// apiserver's ?timeout=) gives up: one that waited its whole deadline and then ran for it was
// answered after the apiserver had left, on a worker nobody was waiting for (red team).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { evaluatePolicy } from '../../host/src/evaluate/evaluate.ts';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { SandboxPool, SLOW_LOAD_MS } from '../../host/src/sandbox/pool.ts';
import { goDurationMs } from '../../host/src/server/caller.ts';
import { DEFAULT_LIMITS } from '../../host/src/config/limits.ts';
import { input, load } from '../helpers/policies.ts';
import { slowStart } from '../helpers/wasm.ts';

let pool: SandboxPool;
beforeAll(() => { pool = new SandboxPool(1); });
afterAll(() => pool.close());

describe('the time left to answer', () => {
  it('a call that could not finish in time is not started; without a caller timeout it waits its deadline', async () => {
    // Long enough that the relief worker (see below) comes after the late call's wait has run out
    // (at 10% of the held call's deadline: 0.5 s).
    const spin = await load(pool, 'spin', { limits: { ...DEFAULT_LIMITS, timeoutMs: 5000 } });
    // 4 s: the patient call below waits for the relief worker to start and load numbers (a first
    // load there took 1.96 s in a clean-clone CI run).
    const numbers = await load(pool, 'numbers', { limits: { ...DEFAULT_LIMITS, timeoutMs: 4000 } });
    const ok = input({ object: { spec: { numbers: [1] } } });
    // The only worker is held by a loop for 5 s.
    const held = evaluatePolicy(pool, spin, 'validate', input());
    await new Promise((r) => setTimeout(r, 50));
    // The caller waits 4.3 s in all: a call of a 4 s policy may wait 0.3 s, not 4 s.
    const late = await evaluatePolicy(pool, numbers, 'validate', ok, 4300);
    expect(late).toMatchObject({ status: 'failed', failure: 'temporary', message: expect.stringMatching(/could not finish before the apiserver's timeout; not started$/) });
    // No caller timeout: it waits for the worker, and runs.
    const patient = await evaluatePolicy(pool, numbers, 'validate', ok);
    expect(patient.status).toBe('allowed');
    await held;
  });
});

describe('a call whose wait runs out while no worker asks for work', () => {
  it('is answered when its wait ends, not when a worker is free again', async () => {
    // Red team: every worker held or reloading a policy with a slow start function; the late
    // calls were answered only when a worker asked for work, 6-9 s past their 2 s deadline.
    const one = new SandboxPool(1);
    try {
      const spin = await load(one, 'spin', { limits: { ...DEFAULT_LIMITS, timeoutMs: 6000 } });
      expect((await evaluatePolicy(one, spin, 'mutate', input({ object: {} }))).status).toBe('allowed');
      const held = evaluatePolicy(one, spin, 'validate', input());
      await new Promise((r) => setTimeout(r, 50));
      // The caller waits 6.5 s in all: the call may wait 0.5 s. No relief worker runs it (its
      // policy holds the worker), and the only worker is held for 6 s.
      const started = performance.now();
      const late = await evaluatePolicy(one, spin, 'validate', input(), 6500);
      expect(late).toMatchObject({ status: 'failed', failure: 'temporary', message: expect.stringMatching(/could not finish before the apiserver's timeout; not started$/) });
      expect(performance.now() - started).toBeLessThan(3000); // before: 6 s, when the worker was replaced
      expect(await held).toMatchObject({ status: 'failed', message: 'exceeded its 6s CPU deadline' });
    } finally {
      await one.close();
    }
  }, 30_000);
});

describe('a relief worker', () => {
  it('runs other policies\' calls while every worker is held by a long call, and goes once it is not needed', async () => {
    const two = new SandboxPool(2);
    try {
      const long = { limits: { ...DEFAULT_LIMITS, timeoutMs: 6000 } };
      const [spinA, spinB, numbers] = await Promise.all([
        load(two, 'spin', { ...long, name: 'spin-a' }), load(two, 'spin', { ...long, name: 'spin-b' }),
        // Its deadline is not the bound (a relief worker's first load of it took 1.96 s in a
        // clean-clone CI run): being answered while the loops still run is.
        load(two, 'numbers', { limits: { ...DEFAULT_LIMITS, timeoutMs: 8000 } }),
      ]);
      const ok = input({ object: { spec: { numbers: [1] } } });
      // Each answers a review first, so nothing marks them as likely to loop (red team: a policy
      // trusted until its first loop, beside one already stopped, held both workers).
      for (const policy of [spinA, spinB]) expect((await evaluatePolicy(two, policy, 'mutate', input({ object: {} }))).status).toBe('allowed');
      expect((await evaluatePolicy(two, numbers, 'validate', ok)).status).toBe('allowed');
      const held = [spinA, spinB].map((policy) => evaluatePolicy(two, policy, 'validate', input()));
      let loopsEnded = false;
      void Promise.all(held).then(() => { loopsEnded = true; });
      await new Promise((r) => setTimeout(r, 100));
      expect(two.stats.busy).toBe(2);
      // Both workers loop for 6 s. Without relief numbers waited them out (and, with a 3 s
      // deadline, failed).
      const answers = await Promise.all([1, 2, 3].map(() => evaluatePolicy(two, numbers, 'validate', ok)));
      expect(answers.map((a) => a.status)).toEqual(['allowed', 'allowed', 'allowed']);
      expect(loopsEnded).toBe(false);
      expect(two.stats.workers).toBe(3);
      for (const outcome of await Promise.all(held)) expect(outcome).toMatchObject({ status: 'failed', message: 'exceeded its 6s CPU deadline' });
      // Nothing holds the workers now: the relief worker goes after RELIEF_IDLE_MS (2 s).
      await expect.poll(() => two.stats.workers, { timeout: 10_000, interval: 100 }).toBe(2);
      expect((await evaluatePolicy(two, numbers, 'validate', ok)).status).toBe('allowed');
    } finally {
      await two.close();
    }
  }, 30_000);
});

describe('a relief worker, with a policy that holds the workers', () => {
  it('never runs that policy\'s calls, even in the batch of another review\'s', async () => {
    // Review helper: a policy loaded into the relief before it held a worker rode onto the relief
    // in a review's batch, and the good call of that review waited for its whole loop.
    const two = new SandboxPool(2);
    try {
      const lim = (ms: number) => ({ limits: { ...DEFAULT_LIMITS, timeoutMs: ms } });
      const [a, b, h, numbers] = await Promise.all([
        load(two, 'spin', { ...lim(2000), name: 'spin-a2' }), load(two, 'spin', { ...lim(10_000), name: 'spin-b10' }),
        load(two, 'spin', { ...lim(4000), name: 'spin-h4' }), load(two, 'numbers', lim(6000)),
      ]);
      for (const p of [a, b, h]) expect((await evaluatePolicy(two, p, 'mutate', input({ object: {} }))).status).toBe('allowed');
      expect((await evaluatePolicy(two, numbers, 'validate', input({ object: { spec: { numbers: [1] } } }))).status).toBe('allowed');
      // Both workers held: h's call waits, so the relief loads h and answers it there.
      const held = [evaluatePolicy(two, a, 'validate', input()), evaluatePolicy(two, b, 'validate', input())];
      await new Promise((r) => setTimeout(r, 100));
      expect((await evaluatePolicy(two, h, 'mutate', input({ object: {} }))).status).toBe('allowed');
      expect(two.stats.workers).toBe(3);
      // a is stopped (2 s) and its worker reloaded: h's loop takes that worker (regular workers
      // are offered calls first), and h now holds the workers with b.
      expect(await held[0]).toMatchObject({ status: 'failed' });
      await new Promise((r) => setTimeout(r, 500));
      const first = evaluatePolicy(two, h, 'validate', input());
      await new Promise((r) => setTimeout(r, 700));
      const shared = input({ object: { spec: { numbers: [1] } } });
      const [good, second] = [evaluatePolicy(two, numbers, 'validate', shared), evaluatePolicy(two, h, 'validate', shared)];
      const answer = await good;
      expect(answer.status).toBe('allowed');
      // Before, h's call of the review ran on the relief (it held h), and numbers after its 4 s loop.
      expect(answer.totalMicros).toBeLessThan(2_000_000);
      for (const outcome of await Promise.all([first, second])) expect(outcome).toMatchObject({ status: 'failed', message: 'exceeded its 4s CPU deadline' });
      await Promise.all(held);
    } finally {
      await two.close();
    }
  }, 60_000);
});

describe('a relief worker that loads while it runs a long call', () => {
  it('is not retired for a slow load while the call runs: the call is answered', async () => {
    // Review helper: a load posted behind a long call counted toward the load deadline, and the
    // relief was retired mid-call, leaving that call with no answer at all.
    const two = new SandboxPool(2, { loadTimeoutMs: 2500 });
    try {
      const lim = (ms: number) => ({ limits: { ...DEFAULT_LIMITS, timeoutMs: ms } });
      const [a, b, numbers, probe] = await Promise.all([
        load(two, 'spin', { ...lim(7000), name: 'spin-a7' }), load(two, 'spin', { ...lim(7000), name: 'spin-b7' }),
        load(two, 'numbers', lim(6000)), load(two, 'spin', { ...lim(20_000), name: 'spin-probe', settings: { iterations: 1e6 } }),
      ]);
      // A legal call of about 4.5 s on this machine.
      await evaluatePolicy(two, probe, 'mutate', input({ object: {} }));
      const measured = await evaluatePolicy(two, probe, 'mutate', input({ object: {} }));
      const iterations = Math.round(1e6 * 4_500_000 / Math.max(1000, measured.guestMicros ?? 0));
      const long = await load(two, 'spin', { ...lim(20_000), name: 'spin-long', settings: { iterations } });
      // (Not `long`: a 4.5 s call would make it slow, and a slow policy never runs on a relief.)
      for (const p of [a, b]) expect((await evaluatePolicy(two, p, 'mutate', input({ object: {} }))).status).toBe('allowed');
      expect((await evaluatePolicy(two, numbers, 'validate', input({ object: { spec: { numbers: [1] } } }))).status).toBe('allowed');
      const held = [evaluatePolicy(two, a, 'validate', input()), evaluatePolicy(two, b, 'validate', input())];
      await new Promise((r) => setTimeout(r, 100));
      // The relief loads `long` and runs it; numbers, queued 1 s later, is loaded behind it.
      const slow = evaluatePolicy(two, long, 'mutate', input({ object: {} }));
      await new Promise((r) => setTimeout(r, 1000));
      const good = evaluatePolicy(two, numbers, 'validate', input({ object: { spec: { numbers: [1] } } }));
      const answered = await Promise.race([slow, new Promise((r) => setTimeout(() => r('no answer in 12 s'), 12_000))]);
      expect(answered).toMatchObject({ status: 'allowed' });
      // Answered either way: on the relief after `long`, or past its deadline while every worker was held.
      expect(['allowed', 'failed']).toContain((await good).status);
      await Promise.all(held);
    } finally {
      await two.close();
    }
  }, 60_000);
});

describe('goDurationMs', () => {
  it.each([
    ['10s', 10_000], ['2.5s', 2500], ['1m30s', undefined], ['1m0s', 60_000], ['500ms', 500], ['30s', 30_000],
    ['abc', undefined], ['0s', undefined], ['10', undefined], [null, undefined], ['5h', undefined],
  ])('%s -> %s ms', (text, ms) => {
    expect(goDurationMs(text)).toBe(ms);
  });
});

describe('a relief worker, when the held worker also holds other policies\' calls behind its loop', () => {
  it('still runs those policies\' waiting calls', async () => {
    // Red team: a trusted policy looping in a batch with good calls. The good calls stuck behind
    // it counted as their policy's busy instances, so the relief worker started and ran nothing,
    // and every good call waited out the loop's deadline.
    const one = new SandboxPool(1);
    try {
      const spin = await load(one, 'spin', { limits: { ...DEFAULT_LIMITS, timeoutMs: 4000 } });
      const numbers = await load(one, 'numbers', { limits: { ...DEFAULT_LIMITS, timeoutMs: 10_000 } });
      // Trusted and quick, so its calls share messages: answered reviews, each well under 1 ms.
      for (let i = 0; i < 20; i++) expect((await evaluatePolicy(one, spin, 'mutate', input({ object: {} }))).status).toBe('allowed');
      const ok = () => input({ object: { spec: { numbers: [1] } } });
      expect((await evaluatePolicy(one, numbers, 'validate', ok())).status).toBe('allowed');
      // One review both policies judge: one message, the loop first.
      const review = ok();
      const held = Promise.all([evaluatePolicy(one, spin, 'validate', review), evaluatePolicy(one, numbers, 'validate', review)]);
      let loopEnded = false;
      void held.then(() => { loopEnded = true; });
      await new Promise((r) => setTimeout(r, 50));
      expect(one.stats.queued).toBe(0);
      const answers = await Promise.all(Array.from({ length: 3 }, () => evaluatePolicy(one, numbers, 'validate', ok())));
      expect(answers.map((a) => a.status)).toEqual(['allowed', 'allowed', 'allowed']);
      // On the relief worker, before the loop's 4 s deadline (before: after it).
      expect(loopEnded).toBe(false);
      expect(one.stats.workers).toBe(2);
      const [loop, stuck] = await held;
      expect(loop).toMatchObject({ status: 'failed', message: 'exceeded its 4s CPU deadline' });
      expect(stuck.status).toBe('allowed'); // put back in line when its worker was replaced
    } finally {
      await one.close();
    }
  }, 30_000);
});

describe('a policy slow to instantiate', () => {
  // Red team: a start function of ~5 s beside a looping policy. One worker reloaded it after the
  // loop was stopped, the other was held by the next loop: no relief came (a loading worker
  // counted as about to be free), and good calls failed waiting. A relief that loaded the slow
  // policy too would take calls only after it.
  let dir: string;
  /** A module whose start function takes about 3 s on this machine (measured on a small one first). */
  let slowFile: string;
  /** Millions of loop turns a start function spins in a second here. */
  let perSecond: number;
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'portcullis-slow-start-'));
    const one = new SandboxPool(1);
    try {
      // Two probes: the difference leaves out what instantiating costs besides the loop (review
      // helper: one probe of 100 million turns made the "3 s" module load in 1.4 s).
      // (A first, tiny one takes what a worker's first load costs once.)
      const times: number[] = [];
      for (const millions of [1, 100, 600]) {
        const file = join(dir, `probe-${millions}.wasm`);
        await writeFile(file, await slowStart(millions));
        times.push(one.loadTimeOf((await load(one, `probe-${millions}`, { module: file })).key)!);
      }
      perSecond = 500 * 1000 / Math.max(10, times[2]! - times[1]!);
      slowFile = join(dir, 'slow.wasm');
      await writeFile(slowFile, await slowStart(3 * perSecond));
    } finally {
      await one.close();
    }
  }, 30_000);
  afterAll(() => rm(dir, { recursive: true, force: true }));
  const lim = (ms: number) => ({ limits: { ...DEFAULT_LIMITS, timeoutMs: ms } });
  const ok = () => input({ object: { spec: { numbers: [1] } } });

  it('makes no other first load time out behind it: a load\'s deadline runs from its turn in the worker', async () => {
    // A worker loads one policy at a time. Timed from when they were posted, the second of two
    // 2 s start functions (a 3 s load deadline) was dropped as hanging after waiting 2 s for the
    // first. Four of 1 s each: the last waits 3 s, and each alone has three times its time (two
    // of 2 s failed beside two busy processes, their starts slowed past 3 s).
    const two = new SandboxPool(2, { loadTimeoutMs: 3000 });
    try {
      const files = await Promise.all(['a', 'b', 'c', 'd'].map(async (name, i) => {
        const file = join(dir, `four-${name}.wasm`);
        await writeFile(file, await slowStart(perSecond + i)); // different modules, different sandboxes
        return file;
      }));
      const policies = await Promise.all(files.map((file, i) => load(two, `slow-${i}`, { module: file })));
      for (const policy of policies) {
        expect(two.loadTimeOf(policy.key)).toBeGreaterThan(500);
        expect((await evaluatePolicy(two, policy, 'validate', ok())).status).toBe('allowed');
      }
    } finally {
      await two.close();
    }
  }, 60_000);

  it('makes a worker reloading it count as held: the relief worker runs the others\' calls', async () => {
    const two = new SandboxPool(2);
    try {
      const [slow, spinA, spinB, numbers] = await Promise.all([
        load(two, 'slow', { module: slowFile }),
        load(two, 'spin', { ...lim(1000), name: 'spin-a1' }), load(two, 'spin', { ...lim(8000), name: 'spin-b8' }),
        // Its deadline is not the bound here (the relief worker's own first load of it took 1.96 s
        // in a clean-clone CI run, more beside two busy processes): waiting for slow's load is.
        load(two, 'numbers', lim(7000)),
      ]);
      expect(two.loadTimeOf(slow.key)).toBeGreaterThan(Math.max(SLOW_LOAD_MS, 1500));
      for (const policy of [spinA, spinB]) expect((await evaluatePolicy(two, policy, 'mutate', input({ object: {} }))).status).toBe('allowed');
      expect((await evaluatePolicy(two, numbers, 'validate', ok())).status).toBe('allowed');
      // spin-a loops in one worker for 1 s and is stopped: its replacement reloads every policy,
      // slow's start function included. spin-b loops in the other for 8 s.
      const stopped = evaluatePolicy(two, spinA, 'validate', input());
      const held = evaluatePolicy(two, spinB, 'validate', input());
      expect(await stopped).toMatchObject({ status: 'failed', message: 'exceeded its 1s CPU deadline' });
      await new Promise((r) => setTimeout(r, 100));
      const started = performance.now();
      const answers = await Promise.all([1, 2, 3].map(() => evaluatePolicy(two, numbers, 'validate', ok())));
      expect(answers.map((a) => a.status)).toEqual(['allowed', 'allowed', 'allowed']);
      // On the relief worker (before: it waited for the reload, slow's start included). Bounded by slow's
      // own load, not a fixed 1.5 s: a relief worker's first load of numbers took 1.96 s in a
      // clean-clone CI run with test files side by side on 2 cores; slow's load slows as much.
      expect(performance.now() - started).toBeLessThan(two.loadTimeOf(slow.key)!);
      expect(two.stats.workers).toBe(3);
      expect(await held).toMatchObject({ status: 'failed', message: 'exceeded its 8s CPU deadline' });
      // slow still answers, from a regular worker.
      expect((await evaluatePolicy(two, slow, 'validate', ok())).status).toBe('allowed');
    } finally {
      await two.close();
    }
  }, 60_000);

  it('is never loaded into a relief worker, which would take calls only once it had', async () => {
    const two = new SandboxPool(2);
    try {
      const [slow, spinA, spinB, numbers] = await Promise.all([
        load(two, 'slow', { ...lim(6000), module: slowFile }),
        load(two, 'spin', { ...lim(6000), name: 'spin-a6' }), load(two, 'spin', { ...lim(6000), name: 'spin-b6' }),
        load(two, 'numbers', lim(2000)),
      ]);
      for (const policy of [spinA, spinB]) expect((await evaluatePolicy(two, policy, 'mutate', input({ object: {} }))).status).toBe('allowed');
      for (const policy of [numbers, slow]) expect((await evaluatePolicy(two, policy, 'validate', ok())).status).toBe('allowed');
      // Both workers loop for 6 s; a review that slow and numbers both judge waits.
      const held = [spinA, spinB].map((policy) => evaluatePolicy(two, policy, 'validate', input()));
      await new Promise((r) => setTimeout(r, 100));
      const review = ok();
      const started = performance.now();
      const [good, late] = [evaluatePolicy(two, numbers, 'validate', review), evaluatePolicy(two, slow, 'validate', review)];
      expect((await good).status).toBe('allowed');
      // Before: the relief loaded slow too (3 s), and numbers waited out its 2 s deadline. The
      // bound is slow's own load, which a busy machine stretches as it stretches numbers' load.
      expect(performance.now() - started).toBeLessThan(two.loadTimeOf(slow.key)!);
      expect(two.stats.workers).toBe(3);
      // slow waits for a regular worker: both reload it once their loops are stopped, so its
      // call fails, per its own failurePolicy; only its own calls pay for its start function.
      expect(await late).toMatchObject({ status: 'failed', failure: 'temporary', message: expect.stringMatching(/past its 6s deadline; not started$/) });
      for (const outcome of await Promise.all(held)) expect(outcome).toMatchObject({ status: 'failed', message: 'exceeded its 6s CPU deadline' });
    } finally {
      await two.close();
    }
  }, 60_000);
});
