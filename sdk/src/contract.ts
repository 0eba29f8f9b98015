// The JSON envelopes that cross the host/guest boundary (see wit/policy.wit for why JSON).
// The host validates every guest output against these shapes; nothing here is trusted.

export type JsonValue = null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue };
export type JsonObject = { [key: string]: JsonValue };

export type Operation = 'CREATE' | 'UPDATE' | 'DELETE' | 'CONNECT';

export interface GroupVersionKind { group: string; version: string; kind: string }
export interface GroupVersionResource { group: string; version: string; resource: string }

export interface UserInfo {
  username?: string;
  uid?: string;
  groups?: string[];
  extra?: Record<string, string[]>;
}

/** The `request` of an AdmissionReview, as the apiserver sends it (v1 and v1beta1 alike). */
export interface AdmissionRequest {
  uid: string;
  kind: GroupVersionKind;
  resource: GroupVersionResource;
  subResource?: string;
  requestKind?: GroupVersionKind;
  requestResource?: GroupVersionResource;
  requestSubResource?: string;
  name?: string;
  namespace?: string;
  operation: Operation;
  userInfo: UserInfo;
  object?: JsonObject | null;
  oldObject?: JsonObject | null;
  dryRun?: boolean;
  options?: JsonObject | null;
}

/**
 * The verified TLS client certificate of the caller (usually the apiserver), if any. A name
 * attribute given once is a string; given several times (two `O`s: a client certificate's
 * groups) it is the list of them, never one joined string that a comma in a value could forge.
 */
export interface PeerCertificate {
  subject: Record<string, string | string[]>;
  issuer: Record<string, string | string[]>;
  serialNumber: string;
  validFrom: string;
  validTo: string;
  fingerprint256: string;
}

/** What the host passes to `validate` and `mutate`. */
export interface EvaluationInput {
  request: AdmissionRequest;
  settings: JsonValue;
  /** All HTTP request headers, lower-cased names. */
  headers: Record<string, string>;
  sslpeer: PeerCertificate | null;
  dryRun: boolean;
  /** The endpoint that was called, e.g. `/validate/numbers` or `/mutate`. */
  webhook: string;
}

export type PatchOperation =
  | { op: 'add' | 'replace' | 'test'; path: string; value: JsonValue }
  | { op: 'remove'; path: string }
  | { op: 'move' | 'copy'; from: string; path: string };

/**
 * How a policy can fail, from the most to the least specific. The host merges failures by
 * this priority (an explicit denial wins over a policy error, which wins over a crash).
 *  - permanent: the policy cannot decide and retrying will not help (bad settings, bug).
 *  - temporary: retrying may help (a dependency was unavailable, a resource cap was hit).
 *  - exception: anything the policy did not mean to happen (uncaught throw, trap).
 */
export type ErrorKind = 'permanent' | 'temporary' | 'exception';

export type EvaluationOutput =
  | { outcome: 'allow'; warnings?: string[]; patch?: PatchOperation[] }
  | { outcome: 'deny'; code: number; message: string; warnings?: string[] }
  | { outcome: 'error'; kind: ErrorKind; message: string; warnings?: string[] };

export type Mode = 'validate' | 'mutate';

export interface PolicyMetadata {
  modes: Mode[];
  /** True when the policy checks its settings itself (validate-settings is meaningful). */
  settings: boolean;
  /**
   * Forms of input this SDK reads besides plain JSON. `objects-apart`: the request's `object`
   * and `oldObject` may come after the JSON, each parsed when the policy first reads it
   * (docs/policy-contract.md, Input). Absent in modules built before it: they get plain JSON.
   * `nested-apart`: a value apart may itself be in that form (large maps and lists inside the
   * object's members, such as a Pod's containers); modules without it get no value nested.
   */
  input?: InputForm[];
}

export type InputForm = 'objects-apart' | 'nested-apart';

export type SettingsVerdict = { valid: true } | { valid: false; message: string };
