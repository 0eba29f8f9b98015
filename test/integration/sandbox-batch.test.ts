// Issue 14: the calls of one review travel to a worker in one message. Each call keeps its own
// deadline, and a hostile call in a batch costs its batch-mates a delay, never a wrong answer.
import { afterAll, beforeAll, expect, it } from 'vitest';
import { evaluatePolicy, sharedInput } from '../../host/src/evaluate/evaluate.ts';
import type { LoadedPolicy } from '../../host/src/policy/loaded.ts';
import { QUEUE_SHARE, SandboxPool } from '../../host/src/sandbox/pool.ts';
import { DEFAULT_LIMITS } from '../../host/src/config/limits.ts';
import { input, load, wasm } from '../helpers/policies.ts';
import { parseConfig } from '../../host/src/config/load.ts';
import { loadPolicySet } from '../../host/src/policy/policy-set.ts';

// One worker: every call of a review lands in the same batch.
let pool: SandboxPool;
let numbers: LoadedPolicy;
let noDelete: LoadedPolicy;
let spin: LoadedPolicy;

beforeAll(async () => {
  pool = new SandboxPool(1);
  [numbers, noDelete, spin] = await Promise.all([
    load(pool, 'numbers'), load(pool, 'no-delete'), load(pool, 'spin', { limits: { ...DEFAULT_LIMITS, timeoutMs: 400 } }),
  ]);
  // The pool predicts the work queued ahead of a call from each policy's past calls, starting
  // with its first, which compiles and warms up. Under a loaded CI run numbers' first call took
  // about 106 ms, so the spinning call queued behind it was refused as overload (over a quarter
  // of its 400 ms) before it could outlive its deadline. Warm calls bring the estimate down.
  for (let i = 0; i < 8; i++) {
    await Promise.all([numbers, noDelete].map((p) => evaluatePolicy(pool, p, 'validate', input({ object: { spec: { numbers: [1] } } }))));
  }
}, 60_000);
afterAll(() => pool.close());

const review = (policies: LoadedPolicy[], numbersInSpec: number[]) => {
  const shared = input({ object: { spec: { numbers: numbersInSpec } } });
  return Promise.all(policies.map((p) => evaluatePolicy(pool, p, 'validate', shared)));
};

it('answers every call of a batch, each with its own verdict', async () => {
  const [a, b] = await review([numbers, noDelete], [500]);
  expect(a).toMatchObject({ status: 'denied' });
  expect(b).toMatchObject({ status: 'allowed' });
});

it('a call that outlives its deadline fails alone: the calls before and after it in the batch are answered', async () => {
  const restarts = pool.stats.restarts;
  const started = performance.now();
  const [before, stuck, after] = await review([numbers, spin, noDelete], [1]);
  expect(stuck).toMatchObject({ status: 'failed', failure: 'temporary' });
  expect(stuck!.status === 'failed' && stuck!.message).toContain('exceeded its 400ms CPU deadline');
  expect(before).toMatchObject({ status: 'allowed' });
  expect(after).toMatchObject({ status: 'allowed' });
  expect(pool.stats.restarts).toBe(restarts + 1);
  // The deadline is the stuck call's own, not the batch's sum.
  expect(performance.now() - started).toBeLessThan(3000);
}, 20_000);

it('a quick call with a long deadline ahead of a spinning one does not lend it that deadline', async () => {
  // Found by the neighbours test under load: the batch's timer was set to its first call's
  // deadline, so a spinning call behind a patient one ran on for the patient one's 10 s.
  const patient = await load(pool, 'numbers', { name: 'numbers-patient', limits: { ...DEFAULT_LIMITS, timeoutMs: 10_000 } });
  const spinning = await load(pool, 'spin', { name: 'spin-fresh', limits: { ...DEFAULT_LIMITS, timeoutMs: 400 } });
  const started = performance.now();
  const [first, stuck] = await review([patient, spinning], [1]);
  expect(stuck).toMatchObject({ status: 'failed', failure: 'temporary' });
  expect(first).toMatchObject({ status: 'allowed' });
  expect(performance.now() - started).toBeLessThan(3000);
}, 30_000);

