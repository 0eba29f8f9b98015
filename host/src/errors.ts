// Every error the host raises is a PortcullisError: a stable `code` from the catalog below (for
// logs, metrics, /readyz and tests), the HTTP status when the error answers a request, and a
// message an operator can act on (which policy, which request, what to do next). The catalog
// is the one list of codes: a new error adds its line here and its class where it is thrown.

export const ERRORS = {
  // Requests to the webhook (the status is the HTTP answer).
  BAD_ADMISSION_REVIEW: { status: 400, meaning: 'the body is not a usable AdmissionReview' },
  REQUEST_TIMEOUT: { status: 408, meaning: 'the client sent its headers or body too slowly' },
  BAD_HTTP: { status: 400, meaning: 'the request is not valid HTTP' },
  NOT_FOUND: { status: 404, meaning: 'no such endpoint' },
  UNKNOWN_POLICY: { status: 404, meaning: 'a per-policy endpoint for a policy or mode that is not configured' },
  METHOD_NOT_ALLOWED: { status: 405, meaning: 'wrong HTTP method for the endpoint' },
  BODY_TOO_LARGE: { status: 413, meaning: 'the body is above server.maxBodyBytes' },
  UNSUPPORTED_MEDIA_TYPE: { status: 415, meaning: 'the body is not application/json' },
  NOT_READY: { status: 503, meaning: 'the policies are still loading' },
  SERVER_BUSY: { status: 503, meaning: 'the request bodies held at once would pass server.maxBodyBytesInFlight' },
  INTERNAL_ERROR: { status: 500, meaning: 'a bug in the host; its log has the stack' },
  // Configuration and command line.
  BAD_CONFIGURATION: { meaning: 'the configuration file or a flag cannot be used' },
  USAGE: { meaning: 'wrong words on the command line' },
  BAD_REQUEST_INPUT: { meaning: 'portcullis run/test/bench: the request, manifest or settings file cannot be used' },
  BAD_TEST_SUITE: { meaning: 'portcullis test: a suite file cannot be used' },
  // Policies: loading them, and what they do when they run.
  POLICY_LOAD_FAILED: { meaning: 'a policy could not be loaded (its message says which step)' },
  POLICY_SETTINGS_INVALID: { meaning: 'a policy refused its settings, or they break its settings schema' },
  POLICY_METADATA_INVALID: { meaning: 'the portcullis.metadata section of a module is unusable' },
  MODULE_REFUSED: { meaning: 'a module asks for what the sandbox does not give, or is not WebAssembly' },
  MODULE_OVER_BUDGET: { meaning: 'a module declares more memory, tables or sections than its budget allows' },
  GUEST_FAULT: { meaning: 'a policy trapped, ran out of time or memory, or crashed its sandbox' },
  MERGE_FAILED: { meaning: 'the patches of one review could not be combined in time, or the merge itself failed' },
  MALFORMED_OUTPUT: { meaning: 'a policy answered outside the contract' },
  BAD_SELECTOR: { meaning: 'a policy listed cluster objects with a selector that does not parse' },
  CONTEXT_NOT_GRANTED: { meaning: 'a policy read a kind of cluster object it is not granted' },
  CONTEXT_BAD_REQUEST: { meaning: 'a policy asked for cluster objects in a way the contract does not allow' },
  CONTEXT_TOO_LARGE: { meaning: 'a policy\'s list of cluster objects is above the output limit' },
  CONTEXT_NOT_SYNCED: { meaning: 'the cache of a granted kind has not synced yet (temporary)' },
  CONTEXT_CACHE_FAILED: { meaning: 'the cache of a granted kind could not be kept (RBAC, API errors)' },
  SANDBOX_LOAD_FAILED: { meaning: 'a module could not be instantiated in a sandbox worker' },
  SANDBOX_CLOSED: { meaning: 'the sandbox pool was shut down' },
  // Registries.
  BAD_REFERENCE: { meaning: 'an oci:// reference does not parse' },
  REGISTRY_UNAUTHORIZED: { meaning: 'the registry refused the credentials (or there were none)' },
  REGISTRY_NOT_FOUND: { meaning: 'no such repository, tag or digest' },
  REGISTRY_UNREACHABLE: { meaning: 'the registry could not be reached (the cache may stand in)' },
  REGISTRY_UNAVAILABLE: { meaning: 'the registry answered 5xx or 429 (the cache may stand in)' },
  REGISTRY_TLS: { meaning: 'the registry\'s certificate is not trusted' },
  REGISTRY_PROTOCOL: { meaning: 'the registry answered something the OCI distribution spec does not allow' },
  DIGEST_MISMATCH: { meaning: 'content does not match its digest' },
  MODULE_TOO_LARGE: { meaning: 'a registry layer is larger than the module limit' },
  NO_WASM_LAYER: { meaning: 'the artifact holds no Wasm layer' },
  SEVERAL_WASM_LAYERS: { meaning: 'the artifact holds more than one Wasm layer' },
  UNSUPPORTED_MANIFEST: { meaning: 'the manifest type is not one Portcullis reads' },
  // The cluster.
  KUBECONFIG_UNUSABLE: { meaning: 'no usable cluster credentials' },
  KUBE_API_FAILED: { meaning: 'a call to the Kubernetes API failed' },
  NOT_LEADER: { meaning: 'a cluster write was fenced off: this replica no longer holds the Lease' },
  WEBHOOK_CONFIGURATION_FOREIGN: { meaning: 'a webhook configuration of the managed name exists and is not ours' },
  CERTIFICATE_INVALID: { meaning: 'a certificate or key does not parse, or they do not match' },
  CERTIFICATE_SECRET_UNUSABLE: { meaning: 'the certificate Secret cannot be read or written' },
} as const satisfies Record<string, { status?: number; meaning: string }>;

