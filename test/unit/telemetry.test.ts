// Telemetry beside the pipeline: under overload every review fails the same way, and the log
// must say so once a second per policy and kind, with a count, not thousands of times.
import { expect, it } from 'vitest';
import type { AdmissionRequest } from '@portcullis/sdk';
import type { Outcome } from '../../host/src/sandbox/outcome.ts';
import { Histogram, Registry } from 'prom-client';
import { Metrics } from '../../host/src/server/metrics.ts';
import { TallyHistogram } from '../../host/src/server/tallies.ts';
import { LineThrottle, recordReview } from '../../host/src/server/telemetry.ts';
import type { PoolStats, SandboxPool } from '../../host/src/sandbox/pool.ts';
import { createLogger } from '../../host/src/util/log.ts';

/** A pool's stats as an idle pool reports them (typed: a gauge reading a missing field throws). */
const idlePool = {
  stats: { size: 1, workers: 1, busy: 0, queued: 0, loading: 0, restarts: 0, inlineCalls: 0, inlineOut: 0,
    inlineReady: 0, inlinePreparing: 0, unstopped: 0 } satisfies PoolStats,
} as SandboxPool;

it('LineThrottle lets one line per key and interval through, and counts the rest', () => {
  let now = 0;
  const throttle = new LineThrottle(1000, () => now);
  expect(throttle.admit('a')).toBe(0);
  expect(throttle.admit('a')).toBeUndefined();
  expect(throttle.admit('b')).toBe(0);
  now = 500;
  expect(throttle.admit('a')).toBeUndefined();
  now = 1000;
  expect(throttle.admit('a')).toBe(2);
  expect(throttle.admit('a')).toBeUndefined();
});

it('recordReview logs a repeated policy failure once, and still counts every one in the metrics', async () => {
  const lines: { msg: string }[] = [];
  const log = createLogger('info', (line) => void lines.push(JSON.parse(line) as { msg: string }));
  const metrics = new Metrics(idlePool);
  const request = { uid: 'u1', operation: 'CREATE', kind: { group: '', version: 'v1', kind: 'Pod' }, userInfo: {} } as unknown as AdmissionRequest;
  const failed: Outcome = { policy: 'p', status: 'failed', failure: 'temporary', message: 'not started: the sandboxes are overloaded', warnings: [] };
  const decision = { allowed: false, patch: [], warnings: [], status: { code: 500, message: 'x' } } as never;
  const denied: Outcome = { policy: 'q', status: 'denied', code: 403, message: 'no', warnings: [] };
  for (let i = 0; i < 50; i++) {
    recordReview({ metrics, log }, {
      caller: { endpoint: '/validate', mode: 'validate', headers: {}, sslpeer: null }, request, policies: ['p'], outcomes: [failed], audited: [], decision, deciding: failed, seconds: 0.001,
    });
    recordReview({ metrics, log }, {
      caller: { endpoint: '/validate', mode: 'validate', headers: {}, sslpeer: null }, request, policies: ['q'], outcomes: [denied], audited: [], decision, deciding: denied, seconds: 0.001,
    });
  }
  expect(lines.filter((l) => l.msg === 'policy failed')).toHaveLength(1);
  // Denials the failure decided are throttled with it; denials a policy decided are all logged.
  expect(lines.filter((l) => l.msg === 'denied' && (l as { policy?: string }).policy === 'p')).toHaveLength(1);
  expect(lines.filter((l) => l.msg === 'denied' && (l as { policy?: string }).policy === 'q')).toHaveLength(50);
  const text = await metrics.registry.metrics();
  expect(text).toMatch(/portcullis_sandbox_faults_total\{policy="p",kind="temporary"\} 50/);
});

it('recordReview cuts a name, namespace, kind and user no API server would send to 256 characters in its line (red team)', () => {
  const lines: Record<string, unknown>[] = [];
  const log = createLogger('info', (line) => void lines.push(JSON.parse(line) as Record<string, unknown>));
  const long = 'n'.repeat(2 ** 20);
  const request = {
    uid: 'u1', operation: 'CREATE', kind: { group: '', version: 'v1', kind: long }, name: long, namespace: long, userInfo: { username: long },
  } as unknown as AdmissionRequest;
  const denied: Outcome = { policy: 'q', status: 'denied', code: 403, message: 'no', warnings: [] };
  const decision = { allowed: false, patch: [], warnings: [], status: { code: 403, message: 'no' } } as never;
  recordReview({ metrics: new Metrics(idlePool), log }, {
    caller: { endpoint: '/validate', mode: 'validate', headers: {}, sslpeer: null }, request, policies: ['q'], outcomes: [denied], audited: [], decision, deciding: denied, seconds: 0.001,
  });
  const cut = `${'n'.repeat(256)}… (${2 ** 20 - 256} more characters cut)`;
  expect(lines.find((l) => l.msg === 'denied')).toMatchObject({ name: cut, namespace: cut, kind: cut, user: cut, uid: 'u1' });
});

it('counts survive repeated scrapes exactly, and a refused call (never started) has no duration', async () => {
  const metrics = new Metrics(idlePool);
  const refused: Outcome = { policy: 'p', status: 'failed', failure: 'temporary', message: 'not started: the sandboxes are overloaded', warnings: [] };
  const ran: Outcome = { policy: 'p', status: 'allowed', patch: [], warnings: [], totalMicros: 1500 };
  for (let i = 0; i < 3; i++) metrics.recordOutcome(refused);
  metrics.recordReview('/validate', 'denied', 0.001);
  const first = await metrics.registry.metrics();
  expect(first).toMatch(/portcullis_evaluations_total\{policy="p",outcome="failed-temporary"\} 3\n/);
  expect(first).toMatch(/portcullis_reviews_total\{endpoint="\/validate",decision="denied"\} 1\n/);
  expect(first).not.toMatch(/portcullis_evaluation_duration_seconds_count\{policy="p"\}/);
  metrics.recordOutcome(ran);
  metrics.recordOutcome(refused);
  const second = await metrics.registry.metrics();
  expect(second).toMatch(/portcullis_evaluations_total\{policy="p",outcome="failed-temporary"\} 4\n/);
  expect(second).toMatch(/portcullis_evaluations_total\{policy="p",outcome="allowed"\} 1\n/);
  expect(second).toMatch(/portcullis_sandbox_faults_total\{policy="p",kind="temporary"\} 4\n/);
  expect(second).toMatch(/portcullis_evaluation_duration_seconds_count\{policy="p"\} 1\n/);
  expect(second).toMatch(/portcullis_reviews_total\{endpoint="\/validate",decision="denied"\} 1\n/);
});

it('TallyHistogram prints what a prom-client Histogram prints for the same observations', async () => {
  const buckets = [0.001, 0.01, 0.1, 1];
  const ours = new Registry();
  const theirs = new Registry();
  const tallied = new TallyHistogram({ name: 'h_seconds', help: 'h', label: 'policy', buckets, registry: ours });
  const reference = new Histogram({ name: 'h_seconds', help: 'h', labelNames: ['policy'], buckets, registers: [theirs] });
  const samples: [string, number][] = [['a', 0.0005], ['a', 0.001], ['b', 0.05], ['a', 2], ['b', 1], ['c', 0], ['a', 0.0011]];
  for (const [policy, seconds] of samples) {
    tallied.observe(policy, seconds);
    reference.labels(policy).observe(seconds);
  }
  expect(await ours.metrics()).toBe(await theirs.metrics());
  tallied.reset();
  reference.reset();
  expect(await ours.metrics()).toBe(await theirs.metrics());
});
