/**
 * Deny the request on purpose. The code and message reach the user as
 * `admission webhook "…" denied the request: <message>`.
 * 403 (Forbidden) unless you choose another code.
 */
export class AdmissionError extends Error {
  readonly code: number;
  constructor(message: string, code = 403) {
    super(message);
    this.name = 'AdmissionError';
    this.code = code;
  }
}

/** The policy cannot decide, and asking again will not change that. */
export class PermanentError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'PermanentError';
  }
}

/** The policy cannot decide now; the same request may succeed later. */
export class TemporaryError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'TemporaryError';
  }
}