export type ErrorCode = keyof typeof ERRORS;

export class PortcullisError extends Error {
  readonly code: ErrorCode;
  constructor(code: ErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
    this.code = code;
  }

  /** The HTTP status the catalog gives this code; 500 for codes that never answer a request. */
  get httpStatus(): number {
    const entry = ERRORS[this.code] as { status?: number };
    return entry.status ?? 500;
  }
}

/** An HTTP request the webhook refuses before any policy runs. */
export class HttpError extends PortcullisError {}

/** A .wasm that cannot be used: unreadable, not WebAssembly, or asking for what the host will not give. */
export class PolicyLoadError extends PortcullisError {
  readonly policy: string;
  readonly reason: string;
  constructor(policy: string, reason: string, options?: { cause?: unknown }) {
    super('POLICY_LOAD_FAILED', `policy "${policy}" could not be loaded: ${reason}`, options);
    this.policy = policy;
    this.reason = reason;
  }
}

/** The policy's own settings check refused its settings. */
export class PolicySettingsError extends PortcullisError {
  readonly policy: string;
  readonly reason: string;
  /** `where`: where the settings came from, which is where to fix them. */
  constructor(policy: string, reason: string, where = 'the configuration') {
    super('POLICY_SETTINGS_INVALID', `policy "${policy}" refused its settings: ${reason}; fix the settings in ${where}`);
    this.policy = policy;
    this.reason = reason;
  }

  /** The same refusal, for settings that came from elsewhere (a flag, a test suite). */
  givenIn(where: string): PolicySettingsError {
    return new PolicySettingsError(this.policy, this.reason, where);
  }
}

/** The body of an HTTP request is not a usable AdmissionReview. */
export class ReviewError extends PortcullisError {
  constructor(message: string) {
    super('BAD_ADMISSION_REVIEW', message);
  }
}

/** A per-policy endpoint for a policy (or mode) that is not configured: HTTP 404. */
export class UnknownPolicyError extends PortcullisError {
  constructor(policy: string, mode: string, modes?: string[]) {
    super('UNKNOWN_POLICY', modes
      ? `policy "${policy}" does not ${mode} (it serves: ${modes.join(', ')})`
      : `no policy named "${policy}" is configured`);
  }
}

/** The configuration file (or CLI flags) cannot be used. */
export class ConfigError extends PortcullisError {
  constructor(message: string) {
    super('BAD_CONFIGURATION', message);
  }
}

/** The catalog code of an error, or INTERNAL_ERROR for anything that is not ours. */
export function errorCode(error: unknown): ErrorCode {
  return error instanceof PortcullisError ? error.code : 'INTERNAL_ERROR';
}

export function errorMessage(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
