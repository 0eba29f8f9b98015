// Prometheus metrics for reviews, evaluations, sandbox faults and pool saturation.
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import type { Outcome } from '../evaluate/outcome.ts';
import type { SandboxPool } from '../sandbox/pool.ts';

const LATENCY_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5];

export class Metrics {
  readonly registry = new Registry();
  readonly reviews = new Counter({ name: 'portcullis_reviews_total', help: 'AdmissionReviews answered, by endpoint and decision', labelNames: ['endpoint', 'decision'] as const, registers: [this.registry] });
  readonly badRequests = new Counter({ name: 'portcullis_bad_requests_total', help: 'Requests refused before evaluation, by reason code', labelNames: ['code'] as const, registers: [this.registry] });
  readonly reviewSeconds = new Histogram({ name: 'portcullis_review_duration_seconds', help: 'Time from request to response', labelNames: ['endpoint'] as const, buckets: LATENCY_BUCKETS, registers: [this.registry] });
  readonly evaluations = new Counter({ name: 'portcullis_evaluations_total', help: 'Policy evaluations, by policy and outcome', labelNames: ['policy', 'outcome'] as const, registers: [this.registry] });
  readonly evaluationSeconds = new Histogram({ name: 'portcullis_evaluation_duration_seconds', help: 'Time of one policy evaluation including the hop into the sandbox', labelNames: ['policy'] as const, buckets: LATENCY_BUCKETS, registers: [this.registry] });
  readonly faults = new Counter({ name: 'portcullis_sandbox_faults_total', help: 'Policy failures, by policy and kind', labelNames: ['policy', 'kind'] as const, registers: [this.registry] });
  readonly audited = new Counter({ name: 'portcullis_audit_decisions_total', help: 'Decisions of audit-mode policies (not enforced)', labelNames: ['policy', 'outcome'] as const, registers: [this.registry] });
  readonly policies = new Gauge({ name: 'portcullis_policies', help: 'Policies in the current set, by state', labelNames: ['state'] as const, registers: [this.registry] });
  readonly reloads = new Counter({ name: 'portcullis_reloads_total', help: 'Configuration reloads, by result', labelNames: ['result'] as const, registers: [this.registry] });

  constructor(pool: SandboxPool) {
    const registers = [this.registry];
    new Gauge({ name: 'portcullis_sandbox_workers', help: 'Sandbox worker threads', registers, collect() { this.set(pool.stats.size); } });
    new Gauge({ name: 'portcullis_sandbox_busy', help: 'Sandbox workers running a policy now', registers, collect() { this.set(pool.stats.busy); } });
    new Gauge({ name: 'portcullis_sandbox_queued', help: 'Evaluations waiting for a free sandbox worker', registers, collect() { this.set(pool.stats.queued); } });
    new Gauge({ name: 'portcullis_sandbox_restarts', help: 'Sandbox workers replaced after a deadline or crash', registers, collect() { this.set(pool.stats.restarts); } });
  }

  recordOutcome(outcome: Outcome): void {
    const label = outcome.status === 'failed' ? `failed-${outcome.failure}` : outcome.status;
    this.evaluations.inc({ policy: outcome.policy, outcome: label });
    if (outcome.totalMicros !== undefined) this.evaluationSeconds.observe({ policy: outcome.policy }, outcome.totalMicros / 1e6);
    if (outcome.status === 'failed') this.faults.inc({ policy: outcome.policy, kind: outcome.failure });
  }
}
