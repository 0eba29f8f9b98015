// Builds the AdmissionReview that goes back to the apiserver, in the version it asked for.
import type { PatchOperation } from '@portcullis/sdk';
import type { ReviewVersion } from './parse.ts';

export interface Decision {
  allowed: boolean;
  /** Present when denied (and for allowed responses that carry a message). */
  status?: { code: number; message: string };
  warnings: string[];
  patch: PatchOperation[];
}

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
    response.patch = Buffer.from(JSON.stringify(decision.patch)).toString('base64');
    response.patchType = 'JSONPatch';
  }
  return { apiVersion, kind: 'AdmissionReview', response };
}
