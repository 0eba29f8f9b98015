// merge() as the host's API gives it: outcomes whose patch is operations, as evaluatePolicy
// gives them. Inside the host an outcome's patch may be text until the merger's thread
// (sandbox/outcome.ts PATCH_TEXT_FROM); merge hands back the outcomes it was given, so what
// comes in as operations goes out as operations (review: the text type had leaked into the API).
import type { Operation, PatchOperation } from '@portcullis/sdk';
import type { PublicOutcome } from './evaluate/evaluate.ts';
import { merge as mergeOutcomes, type Evaluated as AnyEvaluated, type MergeResult as AnyMergeResult, type ObjectSource } from './merge/merge.ts';
import type { CombinedPatch } from './merge/patches.ts';

export interface Evaluated extends Omit<AnyEvaluated, 'outcome'> {
  outcome: PublicOutcome;
}

export interface MergeResult extends Omit<AnyMergeResult<PatchOperation[]>, 'deciding' | 'audited'> {
  deciding?: PublicOutcome;
  audited: PublicOutcome[];
}

export const merge = mergeOutcomes as (evaluated: Evaluated[], operation: Operation, object: ObjectSource, combined?: CombinedPatch) => MergeResult;
