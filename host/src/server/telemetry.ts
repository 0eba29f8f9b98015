// What a review leaves behind besides its answer: metrics for every outcome, and log lines for
// denials, failures, audited decisions and (when asked) allowed reviews. Kept out of
// admission.ts so the pipeline there reads as parse -> select -> evaluate -> merge -> respond.
import type { AdmissionRequest } from '@portcullis/sdk';
import type { Outcome } from '../sandbox/outcome.ts';
import type { MergeResult } from '../merge/merge.ts';
import type { Level, Logger } from '../util/log.ts';
import { cutField } from '../util/text.ts';
import type { Caller } from './caller.ts';
import type { Metrics } from './metrics.ts';

export interface TelemetryDeps {
  metrics: Metrics;
  log: Logger;
  logAllowed?: boolean;
}

export interface ReviewRecord {
  caller: Caller;
  request: AdmissionRequest;
  /** Names of the policies that were evaluated. */
  policies: string[];
  outcomes: Outcome[];
  audited: MergeResult['audited'];
  decision: MergeResult['decision'];
  deciding: MergeResult['deciding'];
  seconds: number;
}

export function recordReview(deps: TelemetryDeps, r: ReviewRecord): void {
  const { caller, request, decision } = r;
  const endpoint = caller.policy ? `/${caller.mode}/*` : caller.endpoint;
  const label = decision.allowed ? 'allowed' : 'denied';
  deps.metrics.recordReview(endpoint, label, r.seconds);
  for (const outcome of r.outcomes) deps.metrics.recordOutcome(outcome);
  for (const outcome of r.audited) {
    deps.metrics.audited.inc({ policy: outcome.policy, outcome: outcome.status });
    deps.log.info('audit decision (not enforced)', {
      uid: request.uid, policy: outcome.policy, decision: outcome.status, ...(outcome.status !== 'allowed' ? { message: outcome.message } : {}),
    });
  }
  for (const outcome of r.outcomes) if (outcome.logs) guestLines(deps.log, request.uid, outcome.policy, outcome.logs);
  for (const outcome of r.outcomes) {
    if (outcome.status !== 'failed') continue;
    // Under overload every review fails the same way, thousands of times a second: one line per
    // policy and kind of failure each second, with how many were left out, keeps the log (and the
    // main thread writing it) from becoming the next bottleneck. Metrics still count every one.
    const suppressed = throttleOf(deps.log).admit(`${outcome.policy}\0${outcome.failure}`);
    if (suppressed === undefined) continue;
    deps.log.warn('policy failed', {
      uid: request.uid, policy: outcome.policy, failure: outcome.failure, message: outcome.message,
      ...(suppressed > 0 ? { alsoFailedSinceLastLine: suppressed } : {}),
    });
  }
  // Allowed reviews are logged at debug only unless asked for: build their fields only when logged.
  const logAllowed = deps.logAllowed === true && deps.log.enabled('info');
  if (decision.allowed && !logAllowed && !deps.log.enabled('debug')) return;
  // A denial a policy decided is always logged; one that a failure decided (a deadline under
  // overload, a crash) is throttled like the failure itself, before its line is even built, or
  // overload would write a line per review from the thread that must answer them.
  const failed = !decision.allowed && r.deciding?.status === 'failed' ? r.deciding : undefined;
  const heldBack = failed ? throttleOf(deps.log).admit(`denied\0${failed.policy}\0${failed.failure}`) : 0;
  if (heldBack === undefined) return;
  const fields = {
    uid: request.uid, endpoint: caller.endpoint, operation: request.operation, kind: cutField(request.kind.kind),
    // A caller other than the API server may send names of megabytes: each line would be as long.
    namespace: cutField(request.namespace), name: cutField(request.name), user: cutField(request.userInfo.username) ?? null, decision: label,
    policies: r.policies, ms: Math.round(r.seconds * 1e4) / 10,
  };
  if (!decision.allowed) {
    deps.log.info('denied', {
      ...fields, policy: r.deciding?.policy, code: decision.status?.code, message: decision.status?.message,
      ...(heldBack > 0 ? { alsoDeniedSinceLastLine: heldBack } : {}),
    });
    return;
  }
  const mutated = (decision.patch?.length ?? 0) > 0;
  if (logAllowed) deps.log.info(mutated ? 'mutated' : 'allowed', { ...fields, ...(mutated ? { patchOperations: decision.patch.length } : {}) });
  else deps.log.debug('reviewed', fields);
}

