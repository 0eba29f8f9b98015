// Merges the outcomes of every policy evaluated for one request into one Decision.
//  - Allowed only if every enforced policy allowed.
//  - One error, chosen by priority: explicit denial > permanent failure > temporary failure
//    (deadline, caps) > crash (exception, trap, garbage); ties go to the earlier policy in
//    the configured order, so the same inputs always give the same answer.
//  - Every warning of every policy, kept also on denial.
//  - Patches combined with conflict detection (see patches.ts); none on DELETE or CONNECT.
//  - Per policy: failurePolicy Ignore turns its failure into a warning; enforcement `warn`
//    (a trial) turns its denial and its failure into warnings, and its patch yields to any
//    enforced patch it conflicts with; `audit` only reports (the caller logs and counts).
import type { JsonValue, Operation, PatchOperation } from '@portcullis/sdk';
import type { Outcome } from '../sandbox/outcome.ts';
import type { Enforcement, FailurePolicy } from '../policy/loaded.ts';
import type { Decision, DecisionPatch } from '../review/respond.ts';
import type { MergedPatch } from './offload.ts';
import { combinePatches, type CombinedPatch, type PolicyPatch } from './patches.ts';
import { WarningList } from './warnings.ts';

export interface Evaluated {
  policy: { name: string; failurePolicy: FailurePolicy; enforcement: Enforcement };
  outcome: Outcome;
}

export interface MergeResult<P extends DecisionPatch = DecisionPatch> {
  decision: Decision<P>;
  /** The outcome whose error became the response's status, if any. */
  deciding?: Outcome;
  /** Outcomes of audit-mode policies: reported, never enforced. */
  audited: Outcome[];
}

const PRIORITY = { denied: 0, permanent: 1, temporary: 2, crash: 3 } as const;
/** HTTP code for a policy failure (not a denial): the policy could not give an answer. */
export const FAILURE_CODE = 500;

interface Candidate {
  rank: number;
  order: number;
  outcome: Outcome;
  code: number;
  message: string;
}

/**
 * The patches merge combines for these outcomes: those of the allowed, enforced policies, when
 * the review can still be allowed and its object be patched; otherwise none. A caller may
 * combine them itself (offload.ts) and hand the result to merge.
 */
export function patchesToCombine(evaluated: Evaluated[], operation: Operation, object: ObjectSource): PolicyPatch[] {
  if (!(operation === 'CREATE' || operation === 'UPDATE')) return [];
  const patches: PolicyPatch[] = [];
  for (const { policy, outcome } of evaluated) {
    if (policy.enforcement === 'audit') continue;
    if (outcome.status === 'allowed') {
      if (outcome.patch.length > 0) {
        const patch: PolicyPatch = { policy: policy.name, operations: outcome.patch };
        if (policy.enforcement === 'warn') patch.trial = true;
        if (policy.failurePolicy === 'Ignore') patch.yields = true;
        patches.push(patch);
      }
    } else if (policy.enforcement !== 'warn' && (outcome.status === 'denied' || policy.failurePolicy !== 'Ignore')) {
      return []; // Denied whatever the patches say.
    }
  }
  return patches.length > 0 && (typeof object === 'function' ? object.present : object != null) ? patches : [];
}

/**
 * The object patches apply to, or a reader of it: the host parses a review's object only when
 * something needs it (parseScannedReview), and most reviews have no patch.
 */
export type ObjectSource = JsonValue | null | undefined | ObjectReader;

/** Reads the object when called; `present` says whether there is one without reading it. */
export interface ObjectReader {
  (): JsonValue | null | undefined;
  readonly present: boolean;
}

function objectOf(source: ObjectSource): JsonValue | null | undefined {
  return typeof source === 'function' ? source() : source;
}

/**
 * What a merge the host could not do gives: each patching policy fails, per its failurePolicy;
 * as a crash when the patches made it fail, temporarily when time did (`temporary`).
 */
