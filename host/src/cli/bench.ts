// `portcullis bench`: how fast and how big one policy is in the real sandbox, as `kwctl bench`
// does for Kubewarden. Evaluations run one after another on one worker, so the figures are the
// policy's own cost (guest call plus the hop into the sandbox), not the server's throughput.
import { parseArgs } from 'node:util';
import type { Mode } from '@portcullis/sdk';
import { evaluatePolicy } from '../evaluate/evaluate.ts';
import { ConfigError } from '../errors.ts';
import { loadPolicy } from '../policy/load.ts';
import { SandboxPool } from '../sandbox/pool.ts';
import { DEFAULT_LIMITS } from '../config/limits.ts';
import { mib } from '../util/text.ts';
import { parseSettings, positive, readRequest } from './run.ts';
import { settingsFrom, UsageError } from './usage.ts';
import { policyNameOf } from '../policy/source.ts';

export const BENCH_USAGE = 'usage: portcullis bench --policy FILE.wasm --request REVIEW|REQUEST|MANIFEST [--settings JSON|FILE] [--mode validate|mutate]\n' +
  '         [--iterations N (default 1000)] [--warmup N (default 100)] [--json]';

export default async function bench(args: string[]): Promise<number> {
  let values;
  try {
    values = parseArgs({
      args,
      options: {
        policy: { type: 'string' }, request: { type: 'string' }, settings: { type: 'string' }, mode: { type: 'string' },
        iterations: { type: 'string' }, warmup: { type: 'string' }, json: { type: 'boolean' },
        operation: { type: 'string' }, 'old-object': { type: 'string' }, namespace: { type: 'string' }, user: { type: 'string' }, groups: { type: 'string' },
      },
    }).values;
  } catch (error) {
    throw new UsageError(`${(error as Error).message}\n${BENCH_USAGE}`);
  }
  if (!values.policy || !values.request) throw new UsageError(BENCH_USAGE);
  if (values.mode !== undefined && values.mode !== 'validate' && values.mode !== 'mutate') throw new UsageError(`--mode must be validate or mutate, not "${values.mode}"`);
  const iterations = values.iterations ? Math.round(positive(values.iterations, '--iterations')) : 1000;
  const warmup = values.warmup ? Math.round(positive(values.warmup, '--warmup')) : 100;
  const review = await readRequest(values);
  const settings = values.settings === undefined ? {} : await parseSettings(values.settings);
  const name = policyNameOf(values.policy);
  const rssBefore = process.memoryUsage().rss;
  const pool = new SandboxPool(1);
  try {
    const loadStarted = performance.now();
    const policy = await loadPolicy(pool, {
      name, module: values.policy, settings, limits: DEFAULT_LIMITS, failurePolicy: 'Fail', enforcement: 'enforce', isolation: 'reuse',
    }).catch(settingsFrom('--settings'));
    const loadMs = performance.now() - loadStarted;
    const rssLoaded = process.memoryUsage().rss;
    const mode: Mode = (values.mode) ?? (policy.modes.includes('validate') ? 'validate' : 'mutate');
    if (!policy.modes.includes(mode)) throw new ConfigError(`policy "${name}" (${values.policy}) does not ${mode}; it supports: ${policy.modes.join(', ')}`);
    const input = { request: review.request, settings, headers: {}, sslpeer: null, dryRun: review.request.dryRun === true, webhook: `/${mode}/${name}` };
    const micros: number[] = [];
    const guest: number[] = [];
    const started = performance.now();
    for (let i = 0; i < warmup + iterations; i++) {
      const outcome = await evaluatePolicy(pool, policy, mode, input);
      if (outcome.status === 'failed') {
        throw new ConfigError(`policy "${name}" failed on evaluation ${i + 1} (${outcome.failure}): ${outcome.message}; fix it before measuring it`);
      }
      if (i < warmup) continue;
      if (outcome.totalMicros !== undefined) micros.push(outcome.totalMicros);
      if (outcome.guestMicros !== undefined) guest.push(outcome.guestMicros);
    }
    const seconds = (performance.now() - started) / 1000;
    const result = {
      policy: name, mode, iterations, warmup, loadMs: round(loadMs),
      evaluation: summary(micros), guestCall: summary(guest), evaluationsPerSecond: Math.round((warmup + iterations) / seconds),
      memory: { rssLoadedMiB: mib(rssLoaded - rssBefore), rssAfterMiB: mib(process.memoryUsage().rss - rssBefore), memoryCapMiB: policy.limits.memoryMiB },
    };
    if (values.json) {
      process.stdout.write(`${JSON.stringify(result, null, 2)}\n`);
    } else {
      process.stdout.write([
        `policy ${name} (${policy.kind}), ${mode}, ${iterations} evaluations after ${warmup} warm-up, loaded in ${result.loadMs} ms`,
        `evaluation (hop + guest): p50 ${result.evaluation.p50} µs, p99 ${result.evaluation.p99} µs, max ${result.evaluation.max} µs`,
        `guest call:               p50 ${result.guestCall.p50} µs, p99 ${result.guestCall.p99} µs`,
        `throughput:               ${result.evaluationsPerSecond} evaluations/s on one worker`,
        // The process's RSS (a worker thread, the runtime, the compiled module), not the guest's
        // memory, which its cap bounds: side by side, the two read as the cap broken (outsider).
        `process RSS:              +${result.memory.rssLoadedMiB} MiB once loaded, +${result.memory.rssAfterMiB} MiB after the run (a sandbox worker, its runtime and the module; the policy's own memory cap is ${result.memory.memoryCapMiB} MiB)`,
        '',
      ].join('\n'));
    }
    return 0;
  } finally {
    await pool.close();
  }
}

function summary(values: number[]): { p50: number; p99: number; max: number } {
  if (values.length === 0) return { p50: 0, p99: 0, max: 0 };
  const sorted = [...values].sort((a, b) => a - b);
  const at = (q: number) => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!;
  return { p50: at(0.5), p99: at(0.99), max: sorted[sorted.length - 1]! };
}

function round(ms: number): number {
  return Math.round(ms * 10) / 10;
}