it('once it got a worker replaced, a policy runs alone: its neighbours are answered without waiting for it', async () => {
  const two = new SandboxPool(2);
  try {
    const policies = await Promise.all([
      load(two, 'spin', { limits: { ...DEFAULT_LIMITS, timeoutMs: 400 } }), load(two, 'numbers'), load(two, 'no-delete'),
    ]);
    const once = async () => {
      const shared = input({ object: { spec: { numbers: [1] } } });
      const started = performance.now();
      const answered: Record<string, number> = {};
      const outcomes = await Promise.all(policies.map((p) => evaluatePolicy(two, p, 'validate', shared).then((o) => {
        answered[p.name] = performance.now() - started;
        return o;
      })));
      expect(outcomes.map((o) => o.status)).toEqual(['failed', 'allowed', 'allowed']);
      return answered;
    };
    // The first time, spin shares a message with a neighbour, which waits for it and is answered after.
    await once();
    // (Once the replacement worker has loaded every policy: a fixed 2 s was not always enough.
    // Its loads are posted when it replaces the stopped one, before spin's answer.)
    expect(two.stats.loading).toBeGreaterThan(0);
    await expect.poll(() => two.stats.loading, { timeout: 20_000, interval: 50 }).toBe(0);
    // From then on it runs alone, and the neighbours do not wait for its deadline.
    const answered = await once();
    expect(answered.numbers).toBeLessThan(answered.spin! - 200);
    expect(answered['no-delete']).toBeLessThan(answered.spin! - 200);
  } finally {
    await two.close();
  }
}, 30_000);

it('a worker running a batch that holds a policy several times leaves the other worker free for that policy', async () => {
  // Found by the overload benchmark: the per-policy share counted calls, not workers, so one
  // batch holding a policy five times kept the idle worker from taking that policy's next call.
  const two = new SandboxPool(2);
  try {
    const lone = await load(two, 'numbers', { name: 'numbers-lone' });
    const small = () => input({ object: { spec: { numbers: [1] } } });
    // Warm in both workers, a few calls at a time: one by one they may all run in one worker (or the
    // inline lane), and the other worker's first call, which compiles as it runs, was slow enough on
    // a loaded CI machine that only 2 quick calls came back in time.
    for (let i = 0; i < 4; i++) await Promise.all(Array.from({ length: 4 }, () => evaluatePolicy(two, lone, 'validate', small())));
    for (let i = 0; i < 2; i++) await evaluatePolicy(two, lone, 'validate', small()); // its last cost is now a quick call's
    // A legitimately slow call (a long list), then nine quick ones, all queued in one turn: the
    // slow one's worker takes some of the quick ones with it; the other worker must take the rest.
    const started = performance.now();
    const slow = evaluatePolicy(two, lone, 'validate', input({ object: { spec: { numbers: Array<number>(300_000).fill(1) } } })).then((outcome) => {
      expect(outcome.status).toBe('allowed');
      return performance.now() - started;
    });
    const quick = await Promise.all(Array.from({ length: 9 }, async () => {
      const outcome = await evaluatePolicy(two, lone, 'validate', small());
      expect(outcome.status).toBe('allowed');
      return performance.now() - started;
    }));
    const slowMs = await slow;
    expect(slowMs).toBeGreaterThan(50);
    expect(quick.filter((ms) => ms < slowMs / 2).length).toBeGreaterThanOrEqual(3);
  } finally {
    await two.close();
  }
}, 30_000);

/** Runs `test` on a pool of one worker of its own, without the inline lane. */
async function withPool(test: (pool: SandboxPool) => Promise<void>): Promise<void> {
  const own = new SandboxPool(1, { inline: false });
  try {
    await test(own);
  } finally {
    await own.close();
  }
}

// A pool of its own without the inline lane: the lane makes its copy of a TypeScript policy in
// the background (seconds of CPU for compile trials the first time), which on 2 cores took the
// worker's time during the burst; the queue's arithmetic is what is tested here.
it('overloaded, it does not start the calls that could not start within their deadline, and runs the rest', () => withPool(overloaded), 20_000);

