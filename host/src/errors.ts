// Every error the host raises is a PortcullisError: a stable `code` for logs and tests, and
// a message an operator can act on (which policy, which request, what to do next).

export class PortcullisError extends Error {
  readonly code: string;
  constructor(code: string, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
    this.code = code;
  }
}

/** A .wasm that cannot be used: unreadable, not WebAssembly, or asking for what the host will not give. */
export class PolicyLoadError extends PortcullisError {
  readonly policy: string;
  constructor(policy: string, reason: string, options?: { cause?: unknown }) {
    super('POLICY_LOAD_FAILED', `policy "${policy}" could not be loaded: ${reason}`, options);
    this.policy = policy;
  }
}

/** The policy's own settings check refused its settings. */
export class PolicySettingsError extends PortcullisError {
  readonly policy: string;
  constructor(policy: string, reason: string) {
    super('POLICY_SETTINGS_INVALID', `policy "${policy}" refused its settings: ${reason}; fix the settings in the configuration`);
    this.policy = policy;
  }
}

/** The body of an HTTP request is not a usable AdmissionReview. */
export class ReviewError extends PortcullisError {
  readonly status: number;
  constructor(message: string, status = 400) {
    super('BAD_ADMISSION_REVIEW', message);
    this.status = status;
  }
}

/** A per-policy endpoint for a policy (or mode) that is not configured: HTTP 404. */
export class UnknownPolicyError extends PortcullisError {
  readonly status = 404;
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

export function errorMessage(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
