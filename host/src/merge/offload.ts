// Combines large patches on a thread of their own. Composing two policies' patches of 10,000
// operations each took the main thread 0.1-0.15 s per review (check each alone, index writes,
// apply, diff, replay), during which no other review was read or answered. A review whose
// patches are small is combined in place (a message to a thread costs more than that); a large
// one waits for the merger, one review at a time, within its deadline. A review whose deadline
// passes gets its answer then (its patching policies fail, temporarily, per their
// failurePolicy) while its merge runs on: starting a new thread costs ~0.2 s, more than a merge
// at the cap. Only a merge still running after HARD_CAP_MS is stopped with its thread.
import { extname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';
import type { JsonValue } from '@portcullis/sdk';
import { PortcullisError } from '../errors.ts';
import type { DecisionPatch } from '../review/respond.ts';
import { combinePatches, type CombinedPatch, type PatchRejection, type PolicyPatch } from './patches.ts';
import { parsePointer, valueAt } from './json-patch.ts';

/** From this many operations in all, several policies' patches are combined off the main thread (~3 ms in place). */
export const OFFLOAD_FROM_OPERATIONS = 256;
/** One policy's patch is only checked, ~3 µs an operation: handing it over pays from about this many. */
export const OFFLOAD_ALONE_FROM_OPERATIONS = 2048;
/**
 * Copies and moves clone what they read, up to MAX_COPIED_BYTES for a patch, once to index it and
 * once to apply it: red team 11, 150 copies of `/spec` (6 KB of answer) cost the main thread
 * 10-17 ms before that bound refused them. A few, from small values of the object, are combined
 * in place; more go to the merger (review: every single-`move` rename sent there made a burst of
 * 128 reviews fail on the merger's queue). A copy of a copy doubles, so the count is small.
 */
const MAX_CLONES_IN_PLACE = 4;
/** Members and elements, in all, of the values those few may read from the object. */
const MAX_CLONED_NODES_IN_PLACE = 1000;
/**
 * A review this large (its envelope: the request's bytes) is merged on the thread, which parses
 * its object there: parsing costs by values, and a body sent straight to the webhook may hold a
 * megabyte of tiny maps in its object (red team, session 48: 100-430 ms of the main thread for
 * 1-2 MiB of them elsewhere in the request). A Pod's review is a few KB.
 */
export const OFFLOAD_FROM_ENVELOPE_BYTES = 128 * 1024;
/** Longest a review waits for its merge when the caller gives no deadline. */
export const MAX_MERGE_MS = 10_000;
/** A merge running this long is not a merge at the cap (0.1-0.3 s): its thread is stopped. */
export const HARD_CAP_MS = 3_000;
/**
 * Reviews waiting for the merger at most, and the patches they bring, as characters of JSON (an
 * operation of a parsed patch counted as 64). Each review holds its object and patches (about
 * 1.5 MB for two at the operation cap) until its turn or its deadline: unbounded, a burst of such
 * reviews would pile up hundreds of megabytes, and at 0.1-0.3 s a merge, one later in the line
 * would mostly wait out its deadline anyway. Counted by size, not reviews: the merger also takes
 * ordinary patches (copies, moves, ones a worker kept as text), which a burst of Pod creates
 * brings by the hundred (review: at 16 reviews, 42 of 128 such reviews failed).
 */
export const MAX_WAITING_MERGES = 256;
export const MAX_WAITING_PATCH_CHARS = 16 * 2 ** 20;

/**
 * The object travels as the review's envelope when there is one (shared memory: not copied, and
 * parsed on the thread, where JSON.parse does not recurse), else as a structured clone, which
 * recurses: about 3,300 levels of nesting overflow it on the main thread, where the apiserver
 * allows 10,000 (red team).
 */
export type MergeRequest = { id: number; patches: PolicyPatch[] } & ({ object: JsonValue } | { envelope: Uint8Array });
/** A combined patch as the merger gives it: from its thread, the operations as JSON text (respond.ts). */
export interface MergedPatch {
  patch: DecisionPatch;
  rejected: PatchRejection[];
}

export type MergeReply =
  | { id: number; ok: true; combined: MergedPatch }
  | { id: number; ok: false; message: string }
  /** Sent once the thread has loaded the merge code: its start-up does not count as merging. */
  | { ready: true };

export class MergeError extends PortcullisError {
  /** The host's doing (time, shutdown), not the patches': the policies fail temporarily. */
  readonly temporary: boolean;
  constructor(message: string, temporary: boolean) {
    super('MERGE_FAILED', message);
    this.temporary = temporary;
  }
}

interface Job {
  request: MergeRequest;
  /** Its patches' size, against MAX_WAITING_PATCH_CHARS. */
  chars: number;
  resolve: (combined: MergedPatch) => void;
  reject: (error: MergeError) => void;
  /** The review's deadline. */
  timer: NodeJS.Timeout | undefined;
  settled: boolean;
}

export class PatchMerger {
  #worker: Worker | undefined;
  #queue: Job[] = [];
  /** The job on the thread now: settled already if its review stopped waiting. */
  #running: Job | undefined;
  #hardCap: NodeJS.Timeout | undefined;
  /** The thread has loaded the merge code (see MergeReply). */
  #ready = false;
  #next = 0;
  #closed = false;
  readonly #hardCapMs: number;

  constructor(options: { hardCapMs?: number } = {}) {
    this.#hardCapMs = options.hardCapMs ?? HARD_CAP_MS;
  }

  /**
   * The combined patch of `patches` on `object`, as combinePatches gives it. Small ones are
   * combined now; large ones on the merger's thread. Rejects with a MergeError when the merge
   * fails or does not finish within `withinMs`.
   */
  combine(object: JsonValue | (() => JsonValue), patches: PolicyPatch[], withinMs = MAX_MERGE_MS, envelope?: Uint8Array): Promise<MergedPatch> {
    // A reader is called only if the object is needed here: with an envelope the thread parses it.
    const read = (): JsonValue => (typeof object === 'function' ? object() : object);
    let operations = 0;
    let chars = 0;
    // A patch a worker kept as text (sandbox/outcome.ts PATCH_TEXT_FROM) is merged there: parsing it is the cost.
    let text = false;
    const clones: { op: 'copy' | 'move'; from: string }[] = [];
    for (const p of patches) {
      operations += p.operations.length;
      if (!Array.isArray(p.operations)) {
        text = true;
        chars += p.operations.json.length;
        continue;
      }
      chars += p.operations.length * 64;
      for (const op of p.operations) if (op.op === 'copy' || op.op === 'move') clones.push(op);
    }
    const large = text || operations >= (patches.length > 1 ? OFFLOAD_FROM_OPERATIONS : OFFLOAD_ALONE_FROM_OPERATIONS)
      || (envelope !== undefined && envelope.length >= OFFLOAD_FROM_ENVELOPE_BYTES)
      || (clones.length > 0 && !fewSmallClones(clones, read));
    if (!large || this.#closed) return inPlace(read(), patches);
    const ms = Math.min(withinMs, MAX_MERGE_MS);
    if (!(ms > 0)) return Promise.reject(new MergeError('the review\'s deadline had passed before its patches could be merged', true));
    const waiting = this.#queue.reduce((sum, job) => sum + job.chars, 0);
    if (this.#queue.length >= MAX_WAITING_MERGES || waiting + chars > MAX_WAITING_PATCH_CHARS) {
      return Promise.reject(new MergeError(`${this.#queue.length} other reviews' patches (${(waiting / 2 ** 20).toFixed(1)} MiB of them) were waiting to be merged already`, true));
    }
    return new Promise((resolve, reject) => {
      const id = ++this.#next;
      const request: MergeRequest = envelope ? { id, patches, envelope } : { id, patches, object: read() };
      const job: Job = { request, chars, resolve, reject, timer: undefined, settled: false };
      job.timer = setTimeout(() => this.#late(job, ms), ms);
      this.#queue.push(job);
      this.#start();
    });
  }

  /** Stops the thread; merges still waiting fail, later ones are combined in place. */
  async close(): Promise<void> {
    this.#closed = true;
    for (const job of [...this.#queue, ...(this.#running ? [this.#running] : [])]) this.#settle(job, new MergeError('the host is shutting down', true));
    this.#queue = [];
    await this.#stopThread();
  }

  /** Never throws: it runs from timers and the thread's events, where a throw would end the process. */
  #start(): void {
    while (!this.#running && this.#queue.length > 0) {
      const job = this.#queue.shift()!;
      if (job.settled) continue;
      try {
        this.#thread().postMessage(job.request);
      } catch (error) {
        // Not merged here instead: that is the stall the thread exists to remove (red team: deep
        // objects without an envelope, merged in place, held the main thread 0.2-0.4 s each).
        const tooDeep = error instanceof RangeError || (error instanceof Error && error.name === 'DataCloneError');
        this.#settle(job, new MergeError(tooDeep
          ? 'the object nests too deep to hand to the merging thread'
          : `the merging thread could not take it (${error instanceof Error ? error.message : String(error)})`, true));
        if (!tooDeep) void this.#stopThread();
        continue;
      }
      this.#running = job;
      if (this.#ready) this.#armHardCap();
    }
  }

  #armHardCap(): void {
    const job = this.#running;
    if (!job || this.#hardCap) return;
    this.#hardCap = setTimeout(() => {
      this.#settle(job, new MergeError(`merging the patches took longer than ${this.#hardCapMs} ms`, true));
      void this.#stopThread();
      this.#start();
    }, this.#hardCapMs);
  }

  #thread(): Worker {
    if (this.#worker) return this.#worker;
    // merge-worker.ts in the checkout, merge-worker.js in the installed package.
    const worker = new Worker(new URL(`./merge-worker${extname(fileURLToPath(import.meta.url))}`, import.meta.url), {
      stdout: false, stderr: false, resourceLimits: { maxOldGenerationSizeMb: 512 },
    });
    // Not a reason to keep the process alive: a review waiting on it holds its own socket.
    worker.unref();
    worker.on('message', (reply: MergeReply) => {
      if (this.#worker !== worker) return;
      if ('ready' in reply) {
        this.#ready = true;
        this.#armHardCap();
        return;
      }
      const job = this.#running;
      if (!job || job.request.id !== reply.id) return;
      this.#done();
      this.#settle(job, reply.ok ? reply.combined : new MergeError(reply.message, false));
      this.#start();
    });
    const lost = (why: string) => {
      if (this.#worker !== worker) return;
      this.#worker = undefined;
      const job = this.#running;
      this.#done();
      if (job) this.#settle(job, new MergeError(why, true));
      this.#start();
    };
    worker.on('error', (error: Error) => lost(`the merging thread failed: ${error.message}`));
    worker.on('exit', (code) => lost(`the merging thread stopped (exit code ${code})`));
    this.#worker = worker;
    this.#ready = false;
    return worker;
  }

  #done(): void {
    clearTimeout(this.#hardCap);
    this.#hardCap = undefined;
    this.#running = undefined;
  }

  async #stopThread(): Promise<void> {
    const worker = this.#worker;
    this.#worker = undefined;
    this.#done();
    await worker?.terminate();
  }

  #late(job: Job, ms: number): void {
    if (job.settled) return;
    // Running: the review stops waiting, the merge runs on (the thread is worth more than it).
    // Waiting: it is never started.
    const running = this.#running === job;
    const at = this.#queue.indexOf(job);
    if (at >= 0) this.#queue.splice(at, 1);
    this.#settle(job, new MergeError(running
      ? `merging the patches took longer than the ${ms} ms the review had left`
      : `merging the patches waited ${ms} ms behind other reviews' and was not started`, true));
  }

  #settle(job: Job, result: MergedPatch | MergeError): void {
    if (job.settled) return;
    job.settled = true;
    clearTimeout(job.timer);
    if (result instanceof MergeError) job.reject(result);
    else job.resolve(result);
  }
}

function inPlace(object: JsonValue, patches: PolicyPatch[]): Promise<CombinedPatch> {
  try {
    return Promise.resolve(combinePatches(object, patches));
  } catch (error) {
    return Promise.reject(new MergeError(error instanceof Error ? error.message : String(error), false));
  }
}

/**
 * Whether a patch's copies and moves are few, each from a value of the object (not one the patch
 * made), and those values small: a walk that stops at the bound, so it costs little either way.
 */
function fewSmallClones(clones: { from: string }[], read: () => JsonValue): boolean {
  if (clones.length > MAX_CLONES_IN_PLACE) return false;
  const object = read();
  let left = MAX_CLONED_NODES_IN_PLACE;
  for (const { from } of clones) {
    let source: JsonValue | undefined;
    try {
      source = valueAt(object, parsePointer(from));
    } catch {
      return false; // not a pointer: the merge says so, wherever it runs
    }
    if (source === undefined) return false;
    const stack: JsonValue[] = [source];
    while (stack.length > 0) {
      const node = stack.pop()!;
      if (typeof node !== 'object' || node === null) continue;
      const children = Array.isArray(node) ? node : Object.values(node);
      left -= children.length;
      if (left < 0) return false;
      stack.push(...children);
    }
  }
  return true;
}
