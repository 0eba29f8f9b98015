// The sandbox pool: a fixed set of worker threads, each holding an instance of every loaded
// policy. Calls are queued and handed to the first idle worker, so policies of one request run
// in parallel up to the pool size. THE CPU DEADLINE IS ENFORCED HERE: a call that outlives its
// deadline gets its worker terminated (the only way to stop a guest in a tight loop) and a new
// worker takes its place; other calls and later requests are not affected.
import { availableParallelism } from 'node:os';
import { Worker } from 'node:worker_threads';
import { PortcullisError } from '../errors.ts';
import type { ContextChange } from '../context/store.ts';
import type { CallInput, FaultKind, FromWorker, GuestFunction, LogEntry, SandboxSpec, ToWorker } from './protocol.ts';

export type CallFault = FaultKind | 'deadline' | 'worker';

export type CallResult =
  | { ok: true; output: string; guestMicros: number; totalMicros: number; logs: LogEntry[] }
  | { ok: false; fault: CallFault; message: string; totalMicros: number; logs: LogEntry[] };

interface Job {
  id: number;
  key: string;
  fn: GuestFunction;
  input: CallInput;
  timeoutMs: number;
  started: number;
  resolve: (result: CallResult) => void;
}

interface Slot {
  worker: Worker;
  job: Job | undefined;
  timer: NodeJS.Timeout | undefined;
  loads: Map<string, (error?: string) => void>;
}

export interface PoolStats {
  size: number;
  busy: number;
  queued: number;
  restarts: number;
}

export class SandboxPool {
  readonly size: number;
  #slots: Slot[] = [];
  #queue: Job[] = [];
  #specs = new Map<string, SandboxSpec>();
  #nextId = 1;
  #restarts = 0;
  #closed = false;
  /** Issue 15: the context cache's current state, sent to every worker before anything else. */
  #contextSnapshot: (() => ContextChange[]) | undefined;

  constructor(size = Math.max(2, availableParallelism())) {
    this.size = size;
    for (let i = 0; i < size; i++) this.#slots.push(this.#spawn());
  }