async function overloaded(pool: SandboxPool): Promise<void> {
  // A call of about a millisecond, so that a burst is more work than a 200 ms deadline holds
  // whatever this machine's speed, and the burst is made faster than it runs. With a 30 µs
  // policy it depended on the machine: 6,000 calls fitted in one deadline when a call took under
  // 33 µs (none refused), and made in one turn they took so long that few could still start.
  const quick = await load(pool, 'spin', { name: 'spin-200ms', settings: { iterations: 20_000 }, limits: { ...DEFAULT_LIMITS, timeoutMs: 200 } });
  const costs: number[] = [];
  for (let i = 0; i < 20; i++) costs.push((await evaluatePolicy(pool, quick, 'mutate', input({}))).guestMicros ?? 0); // its cost is now known
  const cost = Math.max(1, costs.sort((a, b) => a - b)[10]!);
  // Six deadlines' worth of calls, each its own review (one review's calls are judged together),
  // their envelopes made before the burst.
  const calls = Math.min(20_000, Math.max(1000, Math.round((6 * 200_000) / cost)));
  const inputs = Array.from({ length: calls }, () => input({}));
  for (const one of inputs) sharedInput(one, quick);
  const started = performance.now();
  // Each call made as review() makes it: pump() first, which hands the worker its next batch when
  // calls have waited a while (the pool dispatches at the end of the event loop's turn).
  const outcomes = await Promise.all(inputs.map((one) => {
    pool.pump();
    return evaluatePolicy(pool, quick, 'mutate', one);
  }));
  const shed = outcomes.filter((o) => o.status === 'failed' && o.message.includes('the sandboxes are overloaded'));
  const allowed = outcomes.filter((o) => o.status === 'allowed');
  const late = outcomes.filter((o) => o.status === 'failed' && !o.message.includes('the sandboxes are overloaded'));
  // Refused at once, or (not yet reliably: in some runs of this burst) answered as not started
  // when their deadline passed: either way most calls never ran, and none ran late.
  expect(shed.length + late.length, `${calls} calls of ${cost} µs`).toBeGreaterThan(calls / 2);
  // Some ran: how many fit in 200 ms depends on the cores other test files leave (run beside
  // sandbox-neighbours' looping policies, 1 and 9 of 1,000 did, where alone about a hundred do).
  expect(allowed.length, `${calls} calls of ${cost} µs`).toBeGreaterThan(0);
  // But the pool refused only what found a quarter of the deadline's work queued ahead: the calls
  // before that (about 50 ms / cost of them) were all queued, however loaded the machine, which
  // decides only how many of those then started in time (review: asking only that some ran, this
  // test passed a pool that refused all but a few). A quarter of them, for a cost misjudged 4×:
  // here, alone and beside two other test files, about as many as predicted were.
  const queued = Math.floor((QUEUE_SHARE * 200_000 * pool.size) / cost);
  expect(allowed.length + late.length, `${calls} calls of ${cost} µs, about ${queued} fit the queue`).toBeGreaterThanOrEqual(Math.max(1, Math.floor(queued / 4)));
  // A refused call never ran: it has no duration (metrics observe only calls that ran).
  expect(shed.every((o) => o.totalMicros === undefined)).toBe(true);
  expect(allowed.every((o) => o.totalMicros !== undefined && o.totalMicros > 0)).toBe(true);
  // The queue never held much more than a deadline's worth of work.
  expect(late.every((o) => o.status === 'failed' && o.failure === 'temporary')).toBe(true);
  expect(performance.now() - started).toBeLessThan(5000);
}

