// One AdmissionReview, start to end: parse and validate -> select matching policies ->
// evaluate them in parallel in the sandboxes -> merge -> respond. HTTP concerns (routing,
// bodies, TLS) stay in http.ts; this module only sees text in and a review out.
import type { EvaluationInput, Mode, PeerCertificate } from '@portcullis/sdk';
import { evaluateEntry, rawEnvelope } from '../evaluate/evaluate.ts';
import { ReviewError, UnknownPolicyError } from '../errors.ts';
import { merge } from '../merge/merge.ts';
import type { PolicyEntry, PolicyRegistry } from '../policy/policy-set.ts';
import { parseReviewText } from '../review/parse.ts';
import { requestSpan } from '../review/raw.ts';
import { respond, type AdmissionResponseReview } from '../review/respond.ts';
import type { SandboxPool } from '../sandbox/pool.ts';
import { policyMatches, type NamespaceLabels } from '../select/match.ts';
import type { Logger } from './log.ts';
import type { Metrics } from './metrics.ts';

export interface AdmissionDeps {
  registry: PolicyRegistry;
  pool: SandboxPool;
  metrics: Metrics;
  log: Logger;
  namespaceLabels?: NamespaceLabels;
  /** Log allowed and mutated reviews at info (server.logAllowedReviews), not only at debug. */
  logAllowed?: boolean;
}

export interface Caller {
  /** `/validate`, `/mutate`, `/validate/<policy>` or `/mutate/<policy>`. */
  endpoint: string;
  mode: Mode;
  /** Set for per-policy endpoints. */
  policy?: string;
  headers: Record<string, string>;
  sslpeer: PeerCertificate | null;
}

/** `body`: the request body, as bytes when the caller has them (guests then get the request's own bytes). */
export async function review(deps: AdmissionDeps, caller: Caller, body: string | Buffer): Promise<AdmissionResponseReview> {
  const started = performance.now();
  const parsed = parseReviewText(typeof body === 'string' ? body : body.toString('utf8'));
  const { request } = parsed;
  const set = deps.registry.current;
  set.hold();
  try {
    // The only lookup of a per-policy endpoint's policy, made once for this review: a reload
    // between the HTTP layer's early check and here answers 404, never a crash.
    const candidates = caller.policy ? [findPolicy(deps.registry, caller.policy, caller.mode)] : set.entries;
    const selected = candidates.filter((entry) => policyMatches(entry, caller.mode, request, deps.namespaceLabels));
    const input: EvaluationInput = { request, settings: null, headers: caller.headers, sslpeer: caller.sslpeer, dryRun: request.dryRun === true, webhook: caller.endpoint };
    if (typeof body !== 'string' && !parsed.normalized && selected.length > 0) {
      const span = requestSpan(body);
      if (span) rawEnvelope(input, body, span);
    }
    const outcomes = await Promise.all(selected.map((entry) => evaluateEntry(deps.pool, entry, caller.mode, input)));
    const evaluated = selected.map((entry, i) => ({ policy: entry.config, outcome: outcomes[i]! }));
    const { decision, deciding, audited } = merge(evaluated, request.operation, request.object);

    const seconds = (performance.now() - started) / 1000;
    const label = decision.allowed ? 'allowed' : 'denied';
    deps.metrics.reviews.inc({ endpoint: caller.policy ? `/${caller.mode}/*` : caller.endpoint, decision: label });
    deps.metrics.reviewSeconds.observe({ endpoint: caller.policy ? `/${caller.mode}/*` : caller.endpoint }, seconds);
    for (const outcome of outcomes) deps.metrics.recordOutcome(outcome);
    for (const outcome of audited) {
      deps.metrics.audited.inc({ policy: outcome.policy, outcome: outcome.status });
      deps.log.info('audit decision (not enforced)', { uid: request.uid, policy: outcome.policy, decision: outcome.status, ...(outcome.status !== 'allowed' ? { message: outcome.message } : {}) });
    }
    for (const outcome of outcomes) if (outcome.status === 'failed') {
      deps.log.warn('policy failed', { uid: request.uid, policy: outcome.policy, failure: outcome.failure, message: outcome.message });
    }
    // Allowed reviews are logged at debug only unless asked for: build their fields only when logged.
    const logAllowed = deps.logAllowed === true && deps.log.enabled('info');
    if (!decision.allowed || logAllowed || deps.log.enabled('debug')) {
      const fields = {
        uid: request.uid, endpoint: caller.endpoint, operation: request.operation, kind: request.kind.kind,
        namespace: request.namespace, name: request.name, user: request.userInfo.username ?? null, decision: label,
        policies: selected.map((e) => e.config.name), ms: Math.round(seconds * 1e4) / 10,
      };
      const mutated = decision.allowed && (decision.patch?.length ?? 0) > 0;
      if (!decision.allowed) deps.log.info('denied', { ...fields, policy: deciding?.policy, code: decision.status?.code, message: decision.status?.message });
      else if (logAllowed) deps.log.info(mutated ? 'mutated' : 'allowed', { ...fields, ...(mutated ? { patchOperations: decision.patch!.length } : {}) });
      else deps.log.debug('reviewed', fields);
    }
    return respond(parsed.apiVersion, request.uid, decision);
  } finally {
    set.release();
  }
}

function findPolicy(registry: PolicyRegistry, name: string, mode: Mode): PolicyEntry {
  const entry = registry.lookup(name, mode);
  if (entry) return entry;
  const configured = registry.current.byName.get(name);
  throw new UnknownPolicyError(name, mode, configured?.modes);
}


export { ReviewError };
