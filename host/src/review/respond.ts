// Builds the AdmissionReview that goes back to the apiserver, in the version it asked for.
import type { ReviewVersion } from './parse.ts';
import { stringifyAnyDepth } from '../util/deep-json.ts';
import { operationsOf, type PatchText, type SomePatch } from '../util/patch-text.ts';

/** `P`: a decision merged in place holds the operations; one merged on the merger's thread may hold their text. */
export interface Decision<P extends DecisionPatch = DecisionPatch> {
  allowed: boolean;
  /** Present when denied (and for allowed responses that carry a message). */
  status?: { code: number; message: string };
  warnings: string[];
  patch: P;
}

/**
 * A patch the merger's thread combined, as the JSON text it made there: the response carries
 * that text as it is. Parsing it back and serializing it again took the main thread ~20 ms for
 * a pair of policies at the patch cap (merge/offload.ts).
 */
export type EncodedPatch = PatchText;

export type DecisionPatch = SomePatch;

/** The operations of a decision's patch, parsing them if they came as text. */
export const patchOperations = operationsOf;

export interface AdmissionResponseReview {
  apiVersion: ReviewVersion;
  kind: 'AdmissionReview';
  response: {
    uid: string;
    allowed: boolean;
    status?: { code: number; message: string; reason?: string };
    warnings?: string[];
    patch?: string;
    patchType?: 'JSONPatch';
  };
}

export function respond(apiVersion: ReviewVersion, uid: string, decision: Decision): AdmissionResponseReview {
  const response: AdmissionResponseReview['response'] = { uid, allowed: decision.allowed };
  if (decision.status) response.status = { ...decision.status };
  if (decision.warnings.length > 0) response.warnings = decision.warnings;
  if (decision.allowed && decision.patch.length > 0) {
    const { patch } = decision;
    // The combined patch may carry a value of the object nested deeper than JSON.stringify recurses.
    response.patch = Buffer.from(Array.isArray(patch) ? stringifyAnyDepth(patch) : patch.json).toString('base64');
    response.patchType = 'JSONPatch';
  }
  return { apiVersion, kind: 'AdmissionReview', response };
}