it('answers the late calls of a queue as not started and starts the right one among them', () => withPool(async (pool) => {
  // A pool of its own: how long the calls ahead waited in another test's queue is the pool's
  // memory, and refused these calls at once as overload instead of letting them expire.
  // Held long enough that the short calls expire before a relief worker comes (at 10% of its
  // deadline); loaded first, so that round-robin starts it first (loading calls each policy once).
  const slowSpin = await load(pool, 'spin', { name: 'spin-2s-first', limits: { ...DEFAULT_LIMITS, timeoutMs: 2000 } });
  const short = await load(pool, 'numbers', { name: 'numbers-100ms', limits: { ...DEFAULT_LIMITS, timeoutMs: 100 } });
  const longA = await load(pool, 'no-delete', { name: 'no-delete-5s-a', limits: { ...DEFAULT_LIMITS, timeoutMs: 5000 } });
  const longB = await load(pool, 'no-delete', { name: 'no-delete-5s-b', limits: { ...DEFAULT_LIMITS, timeoutMs: 5000 } });
  // What a call costs is learnt from its calls, the first (cold) one weighing most: warmed, so
  // that the short calls are not refused at once for a cold cost of the calls ahead (clean-clone
  // CI: "about 40 ms of work queued ahead") where this test wants them to expire in the queue.
  // Not the blocker: answered, it would be trusted and share a batch with the calls behind it,
  // which its worker's replacement then puts back in line to run (clean-clone CI: one allowed).
  for (let i = 0; i < 12; i++) {
    for (const p of [short, longB, longA]) await evaluatePolicy(pool, p, 'validate', input({ object: { spec: { numbers: [1] } } }));
  }
  // longA was served more recently than longB: round-robin then picks longB first.
  // The only worker spins until its 2 s deadline; meanwhile short calls expire in the queue around the long ones.
  const blocker = evaluatePolicy(pool, slowSpin, 'validate', input({}));
  const order = [short, longA, short, longB, short];
  const outcomes = await Promise.all(order.map((p) => evaluatePolicy(pool, p, 'validate', input({ object: { spec: { numbers: [1] } } }))));
  expect((await blocker).status).toBe('failed');
  outcomes.forEach((o, i) => {
    if (order[i] !== short) expect(o.status).toBe('allowed');
    // Expired in the queue, or refused as it was queued when the blocker's cold cost (its one
    // call at load) was counted ahead of it: either way not started.
    else expect(o).toMatchObject({ status: 'failed', failure: 'temporary', message: expect.stringMatching(/past its 100ms deadline; not started$|^not started: the sandboxes are overloaded/) as unknown });
  });
}), 20_000);

it('answers a queue of late calls longer than the scheduler looks at once, and runs what waits behind them', async () => {
  // Held long enough that the calls expire before a relief worker comes (at 10% of its deadline).
  // Loaded first: loading calls each policy once, and round-robin starts the one served longest ago.
  const slowSpin = await load(pool, 'spin', { name: 'spin-2s', limits: { ...DEFAULT_LIMITS, timeoutMs: 2000 } });
  const short = await load(pool, 'numbers', { name: 'numbers-100ms-many', limits: { ...DEFAULT_LIMITS, timeoutMs: 100 } });
  const long = await load(pool, 'no-delete', { name: 'no-delete-5s-behind', limits: { ...DEFAULT_LIMITS, timeoutMs: 5000 } });
  const blocker = evaluatePolicy(pool, slowSpin, 'validate', input({}));
  const shared = input({ object: { spec: { numbers: [1] } } });
  // Far more than one window (512) of calls that expire while the worker spins, then one that does not.
  const lates = Array.from({ length: 1200 }, () => evaluatePolicy(pool, short, 'validate', shared));
  const behind = evaluatePolicy(pool, long, 'validate', shared);
  expect((await blocker).status).toBe('failed');
  expect((await behind).status).toBe('allowed');
  const answers = await Promise.all(lates);
  expect(answers.filter((o) => !(o.status === 'failed' && o.message.includes('not started'))).slice(0, 3)).toEqual([]);
}, 20_000);

