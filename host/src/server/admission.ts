// One AdmissionReview, start to end: parse and validate -> select matching policies ->
// evaluate them in parallel in the sandboxes -> merge -> respond. HTTP concerns (routing,
// bodies, TLS) stay in http.ts; this module only sees text in and a review out.
import type { EvaluationInput, Mode } from '@portcullis/sdk';
import { envelopeOf, evaluateEntry, rawEnvelope, toOutcome } from '../evaluate/evaluate.ts';
import { ReviewError, UnknownPolicyError } from '../errors.ts';
import { merge, patchesToCombine, unmerged } from '../merge/merge.ts';
import type { MergedPatch, MergeError, PatchMerger } from '../merge/offload.ts';
import type { PolicyEntry, PolicyRegistry } from '../policy/policy-set.ts';
import { hasObject, parseScannedReview, parseReviewText } from '../review/parse.ts';
import { rawRequestSpan, scanReview, type ReviewScan } from '../review/scan.ts';
import { respond, type AdmissionResponseReview } from '../review/respond.ts';
import type { SandboxPool } from '../sandbox/pool.ts';
import type { HostObjects } from '../select/host-objects.ts';
import { policyMatches, type NamespaceLabels } from '../select/match.ts';
import type { Logger } from '../util/log.ts';
import type { Metrics } from './metrics.ts';
import type { Caller } from './caller.ts';
import { LineThrottle, recordReview } from './telemetry.ts';

export interface AdmissionDeps {
  registry: PolicyRegistry;
  pool: SandboxPool;
  metrics: Metrics;
  log: Logger;
  /** Combines large patches off the main thread; without it, every merge happens in place. */
  merger?: PatchMerger;
  namespaceLabels?: NamespaceLabels;
  /** Log allowed and mutated reviews at info (server.logAllowedReviews), not only at debug. */
  logAllowed?: boolean;
  /**
   * With managed webhooks, a per-policy endpoint for a policy this replica does not have is a
   * webhook another replica registered, mid-rollout or mid-reload (added there, or removed
   * here): answered allowed with a warning instead of 404, which the apiserver turns into a
   * failure, so with Fail a rollout that adds or removes a policy denied every request the
   * policy covers on the replicas without it (red team). Without managed webhooks, 404: the
   * path is the operator's own, and likely a typo.
   */
  allowUnknownPolicies?: boolean;
  /** The host's own Lease and Secret: allowed without policies (select/host-objects.ts). */
  hostObjects?: HostObjects;
}

export type { Caller } from './caller.ts';

/**
 * `body`: the request body, as bytes when the caller has them (guests then get the request's own
 * bytes); `scan`: scanReview of those bytes, when the caller made it already.
 */
