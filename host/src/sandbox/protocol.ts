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
  /** Components only: the content hash of each core module as jco wrote it (uncapped), in the transpile cache (for the inline lane's metered copy). */
  cores?: Record<string, string>;
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
  /**
   * For a guest whose SDK reads values apart (metadata `input: ["objects-apart"]`): large values
   * of the request (the object and oldObject, or their large members), each as bytes [start,
   * end) of the envelope and the keys to its place in the input. The worker passes them
   * after the JSON (joinInput).
   */
  apart?: readonly Deferred[];
}

export type Deferred = readonly [start: number, end: number, path: readonly string[]];

export type CallInput = string | SharedInput;

/** One guest call of a batch. */
export interface CallRequest {
  id: number;
  key: string;
  fn: GuestFunction;
  input: CallInput;
  /** On the shared clock: a call still waiting in its batch by then is not started. */
  notAfter: number;
}

export type ToWorker =
  | { type: 'load'; spec: SandboxSpec }
  | { type: 'unload'; key: string }
  // Issue 14: every call a worker runs for one review travels in one message (`batch` names it),
  // and their answers come back in one. Run in order, batches too; `first` is the first call's
  // number in the worker's sequence (see Progress).
  | { type: 'call'; batch: number; first: number; calls: CallRequest[] }
  // Issue 15: changes to the worker's read-only replica of the context cache.
  | ContextChange;

export type LogEntry = [level: string, message: string];

/**
 * Why a call produced no usable output. `memory` and `output` are resource caps. `unloaded`:
 * the worker has no instance of the policy (it was replaced or reloaded meanwhile); the pool
 * queues such a call again rather than answer it. `late`: its deadline passed while it waited
 * behind the calls before it in its batch; not started (the pool reports it as a deadline).
 */
export type FaultKind = 'trap' | 'memory' | 'output' | 'instantiate' | 'unloaded' | 'late';

export type CallAnswer =
  /** `compact`: the output is sandbox/outcome.ts compactOutput's, read in the worker. */
  | { ok: true; output: string; guestMicros: number; logs: LogEntry[]; compact?: boolean }
  | { ok: false; fault: FaultKind; message: string; logs: LogEntry[] };

/** `spentMicros`: the worker's (wall) time on the call, instantiation included (the pool's guide to what may share a message). */
export type CallReply = CallAnswer & { spentMicros: number };

export type FromWorker =
  /**
   * `micros`: how long instantiating it took in this worker, its start function included;
   * `cpuMicros`: the worker thread's CPU time in it (the same, unless the machine was busy).
   */
  | { type: 'loaded'; key: string; error?: string; micros?: number; cpuMicros?: number }
  | { type: 'results'; batch: number; replies: CallReply[] };

/**
 * Issue 14: a worker runs its calls one after another, each under its own deadline, and answers
 * a batch only when all its calls are done; the pool may post the next batch before the last
 * one's answer is back (so a worker never waits for the main thread between batches). Calls are
 * numbered in one sequence per worker, batch after batch, and the worker says in shared memory
 * which number runs since when, so the pool can tell which call outlived its deadline without a
 * message per call. Numbers are int32 and wrap; only differences are compared.
 */
export class Progress {
  readonly buffer: SharedArrayBuffer;
  readonly #seq: Int32Array;
  readonly #since: Float64Array;
  constructor(buffer = new SharedArrayBuffer(16)) {
    this.buffer = buffer;
    this.#seq = new Int32Array(buffer, 0, 1);
    this.#since = new Float64Array(buffer, 8, 1);
  }

  /** Call number `seq` starts now (the number after a batch's last: the worker has nothing to run). */
  mark(seq: number): void {
    this.#since[0] = clock();
    // The atomic store publishes the time written before it.
    Atomics.store(this.#seq, 0, seq | 0);
  }

  /** The number of the call running now (see mark), without the time: for polling. */
  seq(): number {
    return Atomics.load(this.#seq, 0);
  }

  read(): { seq: number; since: number } {
    return { seq: this.seq(), since: this.#since[0]! };
  }
}

/** Milliseconds on a clock the main thread and the workers share (each thread's performance.now() has its own origin). */
export function clock(): number {
  return performance.timeOrigin + performance.now();
}
