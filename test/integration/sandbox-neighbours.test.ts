// Neighbours under attack: benign policies keep answering correctly, and promptly, while
// hostile ones hit their CPU deadline, their memory cap and trap over and over, concurrently.
// This is the README's promise ("other policies and later requests are not affected") tested
// the way an attacker would break it: the workers are being replaced all the time.
import { afterAll, beforeAll, expect, it } from 'vitest';
import { evaluatePolicy, sharedInput } from '../../host/src/evaluate/evaluate.ts';
import type { LoadedPolicy } from '../../host/src/policy/loaded.ts';
import { SandboxPool } from '../../host/src/sandbox/pool.ts';
import { DEFAULT_LIMITS } from '../../host/src/config/limits.ts';
import { input, load } from '../helpers/policies.ts';

let pool: SandboxPool;
let numbers: LoadedPolicy;
let noDelete: LoadedPolicy;
let hostile: LoadedPolicy[];

beforeAll(async () => {
  pool = new SandboxPool(2);
  const fast = { limits: { ...DEFAULT_LIMITS, timeoutMs: 300 } };
  // The benign deadline is generous so that a slow or shared machine (CI beside other jobs)
  // cannot turn queueing into a failure: what must never happen is a wrong answer.
  const patient = { limits: { ...DEFAULT_LIMITS, timeoutMs: 10_000 } };
  [numbers, noDelete, ...hostile] = await Promise.all([
    load(pool, 'numbers', patient), load(pool, 'no-delete', patient),
    load(pool, 'spin', fast), load(pool, 'memory-bomb', fast), load(pool, 'as-memory-bomb', fast), load(pool, 'trap', fast),
  ]);
}, 120_000);
afterAll(() => pool.close());