export async function review(deps: AdmissionDeps, caller: Caller, body: string | Buffer, scan?: ReviewScan): Promise<AdmissionResponseReview> {
  const started = performance.now();
  // Workers that finished get their next calls before this review joins the queue (see pump).
  deps.pool.pump();
  if (typeof body !== 'string') scan ??= scanReview(body);
  const parsed = typeof body === 'string' ? parseReviewText(body) : parseScannedReview(body, scan!);
  const { request } = parsed;
  const set = deps.registry.current;
  set.hold();
  try {
    // The only lookup of a per-policy endpoint's policy, made once for this review: a reload
    // between the HTTP layer's early check and here answers 404, never a crash.
    const own = caller.policy === undefined ? undefined : deps.registry.lookup(caller.policy, caller.mode);
    if (caller.policy !== undefined && !own) {
      if (!deps.allowUnknownPolicies) findPolicy(deps.registry, caller.policy, caller.mode);
      return notHere(deps, caller.policy, caller.mode, parsed.apiVersion, request.uid);
    }
    const hostObject = deps.hostObjects?.(request);
    if (hostObject !== undefined) {
      deps.log.debug('allowed without evaluating policies: the host writes this object itself', { uid: request.uid, object: hostObject, operation: request.operation });
      return respond(parsed.apiVersion, request.uid, { allowed: true, warnings: [], patch: [] });
    }
    const candidates = own ? [own] : set.entries;
    const selected = candidates.filter((entry) => policyMatches(entry, caller.mode, request, deps.namespaceLabels));
    const input: EvaluationInput = {
      request, settings: null, headers: caller.headers, sslpeer: caller.sslpeer, dryRun: request.dryRun === true, webhook: caller.endpoint,
    };
    // Overload: when none of the review's policies could start within its deadline, the review
    // is answered now (per failurePolicy) without building the input it will not use.
    // The calls of quick policies are refused together; a costly policy's alone, by its own
    // backlog, so its overload fails only it, per its own failurePolicy (see pool.refusals).
    const loaded = selected.flatMap((entry) => (entry.loaded ? [{ key: entry.loaded.key, timeoutMs: entry.loaded.limits.timeoutMs }] : []));
    const answers = deps.pool.refusals(loaded);
    let next = 0;
    let refused = selected.map((entry) => (entry.loaded ? answers[next++] : undefined));
    // One refusal that denies the review (failurePolicy Fail, enforced: not a trial nor an audit) makes the rest work for
    // nothing: they are refused too (review helper: a costly call ran on an overloaded pool for
    // a review its refused quick policies had already denied).
    const denying = refused.find((r, i) => r !== undefined && selected[i]!.config.failurePolicy === 'Fail' && selected[i]!.config.enforcement === 'enforce');
    if (denying) refused = selected.map((entry, i) => (entry.loaded ? refused[i] ?? denying : undefined));
    const shed = refused.every((r, i) => r !== undefined || !selected[i]!.loaded);
    // Guests get the request's own bytes spliced into their input, unless parsing had to change it.
    if (!shed && typeof body !== 'string' && !parsed.normalized && selected.length > 0) {
      const span = rawRequestSpan(body, scan!);
      if (span) rawEnvelope(input, body, span, scan);
    }
    const outcomes = await Promise.all(selected.map((entry, i) => {
      const refusal = refused[i];
      const answerWithinMs = caller.timeoutMs === undefined ? undefined : caller.timeoutMs - (performance.now() - started);
      // Judged above, in this same turn: the pool does not judge these calls again.
      return refusal ? Promise.resolve(toOutcome(entry.config.name, refusal)) : evaluateEntry(deps.pool, entry, caller.mode, input, answerWithinMs, true);
    }));
    const evaluated = selected.map((entry, i) => ({ policy: entry.config, outcome: outcomes[i]! }));
    const { merger } = deps;
    // Read only to merge in place or without an envelope: the object is parsed on first read (parseScannedReview).
    const object = Object.assign(() => request.object, { present: hasObject(request) });
    const toCombine = merger ? patchesToCombine(evaluated, request.operation, object) : [];
    let combined: MergedPatch | undefined;
    if (merger && toCombine.length > 0) {
      const withinMs = caller.timeoutMs === undefined ? undefined : caller.timeoutMs - (performance.now() - started);
      combined = await merger.combine(() => request.object!, toCombine, withinMs, envelopeOf(input))
        .catch((error: MergeError) => unmerged(toCombine, error.message, error.temporary));
    }
    const { decision, deciding, audited } = merge(evaluated, request.operation, object, combined);

    // Beside the pipeline, not in it: metrics and the review's log lines.
    const seconds = (performance.now() - started) / 1000;
    recordReview(deps, { caller, request, policies: selected.map((e) => e.config.name), outcomes, audited, decision, deciding, seconds });
    return respond(parsed.apiVersion, request.uid, decision);
  } finally {
    set.release();
  }
}

/** Another replica's policy: allowed, saying so to the user and (once a second per policy) in the log. */
function notHere(deps: AdmissionDeps, policy: string, mode: Mode, apiVersion: Parameters<typeof respond>[0], uid: string): AdmissionResponseReview {
  deps.metrics.badRequests.inc({ code: 'UNKNOWN_POLICY_ALLOWED' });
  if (unknownThrottle.admit(`${policy}\0${mode}`) !== undefined) {
    deps.log.warn('a webhook called a policy this replica does not have; allowed (a rollout or reload in progress?)', { policy, mode, uid });
  }
  const warning = `policy "${policy}" (${mode}) is not configured on this webhook replica, so it was not evaluated (a rollout or configuration reload in progress)`;
  return respond(apiVersion, uid, { allowed: true, warnings: [warning], patch: [] });
}
const unknownThrottle = new LineThrottle();

function findPolicy(registry: PolicyRegistry, name: string, mode: Mode): PolicyEntry {
  const entry = registry.lookup(name, mode);
  if (entry) return entry;
  const configured = registry.current.byName.get(name);
  throw new UnknownPolicyError(name, mode, configured?.modes);
}


export { ReviewError };
