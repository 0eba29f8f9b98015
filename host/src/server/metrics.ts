// Prometheus metrics for reviews, evaluations, sandbox faults and pool saturation, plus what an
// operator checks first: build, loaded policies (with digest and source), leadership, registry
// pulls, and prom-client's default process and Node.js metrics.
import { collectDefaultMetrics, Counter, Gauge, Registry } from 'prom-client';
import type { PolicySet } from '../policy/policy-set.ts';
import type { Outcome } from '../sandbox/outcome.ts';
import { SLOW_LOAD_MS, type PolicyStanding, type SandboxPool } from '../sandbox/pool.ts';
import { buildInfo } from '../util/build-info.ts';
import { Tally, TallyHistogram } from './tallies.ts';

const STANDINGS: readonly PolicyStanding[] = ['normal', 'costly', 'distrusted', 'untried'];

const LATENCY_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5];

export class Metrics {
  readonly registry = new Registry();
  readonly reviews = new Counter({ name: 'portcullis_reviews_total', help: 'AdmissionReviews answered, by endpoint and decision', labelNames: ['endpoint', 'decision'] as const, registers: [this.registry], collect: (): void => this.#reviews.flush() });
  readonly badRequests = new Counter({ name: 'portcullis_bad_requests_total', help: 'Requests refused before evaluation, by reason code', labelNames: ['code'] as const, registers: [this.registry] });
  readonly reviewSeconds = new TallyHistogram({ name: 'portcullis_review_duration_seconds', help: 'Time from request to response', label: 'endpoint', buckets: LATENCY_BUCKETS, registry: this.registry });
  readonly evaluations = new Counter({ name: 'portcullis_evaluations_total', help: 'Policy evaluations, by policy and outcome', labelNames: ['policy', 'outcome'] as const, registers: [this.registry], collect: (): void => this.#evaluations.flush() });
  readonly evaluationSeconds = new TallyHistogram({ name: 'portcullis_evaluation_duration_seconds', help: 'Time of one policy evaluation including the hop into the sandbox', label: 'policy', buckets: LATENCY_BUCKETS, registry: this.registry });
  readonly faults = new Counter({ name: 'portcullis_sandbox_faults_total', help: 'Policy failures, by policy and kind', labelNames: ['policy', 'kind'] as const, registers: [this.registry], collect: (): void => this.#faults.flush() });
  readonly audited = new Counter({ name: 'portcullis_audit_decisions_total', help: 'Decisions of audit-mode policies (not enforced)', labelNames: ['policy', 'outcome'] as const, registers: [this.registry] });
  readonly policies = new Gauge({ name: 'portcullis_policies', help: 'Policies in the current set, by state', labelNames: ['state'] as const, registers: [this.registry] });
  readonly reloads = new Counter({ name: 'portcullis_reloads_total', help: 'Configuration reloads, by result', labelNames: ['result'] as const, registers: [this.registry] });
  readonly policyInfo = new Gauge({ name: 'portcullis_policy_info', help: 'One series per policy of the current set: 1 if loaded, 0 if it failed to load', labelNames: ['policy', 'digest', 'source', 'state', 'code'] as const, registers: [this.registry] });
  readonly registryPulls = new Counter({ name: 'portcullis_registry_pulls_total', help: 'oci:// module fetches (cache or registry), by registry and result', labelNames: ['registry', 'result'] as const, registers: [this.registry] });
  /** The current set's loaded policies, by name, with their pool keys (portcullis_policy_standing). */
  #standings: (readonly [string, string])[] = [];
  #leader: (() => boolean) | undefined;
  #syncFailing: (() => boolean) | undefined;

  constructor(pool: SandboxPool) {
    const registers = [this.registry];
    collectDefaultMetrics({ register: this.registry });
    const build = new Gauge({ name: 'portcullis_build_info', help: 'Always 1; the labels say which build runs', labelNames: ['version', 'revision', 'node'] as const, registers });
    build.set({ ...buildInfo(), node: process.version }, 1);
    const leader = () => this.#leader?.() ?? false;
    new Gauge({
      name: 'portcullis_leader', help: '1 while this replica holds the Lease (writes webhook configurations, rotates the certificate); 0 otherwise', registers,
      collect() { this.set(leader() ? 1 : 0); },
    });
    const syncFailing = () => this.#syncFailing?.() ?? false;
    new Gauge({
      name: 'portcullis_webhook_sync_failing',
      help: '1 while this replica leads and its last webhook configuration sync failed, or it waits to be ready before registering; 0 otherwise', registers,
      collect() { this.set(syncFailing() ? 1 : 0); },
    });
    new Gauge({ name: 'portcullis_sandbox_workers', help: 'Sandbox worker threads (one more than configured while a relief worker runs)', registers, collect() { this.set(pool.stats.workers); } });
    new Gauge({ name: 'portcullis_sandbox_busy', help: 'Sandbox workers running a policy now', registers, collect() { this.set(pool.stats.busy); } });
    new Gauge({ name: 'portcullis_sandbox_queued', help: 'Evaluations waiting for a free sandbox worker', registers, collect() { this.set(pool.stats.queued); } });
    const standings = () => this.#standings;
    new Gauge({
      name: 'portcullis_policy_standing', labelNames: ['policy', 'standing'] as const, registers,
      help: 'How the sandbox pool treats each loaded policy now: 1 for its standing (normal; costly: calls over 10 ms, run alone and judged by their own backlog; distrusted: recently stopped or slow, on fewer workers; untried: no review answered yet)',
      collect() {
        this.reset();
        for (const [policy, key] of standings()) {
          const now = pool.standing(key);
          for (const standing of STANDINGS) this.set({ policy, standing }, standing === now ? 1 : 0);
        }
      },
    });
    new Gauge({
      name: 'portcullis_policy_load_seconds', labelNames: ['policy'] as const, registers,
      help: `Each loaded policy's fastest instantiation in a sandbox worker, its start function included; over ${SLOW_LOAD_MS / 1000} s it is a slow loader: a worker reloading it counts as held, and relief workers never load it`,
      collect() {
        this.reset();
        for (const [policy, key] of standings()) {
          const ms = pool.loadTimeOf(key);
          if (ms !== undefined) this.set({ policy }, ms / 1000);
        }
      },
    });
    new Gauge({
      name: 'portcullis_policy_instances', labelNames: ['policy'] as const, registers,
      help: 'Sandbox workers holding an instance of each loaded policy (placement; it grows for a policy that had to wait behind a held worker)',
      collect() {
        this.reset();
        for (const [policy, key] of standings()) this.set({ policy }, pool.instancesOf(key));
      },
    });
    new Gauge({ name: 'portcullis_sandbox_unstopped', help: 'Sandbox worker threads still running 10 s after they were terminated (a guest V8 could not interrupt); /healthz fails while there are any', registers, collect() { this.set(pool.stats.unstopped); } });
    new Gauge({ name: 'portcullis_sandbox_restarts', help: 'Sandbox workers replaced after a deadline or crash', registers, collect() { this.set(pool.stats.restarts); } });
    new Gauge({ name: 'portcullis_sandbox_inline_calls', help: 'Policy calls answered in the main thread by the inline lane, with no hop to a worker (an idle host\'s cheap core policies)', registers, collect() { this.set(pool.stats.inlineCalls); } });
    new Gauge({ name: 'portcullis_sandbox_inline_out', help: 'Policies the inline lane no longer takes, until a change to their module, limits or settings, or a restart (out of fuel, failed, or a call took too much of the main thread; the log says which)', registers, collect() { this.set(pool.stats.inlineOut); } });
    new Gauge({ name: 'portcullis_sandbox_inline_preparing', help: 'Policies whose inline instance is being made now (in the background, while the host is quiet)', registers, collect() { this.set(pool.stats.inlinePreparing); } });
  }

  /** Where portcullis_leader reads leadership from (the webhook manager, once started). */
  watchLeader(isLeader: () => boolean, syncFailing?: () => boolean): void {
    this.#leader = isLeader;
    this.#syncFailing = syncFailing;
  }

  recordPolicies(set: PolicySet): void {
    this.policyInfo.reset();
    this.#standings = set.entries.flatMap((entry) => (entry.loaded ? [[entry.config.name, entry.loaded.key] as const] : []));
    for (const entry of set.entries) {
      const digest = entry.loaded ? `sha256:${entry.loaded.digest}` : '';
      const state = entry.loaded ? 'loaded' : 'failed';
      this.policyInfo.set({ policy: entry.config.name, digest, source: entry.config.module, state, code: entry.error?.code ?? '' }, entry.loaded ? 1 : 0);
    }
  }

  recordOutcome(outcome: Outcome): void {
    const label = outcome.status === 'failed' ? `failed-${outcome.failure}` : outcome.status;
    this.#evaluations.add(outcome.policy, label);
    // A call the pool refused never ran: it has no duration to observe.
    if (outcome.totalMicros !== undefined) this.evaluationSeconds.observe(outcome.policy, outcome.totalMicros / 1e6);
    if (outcome.status === 'failed') this.#faults.add(outcome.policy, outcome.failure);
  }

  /** One answered review. */
  recordReview(endpoint: string, decision: 'allowed' | 'denied', seconds: number): void {
    this.#reviews.add(endpoint, decision);
    this.reviewSeconds.observe(endpoint, seconds);
  }

  // Counted on the review path, handed to prom-client when scraped (tallies.ts).
  readonly #evaluations: Tally = new Tally(this.evaluations);
  readonly #faults: Tally = new Tally(this.faults);
  readonly #reviews: Tally = new Tally(this.reviews);
}