it('places each policy in fewer workers when many are loaded, and answers each from a worker that holds it', async () => {
  const placed = new SandboxPool(2);
  try {
    expect(placed.plan(3)).toBe(2);
    const everywhere = await load(placed, 'numbers', { name: 'numbers-everywhere' });
    expect(placed.instancesOf(everywhere.key)).toBe(2);
    expect(placed.plan(40)).toBe(1);
    const policies = await Promise.all(['a', 'b', 'c'].map((n) => load(placed, 'numbers', { name: `numbers-${n}` })));
    expect(policies.map((p) => placed.instancesOf(p.key))).toEqual([1, 1, 1]);
    for (let i = 0; i < 5; i++) {
      const shared = input({ object: { spec: { numbers: [i % 2 === 0 ? 1 : 500] } } });
      const outcomes = await Promise.all([everywhere, ...policies].map((p) => evaluatePolicy(placed, p, 'validate', shared)));
      expect(outcomes.map((o) => o.status)).toEqual(Array(4).fill(i % 2 === 0 ? 'allowed' : 'denied'));
    }
  } finally {
    await placed.close();
  }
}, 60_000);

it('instancesPerPolicy: 1 in the configuration puts each policy in one worker; every policy still answers', async () => {
  const placed = new SandboxPool(2);
  try {
    const config = parseConfig(`instancesPerPolicy: 1\npolicies:\n${['a', 'b', 'c'].map((n) => `  - { name: numbers-${n}, module: ${wasm('numbers')} }\n`).join('')}`, '/x/portcullis.yaml');
    expect(config.instancesPerPolicy).toBe(1);
    const set = await loadPolicySet(placed, config);
    const policies = set.entries.map((e) => e.loaded!);
    expect(policies.map((p) => placed.instancesOf(p.key))).toEqual([1, 1, 1]);
    const shared = input({ object: { spec: { numbers: [500] } } });
    const outcomes = await Promise.all(policies.map((p) => evaluatePolicy(placed, p, 'validate', shared)));
    expect(outcomes.map((o) => o.status)).toEqual(['denied', 'denied', 'denied']);
    expect(parseConfig('policies: []\n', '/x/p.yaml').instancesPerPolicy).toBe(0);
  } finally {
    await placed.close();
  }
}, 60_000);

