// Messages between the sandbox pool (main thread) and its workers.
import type { Grant } from '../config/types.ts';
import type { ContextChange } from '../context/store.ts';
import type { ModuleKind } from './module-kind.ts';

/** The guest functions a sandbox can call. Names are the contract's (wit/policy.wit). */
export type GuestFunction = 'metadata' | 'validate-settings' | 'validate' | 'mutate';

export interface SandboxSpec {
  key: string;
  /** The policy name, for messages. */
  policy: string;
  kind: ModuleKind;
  /** Core modules with their memory already capped. For a component, keyed by jco's file name. */
  modules: Record<string, WebAssembly.Module>;
  /** file: URL of the jco-transpiled glue (components only). */
  glue?: string;
  memoryCapBytes: number;
  maxOutputBytes: number;
  /** true: a new instance for every call (no state survives between calls). */
  fresh: boolean;
  /** Issue 15: the kinds this policy may read through portcullis:policy/context (none: every read is refused). */
  context?: Grant[];
}

/**
 * A review's input, shared by every policy that evaluates it: the envelope without settings,
 * UTF-8 encoded once into a SharedArrayBuffer (posting it to a worker copies nothing), and
 * the policy's own settings as JSON text. The worker puts them together.
 */
export interface SharedInput {
  envelope: Uint8Array;
  settings: string;
}

export type CallInput = string | SharedInput;

export type ToWorker =
  | { type: 'load'; spec: SandboxSpec }
  | { type: 'unload'; key: string }
  | { type: 'call'; id: number; key: string; fn: GuestFunction; input: CallInput }
  // Issue 15: changes to the worker's read-only replica of the context cache.
  | ContextChange;

export type LogEntry = [level: string, message: string];

/**
 * Why a call produced no usable output. `memory` and `output` are resource caps. `unloaded`:
 * the worker has no instance of the policy (it was replaced or reloaded meanwhile); the pool
 * queues such a call again rather than answer it.
 */
export type FaultKind = 'trap' | 'memory' | 'output' | 'instantiate' | 'unloaded';

export type FromWorker =
  | { type: 'loaded'; key: string; error?: string }
  | { type: 'result'; id: number; output: string; guestMicros: number; logs: LogEntry[] }
  | { type: 'fault'; id: number; fault: FaultKind; message: string; logs: LogEntry[] };
