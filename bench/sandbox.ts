// Issue 3's microbenchmark, in process (no HTTP): policies loaded into a real SandboxPool and
// evaluated one call at a time against the benchmark Pod review. For each call the pool
// reports totalMicros (whole call, main thread) and the worker guestMicros (inside the guest);
// hop = total - guest is the dispatch, copy in and out, and the result message.
// Run by bench/run.ts as `node --expose-gc bench/sandbox.ts '{"quick":false}'`; prints JSON.
import { readFile } from 'node:fs/promises';
import { Worker } from 'node:worker_threads';
import type { AdmissionRequest, EvaluationInput } from '@portcullis/sdk';
import { evaluatePolicy, rawEnvelope } from '../host/src/evaluate/evaluate.ts';
import { rawRequestSpan, scanReview } from '../host/src/review/scan.ts';
import { merge } from '../host/src/merge/merge.ts';
import { loadPolicy } from '../host/src/policy/load.ts';
import type { LoadedPolicy } from '../host/src/policy/loaded.ts';
import { SandboxPool } from '../host/src/sandbox/pool.ts';
import { DEFAULT_LIMITS } from '../host/src/config/limits.ts';
import { percentiles, type Percentiles } from './load.ts';
import { copies, MIXED_10, modulePath, ONE_AS, ONE_TS, type BenchPolicy } from './policies.ts';
import { podReview } from './review.ts';

export interface SingleResult {
  policy: string;
  language: 'AS' | 'TS';
  iterations: number;
  rounds: number;
  /** Median guest time of each round: how much the machine moved during the run. */
  guestRoundMedians: number[];
  guestMicros: Percentiles;
  hopMicros: Percentiles;
  totalMicros: Percentiles;
  /** Around evaluatePolicy: also building the input's envelope and decoding the output on the main thread. */
  wallMicros: Percentiles;
  /** Of the measured calls, how many the inline lane answered in the main thread (no hop). */
  inline: number;
}

export interface SandboxResult {
  poolSize: number;
  single: SingleResult[];
  mixed10: { iterations: number; wallMicros: Percentiles; guestSumMicros: Percentiles; hopMicros: Percentiles };
  /** CPU seconds of this process (all threads). */
  cpuSec?: number;
  /**
   * The floor under the hop: an empty message to a bare worker thread and back (no pool, no
   * policy), µs. Two thread wake-ups; on a VM whose idle vCPUs halt, most of the hop.
   */
  bareRoundTripMicros?: Percentiles;
  /**
   * The same single calls one millisecond apart, as an idle host gets reviews: the main thread
   * sleeps between them (the inline lane may take AS calls then; back to back it does not,
   * since the main thread is busy). `inline`: how many of them the lane answered.
   */
  idle?: { language: 'AS' | 'TS'; iterations: number; inline: number; hopMicros: Percentiles; totalMicros: Percentiles }[];
  memory: { baselineMiB: number; added: { language: 'AS' | 'TS'; policies: number; instances: number; rssGrowthMiB: number; perInstanceMiB: number }[] };
}

const load = (pool: SandboxPool, p: BenchPolicy): Promise<LoadedPolicy> => loadPolicy(pool, {
  name: p.name, module: modulePath(p.module), settings: p.settings ?? {}, limits: DEFAULT_LIMITS,
  failurePolicy: 'Fail', enforcement: 'enforce', isolation: 'reuse',
});

async function rssMiB(): Promise<number> {
  (globalThis as { gc?: () => void }).gc?.();
  await new Promise((r) => setTimeout(r, 300));
  const status = await readFile('/proc/self/status', 'utf8');
  return Number(/VmRSS:\s+(\d+)/.exec(status)![1]) / 1024;
}

const review = podReview();
const request = (review.request as unknown) as AdmissionRequest;
// The review's body, scanned once as the server scans each body: every input is then built from
// its bytes as the server builds it (the request spliced in as it came; a TypeScript guest gets
// the large values apart), not serialized from the object.
const body = Buffer.from(JSON.stringify(review));
const scan = scanReview(body);
const span = rawRequestSpan(body, scan)!;
/** A new input object each time, so every evaluation pays for its envelope, as a review does. */
const freshInput = (): EvaluationInput => {
  const input: EvaluationInput = { request, settings: null, headers: {}, sslpeer: null, dryRun: false, webhook: '/validate' };
  rawEnvelope(input, body, span, scan);
  return input;
};