/** Lines a policy may log each second; past them, the next line due says how many were left out. */
const GUEST_LINES_PER_SECOND = 100;
const LEVELS = new Set<string>(['debug', 'info', 'warn', 'error']);

/**
 * A guest's own log lines (ctx.log, console), at their level, naming the policy and request. A
 * policy logging on every review of a busy cluster must not flood the log or the main thread
 * writing it: each policy gets a budget of lines a second.
 */
function guestLines(log: Logger, uid: string, policy: string, lines: readonly (readonly [string, string])[]): void {
  const budget = budgetOf(log);
  for (const [said, message] of lines) {
    const level = LEVELS.has(said) ? (said as Level) : 'info';
    if (!log.enabled(level)) continue;
    const dropped = budget.admit(policy);
    if (dropped === undefined) continue;
    log[level]('policy log', { uid, policy, message, ...(dropped > 0 ? { droppedSinceLastLine: dropped } : {}) });
  }
}

/** Up to `perInterval` lines per key and interval; says how many it held back before the next one. */
export class LineBudget {
  readonly #perInterval: number;
  readonly #intervalMs: number;
  readonly #now: () => number;
  #keys = new Map<string, { from: number; used: number; held: number }>();
  constructor(perInterval: number, intervalMs = 1000, now: () => number = () => performance.now()) {
    this.#perInterval = perInterval;
    this.#intervalMs = intervalMs;
    this.#now = now;
  }

  admit(key: string): number | undefined {
    const now = this.#now();
    let state = this.#keys.get(key);
    if (!state || now - state.from >= this.#intervalMs) {
      if (this.#keys.size > 10_000) this.#keys.clear();
      const held = state?.held ?? 0;
      this.#keys.set(key, state = { from: now, used: 0, held });
    }
    if (state.used >= this.#perInterval) {
      state.held++;
      return undefined;
    }
    state.used++;
    const held = state.held;
    state.held = 0;
    return held;
  }
}

const budgets = new WeakMap<Logger, LineBudget>();
function budgetOf(log: Logger): LineBudget {
  let budget = budgets.get(log);
  if (!budget) budgets.set(log, budget = new LineBudget(GUEST_LINES_PER_SECOND));
  return budget;
}

/** At most one line per key and interval; says how many it held back since the last one. */
export class LineThrottle {
  readonly #intervalMs: number;
  readonly #now: () => number;
  #lines = new Map<string, { at: number; held: number }>();
  constructor(intervalMs = 1000, now: () => number = () => performance.now()) {
    this.#intervalMs = intervalMs;
    this.#now = now;
  }

  /** The number held back since the last line for `key` when a line is due now, else undefined. */
  admit(key: string): number | undefined {
    const now = this.#now();
    const last = this.#lines.get(key);
    if (last && now - last.at < this.#intervalMs) {
      last.held++;
      return undefined;
    }
    // Keys are policy names × a few kinds: bounded by the configuration, but drop stale ones anyway.
    if (this.#lines.size > 10_000) this.#lines.clear();
    this.#lines.set(key, { at: now, held: 0 });
    return last?.held ?? 0;
  }
}

/** One throttle per logger, so servers in one process (tests) do not hold back each other's lines. */
const throttles = new WeakMap<Logger, LineThrottle>();
function throttleOf(log: Logger): LineThrottle {
  let throttle = throttles.get(log);
  if (!throttle) throttles.set(log, throttle = new LineThrottle());
  return throttle;
}
