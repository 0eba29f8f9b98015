// Every registry failure is one RegistryError: its `code` says what kind (so the fetcher can
// tell "registry down, use the cache" from "registry says no"), its message says what to do.
import { PortcullisError } from '../errors.ts';

export type RegistryErrorCode =
  | 'BAD_REFERENCE'
  | 'REGISTRY_UNAUTHORIZED'
  | 'REGISTRY_NOT_FOUND'
  | 'REGISTRY_UNREACHABLE'
  | 'REGISTRY_UNAVAILABLE'
  | 'REGISTRY_TLS'
  | 'REGISTRY_PROTOCOL'
  | 'DIGEST_MISMATCH'
  | 'MODULE_TOO_LARGE'
  | 'NO_WASM_LAYER'
  | 'SEVERAL_WASM_LAYERS'
  | 'UNSUPPORTED_MANIFEST';

export class RegistryError extends PortcullisError {
  declare readonly code: RegistryErrorCode;
  /** Failures that may pass on their own (network, 5xx, 429): the cache may stand in. */
  readonly transient: boolean;
  constructor(code: RegistryErrorCode, message: string, options: { cause?: unknown } = {}) {
    super(code, message, options);
    this.transient = code === 'REGISTRY_UNREACHABLE' || code === 'REGISTRY_UNAVAILABLE';
  }
}