export function unmerged(patches: PolicyPatch[], reason: string, temporary = false): CombinedPatch {
  const kind = temporary ? 'unmerged' as const : 'invalid' as const;
  return { patch: [], rejected: patches.map(({ policy }) => ({ policy, reason: kind, message: `the host could not merge its patch: ${reason}` })) };
}

/**
 * `combined`: the patches of patchesToCombine, already combined by the caller; else combined
 * here. The decision's patch is the operations, unless `combined` brought them as text.
 */
export function merge(evaluated: Evaluated[], operation: Operation, object: ObjectSource, combined?: CombinedPatch): MergeResult<PatchOperation[]>;
export function merge(evaluated: Evaluated[], operation: Operation, object: ObjectSource, combined: MergedPatch | undefined): MergeResult;
export function merge(evaluated: Evaluated[], operation: Operation, object: ObjectSource, combined?: MergedPatch): MergeResult {
  const warnings = new WarningList();
  const audited: Outcome[] = [];
  const candidates: Candidate[] = [];
  const byName = new Map(evaluated.map((e, order) => [e.policy.name, { ...e, order }]));

  const fail = (order: number, outcome: Outcome, rank: number, code: number, message: string) => {
    candidates.push({ rank, order, outcome, code, message: `policy "${outcome.policy}": ${message}` });
  };
  const failOrIgnore = (entry: Evaluated & { order: number }, rank: number, message: string) => {
    if (entry.policy.failurePolicy === 'Ignore') warnings.add(entry.policy.name, `failed and was ignored (failurePolicy Ignore): ${message}`, true);
    // A trial never stops a request (red team 4: a warn policy's crash, or its patch's conflict
    // with an enforced one, denied the request).
    else if (entry.policy.enforcement === 'warn') warnings.add(entry.policy.name, `failed, not enforced (enforcement: warn): ${message}`, true);
    else fail(entry.order, entry.outcome, rank, FAILURE_CODE, message);
  };

  evaluated.forEach((entry, order) => {
    const { policy, outcome } = entry;
    if (policy.enforcement === 'audit') {
      audited.push(outcome);
      return;
    }
    for (const warning of outcome.warnings) warnings.add(policy.name, warning);
    switch (outcome.status) {
      case 'allowed':
        break;
      case 'denied':
        if (policy.enforcement === 'warn') warnings.add(policy.name, `would deny (enforcement: warn): ${outcome.message}`, true);
        else fail(order, outcome, PRIORITY.denied, outcome.code, outcome.message);
        break;
      case 'failed':
        failOrIgnore({ ...entry, order }, PRIORITY[outcome.failure], outcome.message);
        break;
    }
  });

  let patch: DecisionPatch = [];
  const patches = patchesToCombine(evaluated, operation, object);
  if (patches.length > 0) {
    if (!combined) {
      try {
        combined = combinePatches(objectOf(object)!, patches);
      } catch (error) {
        // Nothing one policy did (those are rejections): the object itself, nested too deep for
        // the host to copy, or a fault of the merge. Never a 500 for the review: each patching
        // policy fails, per its failurePolicy.
        combined = unmerged(patches, error instanceof Error ? error.message : String(error));
      }
    }
    patch = combined.patch;
    for (const rejection of combined.rejected) {
      const entry = byName.get(rejection.policy)!;
      // A patch that cannot apply is the policy's own fault; a conflict is a permanent failure:
      // asking again gives the same two patches; a merge the host had no time for is temporary.
      const rank = rejection.reason === 'invalid' ? PRIORITY.crash : rejection.reason === 'unmerged' ? PRIORITY.temporary : PRIORITY.permanent;
      failOrIgnore(entry, rank, rejection.message);
    }
  }

  if (candidates.length === 0) return { decision: { allowed: true, warnings: warnings.list, patch }, audited };
  candidates.sort((a, b) => a.rank - b.rank || a.order - b.order);
  const chosen = candidates[0]!;
  return {
    decision: { allowed: false, status: { code: chosen.code, message: chosen.message }, warnings: warnings.list, patch: [] },
    deciding: chosen.outcome,
    audited,
  };
}
