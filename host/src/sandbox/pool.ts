// The sandbox pool: a fixed set of worker threads, each holding an instance of every loaded
// policy. Calls are queued and handed to idle workers, so policies of one request run in
// parallel up to the pool size. THE CPU DEADLINE IS ENFORCED HERE, for calls and for loading
// (instantiation and start functions): a guest that outlives its deadline gets its worker
// terminated (the only way to stop a guest in a tight loop) and a new worker takes its place.
// Neighbours are protected three ways: calls are started round-robin between policies, and a
// policy takes its last free worker only when no other policy is waiting, so one stuck at its
// deadline cannot starve the others; a worker takes calls only once it has loaded every
// policy; and a call that lands on a worker that does not have its policy is queued again,
// never answered wrongly. A queued call whose deadline passed is not started.
import { availableParallelism } from 'node:os';
import { extname } from 'node:path';
import { fileURLToPath } from 'node:url';
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
  requeued: number;
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
  loads: Map<string, { done: (error?: string) => void; timer: NodeJS.Timeout | undefined }>;
}

/** How long instantiating a policy (its start function included) may take in one worker. */
export const LOAD_TIMEOUT_MS = 10_000;
/** A call that found no instance of its policy in the worker it reached is retried this often. */
const REQUEUE_LIMIT = 3;

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

  readonly #loadTimeoutMs: number;
  /** Round-robin between policies: when each policy last had a call started. */
  #served = new Map<string, number>();
  #turn = 0;

  constructor(size = Math.max(2, availableParallelism()), options: { loadTimeoutMs?: number } = {}) {
    this.size = size;
    this.#loadTimeoutMs = options.loadTimeoutMs ?? LOAD_TIMEOUT_MS;
    for (let i = 0; i < size; i++) this.#slots.push(this.#spawn());
  }

  get stats(): PoolStats {
    return { size: this.size, busy: this.#slots.filter((s) => s.job).length, queued: this.#queue.length, restarts: this.#restarts };
  }

  /**
   * Loads (or replaces) a sandbox in every worker; rejects with the first error. One worker goes
   * first: a module that hangs or crashes while instantiating then costs one worker, not all.
   */
  async load(spec: SandboxSpec): Promise<void> {
    this.#specs.set(spec.key, spec);
    const [first, ...rest] = this.#slots;
    let error = await this.#loadInto(first!, spec, true);
    if (error === undefined && this.#specs.get(spec.key) === spec) {
      // Slots replaced meanwhile already received it; load only into those that have not.
      const others = rest.filter((slot) => this.#slots.includes(slot));
      error = (await Promise.all(others.map((slot) => this.#loadInto(slot, spec)))).find((e) => e !== undefined);
    }
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
    this.#served.delete(key);
    if (!this.#specs.delete(key)) return;
    for (const slot of this.#slots) this.#post(slot, { type: 'unload', key });
  }

  call(key: string, fn: GuestFunction, input: CallInput, timeoutMs: number): Promise<CallResult> {
    if (this.#closed) return Promise.reject(new PortcullisError('SANDBOX_CLOSED', 'the sandbox pool is shut down'));
    return new Promise((resolve) => {
      this.#queue.push({ id: this.#nextId++, requeued: 0, key, fn, input, timeoutMs, started: performance.now(), resolve });
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
    // worker.ts in the checkout, worker.js in the installed package: the same folder as this file.
    const worker = new Worker(new URL(`./worker${extname(fileURLToPath(import.meta.url))}`, import.meta.url), { stdout: false, stderr: false, resourceLimits: { maxOldGenerationSizeMb: 512 } });
    const slot: Slot = { worker, job: undefined, timer: undefined, loads: new Map() };
    for (const change of this.#contextSnapshot?.() ?? []) worker.postMessage(change); // issue 15: before any call
    worker.on('message', (message: FromWorker) => this.#onMessage(slot, message));
    worker.on('error', (error: Error) => this.#replace(slot, `its sandbox worker failed: ${error.message}`));
    worker.on('exit', () => {
      if (!this.#closed && this.#slots.includes(slot)) this.#replace(slot, 'its sandbox worker exited unexpectedly');
    });
    return slot;
  }

  /**
   * `probe`: the module's first load anywhere, under the load deadline. Once it has loaded in
   * one worker it is known to finish, so loading it into others (and into replacement workers,
   * which may be slow while the machine is overloaded) is not timed: dropping a policy that is
   * merely slow to load would turn its calls into failures.
   */
  #loadInto(slot: Slot, spec: SandboxSpec, probe = false): Promise<string | undefined> {
    return new Promise((resolve) => {
      // A start function that never returns holds the worker's only thread: only terminating it stops it.
      const timer = probe ? setTimeout(() => this.#loadExpired(slot, spec), this.#loadTimeoutMs) : undefined;
      slot.loads.set(spec.key, { done: resolve, timer });
      this.#post(slot, { type: 'load', spec });
    });
  }

  #loadExpired(slot: Slot, spec: SandboxSpec): void {
    if (!slot.loads.has(spec.key)) return;
    // Forget the policy first, so the replacement worker does not run the same start function.
    this.#specs.delete(spec.key);
    this.#replace(slot, `did not finish instantiating (its start function included) within ${seconds(this.#loadTimeoutMs)}`);
  }

  #post(slot: Slot, message: ToWorker): void {
    slot.worker.postMessage(message);
  }

  #dispatch(): void {
    for (const slot of this.#slots) {
      // A worker still loading policies would make a call wait behind instantiation, on its clock.
      if (slot.job || slot.loads.size > 0) continue;
      const job = this.#next();
      if (!job) return;
      slot.job = job;
      slot.timer = setTimeout(() => this.#expire(slot, job), job.timeoutMs);
      this.#post(slot, { type: 'call', id: job.id, key: job.key, fn: job.fn, input: job.input });
    }
  }

  /**
   * The next call to start: round-robin between policies (the queued call of the policy served
   * longest ago), preferring policies that occupy fewer than all workers but one, so a second
   * policy's call is never stuck behind one policy's flood. Calls that waited past their
   * deadline are answered, not started.
   */
  #next(capped = true): Job | undefined {
    const cap = capped && this.size > 1 ? this.size - 1 : this.size;
    const busy = new Map<string, number>();
    for (const slot of this.#slots) if (slot.job) busy.set(slot.job.key, (busy.get(slot.job.key) ?? 0) + 1);
    let best = -1;
    for (let i = 0; i < this.#queue.length; i++) {
      const job = this.#queue[i]!;
      const waited = performance.now() - job.started;
      if (waited >= job.timeoutMs) {
        this.#queue.splice(i--, 1);
        job.resolve(fault(job, 'deadline', `waited ${Math.round(waited)} ms for a sandbox, past its ${seconds(job.timeoutMs)} deadline; not started`));
        continue;
      }
      if ((busy.get(job.key) ?? 0) >= cap) continue;
      if (best < 0 || (this.#served.get(job.key) ?? 0) < (this.#served.get(this.#queue[best]!.key) ?? 0)) best = i;
    }
    // Work-conserving: when only policies at their share are waiting, one of them may take the last worker.
    if (best < 0) return capped && this.#queue.length > 0 ? this.#next(false) : undefined;
    const [job] = this.#queue.splice(best, 1);
    this.#served.set(job!.key, ++this.#turn);
    return job;
  }

  #onMessage(slot: Slot, message: FromWorker): void {
    if (message.type === 'loaded') {
      const pending = slot.loads.get(message.key);
      slot.loads.delete(message.key);
      clearTimeout(pending?.timer);
      pending?.done(message.error);
      this.#dispatch();
      return;
    }
    const job = slot.job;
    if (!job || job.id !== message.id) return;
    // The worker has no instance of this policy (it was replaced or reloaded meanwhile): while the
    // pool still has the policy, this is no answer about the request, so the call goes back in line.
    if (message.type === 'fault' && message.fault === 'unloaded' && this.#specs.has(job.key) && job.requeued < REQUEUE_LIMIT) {
      clearTimeout(slot.timer);
      slot.job = undefined;
      slot.timer = undefined;
      job.requeued++;
      this.#queue.unshift(job);
      this.#dispatch();
      return;
    }
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
    this.#replace(slot, `exceeded its ${seconds(job.timeoutMs)} CPU deadline`, 'deadline');
  }

  /** Terminates a worker (stuck or dead), fails its call, and puts a fresh worker in its place. */
  #replace(slot: Slot, reason: string, kind: CallFault = 'worker'): void {
    const index = this.#slots.indexOf(slot);
    if (index < 0 || this.#closed) return;
    this.#restarts++;
    const fresh = this.#spawn();
    this.#slots[index] = fresh;
    // Loads that were under way in the old worker carry on in the new one; only a policy the pool
    // has dropped (the one whose load expired) is told the reason.
    const pending = new Map(slot.loads);
    for (const { timer } of pending.values()) clearTimeout(timer);
    slot.loads.clear();
    void slot.worker.terminate();
    if (slot.job) this.#finish(slot, fault(slot.job, kind, reason));
    for (const spec of this.#specs.values()) {
      const waiting = pending.get(spec.key);
      // A first load that was still under way keeps its deadline in the new worker.
      void this.#loadInto(fresh, spec, waiting?.timer !== undefined).then((error) => waiting?.done(error));
    }
    for (const [key, { done }] of pending) if (!this.#specs.has(key)) done(reason);
    this.#dispatch();
  }
}

function seconds(ms: number): string {
  return ms >= 1000 ? `${ms / 1000}s` : `${ms}ms`;
}

function fault(job: Job, kind: CallFault, message: string): CallResult {
  return { ok: false, fault: kind, message, totalMicros: Math.round((performance.now() - job.started) * 1000), logs: [] };
}