/** Calls, 50 ms apart, of a benign policy that denies what it is given: each answer, a failure by its message. */
async function benignRound(on: SandboxPool, benign: LoadedPolicy, count = 10): Promise<string[]> {
  const answers: string[] = [];
  for (let i = 0; i < count; i++) {
    const outcome = await evaluatePolicy(on, benign, 'validate', input({ object: { spec: { numbers: [500] } } }));
    answers.push(outcome.status === 'failed' ? outcome.message : outcome.status);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  return answers;
}

it('answers every benign call correctly while four attackers keep the workers dying, without starving them', async () => {
  let attacking = true;
  const attacks = { calls: 0, failed: 0 };
  const attackers = [0, 1, 2, 3].map(async (n) => {
    while (attacking) {
      const policy = hostile[n % hostile.length]!;
      const outcome = await evaluatePolicy(pool, policy, 'validate', input({ object: { spec: { numbers: [1] } } }));
      attacks.calls++;
      if (outcome.status === 'failed') attacks.failed++;
      // A server gets each review from the network. Here, calls the pool sheds are answered at
      // once, and a loop of them without a turn of the event loop would starve the very timers
      // that stop the spinning calls (it hung this test: 26 million shed calls, no restart).
      await new Promise((resolve) => setImmediate(resolve));
    }
  });
  const latencies: number[] = [];
  const wrong: string[] = [];
  const restarts = pool.stats.restarts;
  const until = performance.now() + 60_000;
  try {
    // At least 60 rounds, and on until workers were replaced a few times: the benign calls no
    // longer wait for the attackers' workers, so 60 rounds can end before many attacks did.
    for (let i = 0; i < 60 || (pool.stats.restarts - restarts <= 3 && performance.now() < until); i++) {
      const started = performance.now();
      const deny = i % 2 === 1;
      const [a, b] = await Promise.all([
        evaluatePolicy(pool, numbers, 'validate', input({ object: { spec: { numbers: deny ? [500] : [5] } } })),
        evaluatePolicy(pool, noDelete, 'validate', input({
          operation: 'DELETE', name: 'x', object: null,
          oldObject: { metadata: { name: 'x', labels: deny ? { 'portcullis.dev/no-delete': 'true' } : {} } },
        })),
      ]);
      latencies.push(performance.now() - started);
      if (a.status !== (deny ? 'denied' : 'allowed')) wrong.push(`numbers #${i}: ${JSON.stringify(a)}`);
      if (b.status !== (deny ? 'denied' : 'allowed')) wrong.push(`no-delete #${i}: ${JSON.stringify(b)}`);
    }
  } finally {
    attacking = false;
    await Promise.all(attackers);
  }
  // The attack really happened: hostile calls kept failing and workers kept being replaced.
  expect(attacks.failed).toBeGreaterThan(10);
  expect(pool.stats.restarts).toBeGreaterThan(3);
  expect(wrong).toEqual([]);
  latencies.sort((x, y) => x - y);
  const p99 = latencies[Math.floor(latencies.length * 0.99)]!;
  process.stdout.write(`benign under attack: p50 ${Math.round(latencies[latencies.length >> 1]!)} ms, p99 ${Math.round(p99)} ms, ` +
    `${attacks.calls} hostile calls, ${pool.stats.restarts} worker restarts\n`);
  // Round-robin between policies: a benign call waits for a few 300 ms attacks, not for all of
  // them. (On an idle 2-core machine p99 is about 0.4 s; bench/ measures latency, not this.)
  expect(p99).toBeLessThan(8000);
}, 180_000);

it('a policy stopped at its deadline never holds every worker again: three such calls at once leave a worker to the others', async () => {
  // Red team: three calls of a looping policy at once took both workers, and every other
  // policy's call in the next deadline waited it out or was refused as overload. The benign
  // deadline here is shorter than the looping one: waiting behind it fails the benign call.
  const looping = await load(pool, 'loops-again', { file: 'spin', limits: { ...DEFAULT_LIMITS, timeoutMs: 1500 } });
  const benign = await load(pool, 'numbers-prompt', { file: 'numbers', limits: { ...DEFAULT_LIMITS, timeoutMs: 400 } });
  const restarts = pool.stats.restarts;
  expect(await evaluatePolicy(pool, looping, 'validate', input())).toMatchObject({ status: 'failed', failure: 'temporary' });
  const loops = [1, 2, 3].map(() => evaluatePolicy(pool, looping, 'validate', input()));
  expect(await benignRound(pool, benign)).toEqual(Array(10).fill('denied'));
  const outcomes = await Promise.all(loops);
  // One runs to its deadline on the one worker it may take; the others wait for it, past theirs.
  expect(outcomes.map((o) => o.status === 'failed' && o.message.replace(/\d+ ms/, 'N ms'))).toEqual([
    'exceeded its 1.5s CPU deadline',
    'waited N ms for a sandbox, past its 1.5s deadline; not started',
    'waited N ms for a sandbox, past its 1.5s deadline; not started',
  ]);
  expect(pool.stats.restarts).toBe(restarts + 2);
}, 60_000);

it('a policy none of whose reviews has answered yet takes at most all workers but one: a looping one\'s first burst leaves a worker to the others', async () => {
  // It loads and answers `metadata` like any policy; only its reviews loop. Before, its first
  // three calls at once held both workers for a whole deadline.
  const looping = await load(pool, 'loops-from-the-start', { file: 'spin', limits: { ...DEFAULT_LIMITS, timeoutMs: 1500 } });
  const benign = await load(pool, 'numbers-first', { file: 'numbers', limits: { ...DEFAULT_LIMITS, timeoutMs: 400 } });
  const loops = [1, 2, 3].map(() => evaluatePolicy(pool, looping, 'validate', input()));
  expect(await benignRound(pool, benign)).toEqual(Array(10).fill('denied'));
  expect((await Promise.all(loops)).map((o) => o.status)).toEqual(['failed', 'failed', 'failed']);
}, 60_000);

it('a policy stopped at its deadline stays held to all workers but one after it answers again: answering once between bursts of loops does not free it', async () => {
  // Red team (alternating): `mutate` answers, `validate` loops. Before, one answer cleared the
  // policy, and its next three loops at once held both workers for a whole deadline, each time.
  const looping = await load(pool, 'loops-alternately', { file: 'spin', limits: { ...DEFAULT_LIMITS, timeoutMs: 1500 } });
  const benign = await load(pool, 'numbers-alternately', { file: 'numbers', limits: { ...DEFAULT_LIMITS, timeoutMs: 400 } });
  expect(await evaluatePolicy(pool, looping, 'mutate', input())).toMatchObject({ status: 'allowed' });
  expect(await evaluatePolicy(pool, looping, 'validate', input())).toMatchObject({ status: 'failed', failure: 'temporary' });
  // It answers again once its worker is replaced. A policy on probation takes no worker that is
  // the last free one, so this call waits for the replacement to reload this file's policies: on
  // a busy machine, past the call's deadline (it is then refused, not started; a test run beside
  // two busy processes).
  const answersBy = performance.now() + 15_000;
  let answer = await evaluatePolicy(pool, looping, 'mutate', input());
  while (performance.now() < answersBy && answer.status === 'failed' && /past its 1\.5s deadline; not started$/.test(answer.message)) {
    answer = await evaluatePolicy(pool, looping, 'mutate', input());
  }
  expect(answer).toMatchObject({ status: 'allowed' });
  const loops = [1, 2, 3].map(() => evaluatePolicy(pool, looping, 'validate', input()));
  expect(await benignRound(pool, benign)).toEqual(Array(10).fill('denied'));
  expect((await Promise.all(loops)).map((o) => o.status)).toEqual(['failed', 'failed', 'failed']);
}, 60_000);

it('the probation ends, and one that starts again after it lasts twice as long', async () => {
  // A relief worker goes 200 ms after it is no longer needed: gone before the next burst. The
  // second probation (6 s) outlasts the pause and the next burst by seconds: with 1.5 s (3 s), a
  // busy machine ended it during that burst (beside two busy processes).
  const own = new SandboxPool(2, { probationMs: 3000, reliefIdleMs: 200 });
  try {
    // The benign deadline is under the loop's, so a benign call that waited out a loop fails;
    // with room for a busy machine (at 250 ms and 500 ms, CI failed it 1 run in 3 under load).
    const looping = await load(own, 'loops-twice', { file: 'spin', limits: { ...DEFAULT_LIMITS, timeoutMs: 1500 } });
    const benign = await load(own, 'numbers-twice', { file: 'numbers', limits: { ...DEFAULT_LIMITS, timeoutMs: 600 } });
    // A burst that holds both workers gets a relief worker for the others (pool.ts #relieve):
    // how many workers there were at most says whether it held both.
    const burst = async (): Promise<{ answers: string[]; workers: number }> => {
      let workers = 0;
      const sampler = setInterval(() => { workers = Math.max(workers, own.stats.workers); }, 10);
      const loops = [1, 2, 3].map(() => evaluatePolicy(own, looping, 'validate', input()));
      const answers = await benignRound(own, benign);
      await Promise.all(loops);
      clearInterval(sampler);
      return { answers, workers };
    };
    const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
    expect(await evaluatePolicy(own, looping, 'mutate', input())).toMatchObject({ status: 'allowed' });
    expect(await evaluatePolicy(own, looping, 'validate', input())).toMatchObject({ status: 'failed' });
    // 3 s later the first probation is over: answering frees it, and its next burst holds
    // both workers for a deadline again (what the probation prevents while it lasts).
    await pause(3300);
    expect(await evaluatePolicy(own, looping, 'mutate', input())).toMatchObject({ status: 'allowed' });
    expect((await burst()).workers).toBe(3);
    // That burst was a second strike: 6 s, so 1.7 s later it still holds.
    await pause(1700);
    expect(await evaluatePolicy(own, looping, 'mutate', input())).toMatchObject({ status: 'allowed' });
    expect(await burst()).toEqual({ answers: Array(10).fill('denied'), workers: 2 });
  } finally {
    await own.close();
  }
}, 60_000);

it('a policy that is slow but within its deadline never holds every worker, nor gets other policies refused as overloaded', async () => {
  // Red team: ~1.5 s calls (deadline 2 s, never stopped), three at once, took both workers and
  // their queued work counted as overload against everyone: every other policy's call was refused.
  const limits = { ...DEFAULT_LIMITS, timeoutMs: 3000 };
  const benign = await load(pool, 'numbers-beside-slow', { file: 'numbers', limits: { ...DEFAULT_LIMITS, timeoutMs: 400 } });
  // Calibrate to about 0.6 s a call on this machine (a tenth of the deadline makes it slow).
  const prober = await load(pool, 'slow-probe', { file: 'spin', limits, settings: { iterations: 1e6 } });
  await evaluatePolicy(pool, prober, 'mutate', input()); // the first call also compiles
  // The fastest of three probes: one slowed by a busy machine made the calls shorter than 0.3 s
  // (the check at the end), once in a full run.
  const probes: number[] = [];
  for (let i = 0; i < 3; i++) {
    const probe = await evaluatePolicy(pool, prober, 'mutate', input());
    expect(probe.status).toBe('allowed');
    probes.push(probe.guestMicros ?? 0);
  }
  const iterations = Math.round(1e6 * 600_000 / Math.max(1000, Math.min(...probes)));
  const slow = await load(pool, 'slow-but-within', { file: 'spin', limits, settings: { iterations } });
  expect(await evaluatePolicy(pool, slow, 'mutate', input())).toMatchObject({ status: 'allowed' });
  // More than the workers, fewer than the deadline holds in one (a slow policy keeps to one worker).
  const slowCalls = [1, 2, 3].map(() => evaluatePolicy(pool, slow, 'mutate', input()));
  expect(await benignRound(pool, benign)).toEqual(Array(10).fill('denied'));
  const done = await Promise.all(slowCalls);
  expect(done.map((o) => o.status)).toEqual(['allowed', 'allowed', 'allowed']);
  // It really was slow: over a tenth of its deadline a call.
  expect(Math.min(...done.map((o) => o.guestMicros ?? 0))).toBeGreaterThan(300_000);
}, 60_000);

it('a costly policy\'s queue gets its own calls refused as overload, not other policies\'', async () => {
  // Red team: a policy costing ~0.1 s a call (under the slow mark), 50 reviews at once: its
  // queued work counted against every policy, and reviews it did not even match were refused.
  const limits = { ...DEFAULT_LIMITS, timeoutMs: 2000 };
  const prober = await load(pool, 'costly-probe', { file: 'spin', limits, settings: { iterations: 1e6 } });
  await evaluatePolicy(pool, prober, 'mutate', input()); // the first call also compiles
  const probe = await evaluatePolicy(pool, prober, 'mutate', input());
  const iterations = Math.round(1e6 * 100_000 / Math.max(1000, probe.guestMicros ?? 0));
  const costly = await load(pool, 'costly', { file: 'spin', limits, settings: { iterations } });
  // A shorter deadline than the costly one's: the queue it keeps (up to a quarter of its 2 s
  // per worker) is past a quarter of this one's, so counted whole it refused every call.
  const benign = await load(pool, 'numbers-beside-costly', { file: 'numbers', limits: { ...DEFAULT_LIMITS, timeoutMs: 1500 } });
  expect(await evaluatePolicy(pool, costly, 'mutate', input())).toMatchObject({ status: 'allowed' });
  expect(await benignRound(pool, benign, 1)).toEqual(['denied']);
  let flooding = true;
  const refusedOwn: string[] = [];
  // 30 callers that each send again as soon as answered (as the apiserver's connections would).
  const flood = Array.from({ length: 30 }, async () => {
    while (flooding) {
      const outcome = await evaluatePolicy(pool, costly, 'mutate', input());
      if (outcome.status === 'failed') refusedOwn.push(outcome.message);
      await new Promise((resolve) => setImmediate(resolve));
    }
  });
  try {
    // Idle for longer than any memory of its own waits: it is judged by quick calls' waits, not
    // by the costly policy's (review helper: 10 of 10 refused after 2.5 s idle).
    await new Promise((resolve) => setTimeout(resolve, 2500));
    expect(await benignRound(pool, benign)).toEqual(Array(10).fill('denied'));
  } finally {
    flooding = false;
    await Promise.all(flood);
  }
  // The costly policy's own overload is its own: its calls past its share were refused.
  // Refused as it was queued, or, on a machine slower than the costs it learnt, when its wait ran
  // out (a full run beside two apiservers: "waited 2090 ms for a sandbox, past its 2s deadline;
  // not started"): either way never started.
  expect(refusedOwn.length).toBeGreaterThan(0);
  for (const message of refusedOwn) expect(message).toMatch(/^not started: the sandboxes are overloaded|; not started$/);
}, 60_000);

it('a policy is costly over 10 ms a call and normal again only under 5 ms, so a cost between the marks does not flip it', async () => {
  // Costly changes how its calls are batched and judged under overload (previous test); one
  // flipping at a single mark moved its backlog between the classes on every call.
  const limits = { ...DEFAULT_LIMITS, timeoutMs: 5000 };
  const policy = await load(pool, 'standing', { file: 'spin', limits, settings: { iterations: 1e6 } });
  expect(pool.standing(policy.key)).toBe('untried');
  await evaluatePolicy(pool, policy, 'mutate', input()); // the first call also compiles
  // The fastest of three probes: one slowed by a busy machine would make the 7.5 ms calls shorter.
  const probes = [];
  for (let i = 0; i < 3; i++) probes.push((await evaluatePolicy(pool, policy, 'mutate', input())).guestMicros ?? 1000);
  let perMs = 1e6 / Math.max(1, Math.min(...probes) / 1000);
  /** One call spinning about `ms` of guest time (the iterations given as its settings); the standing after it. */
  const spend = async (ms: number) => {
    const { envelope } = sharedInput(input(), policy);
    const iterations = Math.round(ms * perMs);
    const reply = await pool.call(policy.key, 'mutate', { envelope, settings: JSON.stringify({ iterations }) }, limits.timeoutMs);
    expect(reply.ok).toBe(true);
    return { standing: pool.standing(policy.key), perMs: reply.ok ? iterations / Math.max(1, reply.guestMicros / 1000) : perMs };
  };
  const standings = { over: [] as string[], between: [] as string[], under: [] as string[] };
  const rates: number[] = [];
  for (let i = 0; i < 4; i++) {
    const { standing, perMs: rate } = await spend(40);
    standings.over.push(standing);
    rates.push(rate);
  }
  // Measured again on calls of 40 ms: the loop runs faster once the engine has optimized it (a
  // CI run's "7.5 ms" calls took under 5 ms, and the policy was normal again at the first short call).
  perMs = Math.max(...rates);
  for (let i = 0; i < 12; i++) standings.between.push((await spend(7.5)).standing);
  for (let i = 0; i < 12; i++) standings.under.push((await spend(0.5)).standing);
  expect(standings.over.at(-1)).toBe('costly');
  expect(standings.between).toEqual(Array(12).fill('costly'));
  expect(standings.under.at(-1)).toBe('normal');
  // Its calls' cost is a moving average: back under 5 ms after a few calls, not the first.
  expect(standings.under[0]).toBe('costly');
  // A call stopped at its deadline: distrusted for a while (fewer workers, not waited behind).
  const looping = await load(pool, 'standing-loops', { file: 'spin', limits: { ...DEFAULT_LIMITS, timeoutMs: 300 } });
  expect(await evaluatePolicy(pool, looping, 'mutate', input())).toMatchObject({ status: 'allowed' });
  expect(pool.standing(looping.key)).toBe('normal');
  const stopped = await evaluatePolicy(pool, looping, 'validate', input());
  expect(stopped).toMatchObject({ status: 'failed', message: expect.stringMatching(/deadline/) });
  expect(pool.standing(looping.key)).toBe('distrusted');
}, 60_000);

it('two looping policies on probation together leave a worker to the others, not one each', async () => {
  const loops = await Promise.all(['a', 'b'].map((n) => load(pool, `loops-together-${n}`, { file: 'spin', limits: { ...DEFAULT_LIMITS, timeoutMs: 1500 } })));
  const benign = await load(pool, 'numbers-together', { file: 'numbers', limits: { ...DEFAULT_LIMITS, timeoutMs: 400 } });
  for (const looping of loops) {
    expect(await evaluatePolicy(pool, looping, 'mutate', input())).toMatchObject({ status: 'allowed' });
    expect(await evaluatePolicy(pool, looping, 'validate', input())).toMatchObject({ status: 'failed' });
    expect(await evaluatePolicy(pool, looping, 'mutate', input())).toMatchObject({ status: 'allowed' });
  }
  const running = loops.flatMap((looping) => [1, 2].map(() => evaluatePolicy(pool, looping, 'validate', input())));
  expect(await benignRound(pool, benign)).toEqual(Array(10).fill('denied'));
  expect((await Promise.all(running)).map((o) => o.status)).toEqual(Array(4).fill('failed'));
}, 60_000);

it('a policy with an idle worker of its own is never refused as overloaded by calls that wait for another worker', async () => {
  // Red team: with each policy in one worker, the calls queued for a held worker waited
  // seconds, and that wait got the calls of policies in the other, idle, worker refused as
  // overload. Here a long call (well within its deadline) holds the other worker while a
  // policy placed only there queues a burst behind it.
  const own = new SandboxPool(2);
  try {
    own.plan(5, 1);
    const patient = { ...DEFAULT_LIMITS, timeoutMs: 20_000 };
    // Placed in turn: workers 0, 1, 0, 1, 0.
    const prober = await load(own, 'long-calls', { file: 'spin', limits: patient, settings: { iterations: 1e6 } });
    const elsewhere = await load(own, 'numbers-elsewhere', { file: 'numbers', limits: { ...DEFAULT_LIMITS, timeoutMs: 400 } });
    await evaluatePolicy(own, prober, 'mutate', input());
    const probe = await evaluatePolicy(own, prober, 'mutate', input());
    const long = await load(own, 'long-calls-600ms', { file: 'spin', limits: patient, settings: { iterations: Math.round(1e6 * 600_000 / Math.max(1000, probe.guestMicros ?? 0)) } });
    await load(own, 'numbers-filler', { file: 'numbers' });
    const sharing = await load(own, 'numbers-bursts', { file: 'numbers', limits: patient });
    expect([prober, elsewhere, sharing, long].map((p) => own.instancesOf(p.key))).toEqual([1, 1, 1, 1]);
    await evaluatePolicy(own, sharing, 'validate', input());
    await evaluatePolicy(own, long, 'mutate', input());
    let attacking = true;
    const attack = (async () => {
      while (attacking) {
        await Promise.all([evaluatePolicy(own, long, 'mutate', input()), ...Array.from({ length: 2000 }, () => evaluatePolicy(own, sharing, 'validate', input()))]);
      }
    })();
    let answers: string[];
    try {
      answers = await benignRound(own, elsewhere, 40);
    } finally {
      attacking = false;
      await attack;
    }
    expect(answers).toEqual(Array(40).fill('denied'));
  } finally {
    await own.close();
  }
}, 60_000);

it('a policy that lived only in the worker where another was stopped gets a second worker, and answers while that one loops again', async () => {
  // Red team: past 32 policies each lives in one worker; one looping call at a time held up
  // every policy of its worker, and 58% of their calls failed.
  const own = new SandboxPool(2);
  try {
    own.plan(3, 1);
    const looping = await load(own, 'loops-beside', { file: 'spin', limits: { ...DEFAULT_LIMITS, timeoutMs: 800 } });
    await load(own, 'numbers-next-door', { file: 'numbers' });
    const sharing = await load(own, 'numbers-same-worker', { file: 'numbers', limits: { ...DEFAULT_LIMITS, timeoutMs: 400 } });
    expect([looping, sharing].map((p) => own.instancesOf(p.key))).toEqual([1, 1]);
    expect(await evaluatePolicy(own, looping, 'mutate', input())).toMatchObject({ status: 'allowed' });
    expect(await evaluatePolicy(own, looping, 'validate', input())).toMatchObject({ status: 'failed' });
    expect(own.instancesOf(sharing.key)).toBe(2);
    expect(own.instancesOf(looping.key)).toBe(1);
    const loops = [1, 2].map(() => evaluatePolicy(own, looping, 'validate', input()));
    expect(await benignRound(own, sharing)).toEqual(Array(10).fill('denied'));
    await Promise.all(loops);
  } finally {
    await own.close();
  }
}, 60_000);

it('a policy whose only worker is held by a long call gets a second worker then, not after a deadline', async () => {
  // Red team: with instancesPerPolicy 1, a new policy looping on its first call held its only
  // worker for its deadline; the good policies placed there failed waiting, the other worker idle.
  const own = new SandboxPool(2);
  try {
    own.plan(3, 1);
    // Placed in turn: workers 0, 1, 0. The looping one has answered nothing yet.
    const looping = await load(own, 'loops-first', { file: 'spin', limits: { ...DEFAULT_LIMITS, timeoutMs: 3000 } });
    await load(own, 'numbers-other-worker', { file: 'numbers' });
    // Its deadline is not the bound (spreading loads it in the other worker, slow beside other
    // test files): being answered while the loop still runs is.
    const sharing = await load(own, 'numbers-held-worker', { file: 'numbers', limits: { ...DEFAULT_LIMITS, timeoutMs: 6000 } });
    const ok = () => input({ object: { spec: { numbers: [1] } } });
    expect((await evaluatePolicy(own, sharing, 'validate', ok())).status).toBe('allowed');
    expect([looping, sharing].map((p) => own.instancesOf(p.key))).toEqual([1, 1]);
    const loop = evaluatePolicy(own, looping, 'validate', input());
    let loopEnded = false;
    void loop.then(() => { loopEnded = true; });
    await new Promise((r) => setTimeout(r, 100));
    const answers = await Promise.all([1, 2, 3].map(() => evaluatePolicy(own, sharing, 'validate', ok())));
    expect(answers.map((a) => a.status)).toEqual(['allowed', 'allowed', 'allowed']);
    // Before: answered only after the 3 s loop (with a 2 s deadline: failed waiting for it).
    expect(loopEnded).toBe(false);
    expect(own.instancesOf(sharing.key)).toBe(2);
    expect(own.stats.workers).toBe(2); // another regular worker, not a relief one
    expect(await loop).toMatchObject({ status: 'failed', message: 'exceeded its 3s CPU deadline' });
    // The looping policy itself was not spread: it would hold the other worker too.
    expect(own.instancesOf(looping.key)).toBe(1);
  } finally {
    await own.close();
  }
}, 60_000);

it('policies spread from a held worker go one per worker per check, not all at once', async () => {
  // Review helper: 30 policies placed in a held worker moved into the other at once, and that
  // worker, taking no call while it loaded them, stalled its own policies' calls.
  const own = new SandboxPool(2);
  try {
    own.plan(12, 1);
    // Placed in turn: the looping one in worker 0, then numbers-1 in worker 1, numbers-2 in 0...
    const looping = await load(own, 'loops-beside-many', { file: 'spin', limits: { ...DEFAULT_LIMITS, timeoutMs: 4000 } });
    const policies = [];
    // Their deadlines are not the bound (five loads in turn into the other worker, slow beside
    // other test files): being spread one at a time is.
    for (let i = 1; i <= 10; i++) policies.push(await load(own, `numbers-${i}`, { file: 'numbers', limits: { ...DEFAULT_LIMITS, timeoutMs: 10_000 } }));
    const ok = () => input({ object: { spec: { numbers: [1] } } });
    for (const policy of policies) expect((await evaluatePolicy(own, policy, 'validate', ok())).status).toBe('allowed');
    const held = policies.filter((_, i) => i % 2 === 1); // numbers-2, -4, ...: worker 0's
    expect(held.map((p) => own.instancesOf(p.key))).toEqual([1, 1, 1, 1, 1]);
    const loop = evaluatePolicy(own, looping, 'validate', input());
    await new Promise((r) => setTimeout(r, 50));
    const answers = Promise.all(held.map((policy) => evaluatePolicy(own, policy, 'validate', ok())));
    const spread = () => held.filter((p) => own.instancesOf(p.key) === 2).length;
    await expect.poll(spread, { timeout: 3000, interval: 1 }).toBeGreaterThan(0);
    // The first check gave the free worker one of them (before: all five).
    expect(spread()).toBe(1);
    expect((await answers).map((a) => a.status)).toEqual(Array(5).fill('allowed'));
    expect(spread()).toBe(5);
    expect(await loop).toMatchObject({ status: 'failed', message: 'exceeded its 4s CPU deadline' });
  } finally {
    await own.close();
  }
}, 60_000);