interface Samples {
  guest: number[];
  total: number[];
  wall: number[];
  roundMedians: number[];
  inline: number;
}

async function sampleRound(pool: SandboxPool, policy: LoadedPolicy, iterations: number, into: Samples): Promise<void> {
  const guest: number[] = [];
  for (let i = 0; i < iterations; i++) {
    const inlineBefore = pool.stats.inlineCalls;
    const started = performance.now();
    const outcome = await evaluatePolicy(pool, policy, 'validate', freshInput());
    into.wall.push((performance.now() - started) * 1000);
    if (pool.stats.inlineCalls > inlineBefore) into.inline++;
    if (outcome.status !== 'allowed') throw new Error(`${policy.name}: expected allowed, got ${JSON.stringify(outcome)}`);
    guest.push(outcome.guestMicros!);
    into.total.push(outcome.totalMicros!);
  }
  into.guest.push(...guest);
  into.roundMedians.push(percentiles(guest).p50);
}

/** Calls `policy` a few ms apart (an idle host) until the inline lane answers one, or 60 s pass. */
async function laneReady(pool: SandboxPool, policy: LoadedPolicy): Promise<void> {
  const until = performance.now() + 60_000;
  const before = pool.stats.inlineCalls;
  while (pool.stats.inlineCalls === before && performance.now() < until && pool.inlineOut(policy.key) === undefined) {
    await evaluatePolicy(pool, policy, 'validate', freshInput());
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

/** AS and TS interleaved in rounds, so a slow moment of the machine does not land on one of them only. */
async function singles(pool: SandboxPool, policies: { policy: LoadedPolicy; language: 'AS' | 'TS' }[], iterations: number, rounds: number): Promise<SingleResult[]> {
  for (const { policy } of policies) for (let i = 0; i < 500; i++) await evaluatePolicy(pool, policy, 'validate', freshInput());
  const samples: Samples[] = policies.map(() => ({ guest: [], total: [], wall: [], roundMedians: [], inline: 0 }));
  for (let r = 0; r < rounds; r++) {
    for (const [i, { policy }] of policies.entries()) await sampleRound(pool, policy, Math.ceil(iterations / rounds), samples[i]!);
  }
  return policies.map(({ policy, language }, i) => {
    const { guest, total, wall, roundMedians, inline } = samples[i]!;
    return {
      policy: policy.name, language, iterations: guest.length, rounds, guestRoundMedians: roundMedians, inline,
      guestMicros: percentiles(guest), hopMicros: percentiles(total.map((t, j) => t - guest[j]!)),
      totalMicros: percentiles(total), wallMicros: percentiles(wall),
    };
  });
}

async function mixed(pool: SandboxPool, policies: LoadedPolicy[], iterations: number): Promise<SandboxResult['mixed10']> {
  const once = async () => {
    const input = freshInput();
    const outcomes = await Promise.all(policies.map((p) => evaluatePolicy(pool, p, 'validate', input)));
    const result = merge(policies.map((policy, i) => ({ policy, outcome: outcomes[i]! })), request.operation, request.object);
    if (!result.decision.allowed) throw new Error(`mixed10: expected allowed, got ${JSON.stringify(result.decision)}`);
    return outcomes;
  };
  for (let i = 0; i < Math.min(200, iterations); i++) await once();
  const wall: number[] = [];
  const guestSum: number[] = [];
  const hop: number[] = [];
  for (let i = 0; i < iterations; i++) {
    const started = performance.now();
    const outcomes = await once();
    wall.push((performance.now() - started) * 1000);
    guestSum.push(outcomes.reduce((s, o) => s + o.guestMicros!, 0));
    for (const o of outcomes) hop.push(o.totalMicros! - o.guestMicros!);
  }
  return { iterations, wallMicros: percentiles(wall), guestSumMicros: percentiles(guestSum), hopMicros: percentiles(hop) };
}

async function main(quick: boolean): Promise<SandboxResult> {
  const pool = new SandboxPool();
  try {
    const [ts, as] = [await load(pool, ONE_TS[0]!), await load(pool, ONE_AS[0]!)];
    // One at a time: load time is not measured here, and it keeps load-time garbage low.
    const ten: LoadedPolicy[] = [];
    for (const p of MIXED_10) ten.push(await load(pool, p));
    const n = quick ? 1500 : 8000;
    // The inline lane makes its copies in the background, its compile trials at the lowest CPU
    // priority, so on a busy machine only in idle moments: measured once made, as on a host that
    // has been idle a while, not while they are being made.
    for (const policy of [as, ts]) await laneReady(pool, policy);
    const result: SandboxResult = {
      poolSize: pool.size,
      single: await singles(pool, [{ policy: as, language: 'AS' }, { policy: ts, language: 'TS' }], n, quick ? 3 : 8),
      mixed10: await mixed(pool, ten, quick ? 300 : 2000),
      memory: { baselineMiB: 0, added: [] },
    };
    result.idle = [];
    for (const [language, policy] of [['AS', as], ['TS', ts]] as const) result.idle.push(await idleCalls(pool, policy, language, quick ? 500 : 2000));
    await pool.close();
    result.bareRoundTripMicros = await bareRoundTrip(n);
    result.memory = await memoryPerPolicy(quick ? 10 : 20);
    return result;
  } finally {
    await pool.close();
  }
}

/**
 * Memory per loaded policy: in a fresh pool, load one policy of the module and use it, then
 * load `count` more copies under new names (distinct sandboxes, each instantiated in every
 * worker) and call each twice; RSS growth / (count × pool size) is the cost of one instance.
 */
async function memoryPerPolicy(count: number): Promise<SandboxResult['memory']> {
  const out: SandboxResult['memory'] = { baselineMiB: 0, added: [] };
  for (const [language, module] of [['TS', 'require-labels'], ['AS', 'no-delete']] as const) {
    const pool = new SandboxPool();
    try {
      const first = await load(pool, copies(module, 1, `first-${module}`)[0]!);
      for (let i = 0; i < 50; i++) await evaluatePolicy(pool, first, 'validate', freshInput());
      const before = await rssMiB();
      if (language === 'TS') out.baselineMiB = Math.round(before);
      const loaded: LoadedPolicy[] = [];
      for (const p of copies(module, count, `mem-${module}`)) loaded.push(await load(pool, p));
      for (let i = 0; i < 2 * pool.size; i++) for (const p of loaded) await evaluatePolicy(pool, p, 'validate', freshInput());
      const after = await rssMiB();
      const instances = count * pool.size;
      out.added.push({ language, policies: count, instances, rssGrowthMiB: round(after - before), perInstanceMiB: round((after - before) / instances) });
    } finally {
      await pool.close();
    }
  }
  return out;
}

/** One call every millisecond or so (a timer between them), after 100 to warm up. */
async function idleCalls(pool: SandboxPool, policy: LoadedPolicy, language: 'AS' | 'TS', iterations: number): Promise<NonNullable<SandboxResult['idle']>[number]> {
  const hop: number[] = [];
  const total: number[] = [];
  let inline = 0;
  for (let i = 0; i < iterations + 100; i++) {
    await new Promise((resolve) => setTimeout(resolve, 1));
    const before = pool.stats.inlineCalls;
    const outcome = await evaluatePolicy(pool, policy, 'validate', freshInput());
    if (outcome.status !== 'allowed') throw new Error(`${policy.name}: expected allowed, got ${JSON.stringify(outcome)}`);
    if (i < 100) continue;
    if (pool.stats.inlineCalls > before) inline++;
    hop.push(outcome.totalMicros! - outcome.guestMicros!);
    total.push(outcome.totalMicros!);
  }
  return { language, iterations, inline, hopMicros: percentiles(hop), totalMicros: percentiles(total) };
}

/** An echo worker, one message at a time, as the hop is measured: the platform's own round trip. */
async function bareRoundTrip(n: number): Promise<Percentiles> {
  const worker = new Worker("require('node:worker_threads').parentPort.on('message', (m) => require('node:worker_threads').parentPort.postMessage(m));", { eval: true });
  try {
    await new Promise((r) => worker.once('online', r));
    const times: number[] = [];
    for (let i = 0; i < n; i++) {
      const t = performance.now();
      await new Promise((r) => {
        worker.once('message', r);
        worker.postMessage(i);
      });
      times.push((performance.now() - t) * 1000);
    }
    return percentiles(times);
  } finally {
    await worker.terminate();
  }
}

const round = (v: number) => Math.round(v * 100) / 100;

if (import.meta.main) {
  const { quick } = JSON.parse(process.argv[2] ?? '{}') as { quick?: boolean };
  const result = await main(quick === true);
  const cpu = process.cpuUsage();
  process.stdout.write(`${JSON.stringify({ ...result, cpuSec: round((cpu.user + cpu.system) / 1e6) })}\n`);
}