  get stats(): PoolStats {
    return { size: this.size, busy: this.#slots.filter((s) => s.job).length, queued: this.#queue.length, restarts: this.#restarts };
  }

  /** Loads (or replaces) a sandbox in every worker; rejects with the first worker's error. */
  async load(spec: SandboxSpec): Promise<void> {
    this.#specs.set(spec.key, spec);
    const errors = await Promise.all(this.#slots.map((slot) => this.#loadInto(slot, spec)));
    const error = errors.find((e) => e !== undefined);
    if (error !== undefined) {
      this.unload(spec.key);
      throw new PortcullisError('SANDBOX_LOAD_FAILED', error);
    }
  }

  /** Issue 15: workers keep a replica of the context cache; this sends its state to each, now and on every restart. */
  attachContext(snapshot: () => ContextChange[]): void {
    this.#contextSnapshot = snapshot;
    for (const slot of this.#slots) for (const change of snapshot()) this.#post(slot, change);
  }

  /** Issue 15: one change to the context cache, for every worker's replica. */
  broadcastContext(change: ContextChange): void {
    for (const slot of this.#slots) this.#post(slot, change);
  }

  unload(key: string): void {
    if (!this.#specs.delete(key)) return;
    for (const slot of this.#slots) this.#post(slot, { type: 'unload', key });
  }

  call(key: string, fn: GuestFunction, input: CallInput, timeoutMs: number): Promise<CallResult> {
    if (this.#closed) return Promise.reject(new PortcullisError('SANDBOX_CLOSED', 'the sandbox pool is shut down'));
    return new Promise((resolve) => {
      this.#queue.push({ id: this.#nextId++, key, fn, input, timeoutMs, started: performance.now(), resolve });
      this.#dispatch();
    });
  }

  async close(): Promise<void> {
    this.#closed = true;
    for (const job of this.#queue.splice(0)) job.resolve(fault(job, 'worker', 'the sandbox pool shut down'));
    await Promise.all(this.#slots.map((slot) => {
      if (slot.job) this.#finish(slot, fault(slot.job, 'worker', 'the sandbox pool shut down'));
      return slot.worker.terminate();
    }));
  }

  #spawn(): Slot {
    // Linear memories are capped per module; this caps the worker's own JS heap (jco glue,
    // strings lifted out of guests) so a runaway there kills this worker, not the host.
    const worker = new Worker(new URL('./worker.ts', import.meta.url), { stdout: false, stderr: false, resourceLimits: { maxOldGenerationSizeMb: 512 } });
    const slot: Slot = { worker, job: undefined, timer: undefined, loads: new Map() };
    for (const change of this.#contextSnapshot?.() ?? []) worker.postMessage(change); // issue 15: before any call
    worker.on('message', (message: FromWorker) => this.#onMessage(slot, message));
    worker.on('error', (error) => this.#replace(slot, `its sandbox worker failed: ${error.message}`));
    worker.on('exit', () => {
      if (!this.#closed && this.#slots.includes(slot)) this.#replace(slot, 'its sandbox worker exited unexpectedly');
    });
    return slot;
  }

  #loadInto(slot: Slot, spec: SandboxSpec): Promise<string | undefined> {
    return new Promise((resolve) => {
      slot.loads.set(spec.key, resolve);
      this.#post(slot, { type: 'load', spec });
    });
  }

  #post(slot: Slot, message: ToWorker): void {
    slot.worker.postMessage(message);
  }

  #dispatch(): void {
    for (const slot of this.#slots) {
      if (this.#queue.length === 0) return;
      if (slot.job) continue;
      const job = this.#queue.shift()!;
      slot.job = job;
      slot.timer = setTimeout(() => this.#expire(slot, job), job.timeoutMs);
      this.#post(slot, { type: 'call', id: job.id, key: job.key, fn: job.fn, input: job.input });
    }
  }

  #onMessage(slot: Slot, message: FromWorker): void {
    if (message.type === 'loaded') {
      const done = slot.loads.get(message.key);
      slot.loads.delete(message.key);
      done?.(message.error);
      return;
    }
    const job = slot.job;
    if (!job || job.id !== message.id) return;
    const totalMicros = Math.round((performance.now() - job.started) * 1000);
    this.#finish(slot, message.type === 'result'
      ? { ok: true, output: message.output, guestMicros: message.guestMicros, totalMicros, logs: message.logs }
      : { ok: false, fault: message.fault, message: message.message, totalMicros, logs: message.logs });
  }

  #finish(slot: Slot, result: CallResult): void {
    const job = slot.job;
    clearTimeout(slot.timer);
    slot.job = undefined;
    slot.timer = undefined;
    job?.resolve(result);
    this.#dispatch();
  }

  #expire(slot: Slot, job: Job): void {
    if (slot.job !== job) return;
    const seconds = job.timeoutMs >= 1000 ? `${job.timeoutMs / 1000}s` : `${job.timeoutMs}ms`;
    this.#replace(slot, `exceeded its ${seconds} CPU deadline`, 'deadline');
  }

  /** Terminates a worker (stuck or dead), fails its call, and puts a fresh worker in its place. */
  #replace(slot: Slot, reason: string, kind: CallFault = 'worker'): void {
    const index = this.#slots.indexOf(slot);
    if (index < 0 || this.#closed) return;
    this.#restarts++;
    const fresh = this.#spawn();
    this.#slots[index] = fresh;
    for (const done of slot.loads.values()) done(reason);
    slot.loads.clear();
    void slot.worker.terminate();
    if (slot.job) this.#finish(slot, fault(slot.job, kind, reason));
    for (const spec of this.#specs.values()) void this.#loadInto(fresh, spec);
    this.#dispatch();
  }
}

function fault(job: Job, kind: CallFault, message: string): CallResult {
  return { ok: false, fault: kind, message, totalMicros: Math.round((performance.now() - job.started) * 1000), logs: [] };
}