it('refuses a call when the calls ahead already waited past its share of the deadline, even when the queued work looked small', async () => {
  // The queued-work estimate is each policy's last cost; a policy whose calls turn slow, or
  // workers that get less CPU than a core each (overload), make it far too small. How long the
  // calls last started had waited is the measure that cannot be wrong that way.
  const one = new SandboxPool(1);
  try {
    // A 10 s deadline: on a slow machine the sixth slow call waits for five others, longer than
    // the default 2 s a call may wait for a worker (it was refused there once, in CI).
    const numbersSlow = await load(one, 'numbers', { name: 'numbers-turns-slow', limits: { ...DEFAULT_LIMITS, timeoutMs: 10_000 } });
    const probe = await load(one, 'no-delete', { name: 'no-delete-200ms', limits: { ...DEFAULT_LIMITS, timeoutMs: 200 } });
    for (let i = 0; i < 5; i++) await evaluatePolicy(one, numbersSlow, 'validate', input({ object: { spec: { numbers: [1] } } })); // last cost: quick
    // Six reviews, each a legitimately slow call. The first goes alone; the other five queue
    // behind it, counted at the policy's last (quick) cost; then each goes alone, as slow.
    const slowReview = () => evaluatePolicy(one, numbersSlow, 'validate', input({ object: { spec: { numbers: Array<number>(600_000).fill(1) } } }));
    const slow = [slowReview()];
    await new Promise((resolve) => setTimeout(resolve, 10));
    slow.push(...Array.from({ length: 5 }, slowReview));
    await slow[0];
    const started = performance.now();
    await slow[1];
    // The third slow call has waited as long as two of them ran: more than 100 ms, the probe's share (50% of 200 ms).
    expect(performance.now() - started).toBeGreaterThan(50);
    const refused = await evaluatePolicy(one, probe, 'validate', input({}));
    expect(refused).toMatchObject({ status: 'failed', failure: 'temporary', message: expect.stringMatching(/the sandboxes are overloaded \(the calls ahead waited \d+ ms/) as unknown });
    expect((await Promise.all(slow)).every((o) => o.status === 'allowed')).toBe(true);
    // Once the queue has drained, calls are taken again.
    expect(await evaluatePolicy(one, probe, 'validate', input({}))).toMatchObject({ status: 'allowed' });
  } finally {
    await one.close();
  }
}, 60_000);

it('with a long queue (each worker given several batches at once), a worker replaced answers nothing wrongly', async () => {
  // Issue 14: under overload the main thread's turns grew to tens of ms, and workers waited idle
  // for it between batches; past two full batches of queue they now get up to MAX_BATCHES at
  // once. A spinning call among them gets its worker replaced: every other call of every batch
  // that worker held is run again elsewhere and answered for its own request.
  const two = new SandboxPool(2);
  try {
    // (A long deadline: this is not about refusing work.)
    const [numbers2, spinning] = await Promise.all([load(two, 'numbers', { name: 'numbers-deep', limits: { ...DEFAULT_LIMITS, timeoutMs: 30_000 } }), load(two, 'spin', { name: 'spin-deep', limits: { ...DEFAULT_LIMITS, timeoutMs: 1500 } })]);
    const restarts = two.stats.restarts;
    const wants = Array.from({ length: 1500 }, (_, i) => (i % 3 === 0 ? 'denied' : 'allowed'));
    const calls = wants.map((want, i) => {
      const outcome = evaluatePolicy(two, numbers2, 'validate', input({ object: { spec: { numbers: [want === 'denied' ? 500 : i % 7] } } }));
      return i === 300 ? [outcome, evaluatePolicy(two, spinning, 'validate', input({}))] : [outcome];
    }).flat();
    const outcomes = await Promise.all(calls);
    const stuck = outcomes.splice(301, 1)[0]!;
    expect(stuck).toMatchObject({ status: 'failed', failure: 'temporary', message: expect.stringContaining('exceeded its 1.5s CPU deadline') as unknown });
    const wrong = outcomes.flatMap((o, i) => (o.status === wants[i] ? [] : [{ i, ...o }]));
    expect(wrong).toEqual([]);
    expect(two.stats.restarts).toBe(restarts + 1);
  } finally {
    await two.close();
  }
}, 60_000);

it('a main thread too busy to turn its event loop still gets answers, and workers their next calls, through pump()', async () => {
  // Under overload the event loop runs hundreds of requests between two reads of the workers'
  // answers; pump() reads them from inside that work. Here no event loop turn happens at all:
  // the main thread only blocks, pumps and runs microtasks. A policy whose calls take a few ms
  // never shares a message, so the second review waits in the queue for the first one's answer.
  const probe = await load(pool, 'spin', { name: 'spin-pump-probe', settings: { iterations: 1_000_000 } });
  await evaluatePolicy(pool, probe, 'mutate', input());
  const timed = await evaluatePolicy(pool, probe, 'mutate', input());
  const iterations = Math.round((5000 / timed.guestMicros!) * 1_000_000);
  const slow = await load(pool, 'spin', { name: 'spin-pump', settings: { iterations } });
  await evaluatePolicy(pool, slow, 'mutate', input()); // its cost is known: it runs alone
  const outcomes: unknown[] = [];
  for (let i = 0; i < 2; i++) void evaluatePolicy(pool, slow, 'mutate', input()).then((o) => outcomes.push(o));
  await Promise.resolve();
  // Posted at the end of the event loop's turn, which never comes here: pump() posts the first
  // call once it has waited PUMP_DISPATCH_MS, and the second once the first has answered.
  expect(pool.stats.queued).toBe(2);
  const until = performance.now() + 10_000;
  const blocked = new Int32Array(new SharedArrayBuffer(4));
  while (outcomes.length < 2 && performance.now() < until) {
    Atomics.wait(blocked, 0, 0, 10);
    pool.pump();
    for (let i = 0; i < 20; i++) await Promise.resolve();
  }
  expect(outcomes).toEqual([expect.objectContaining({ status: 'allowed' }), expect.objectContaining({ status: 'allowed' })]);
}, 20_000);
