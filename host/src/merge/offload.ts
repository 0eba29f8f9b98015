// Combines large patches on a thread of their own. Composing two policies' patches of 10,000
// operations each took the main thread 0.1-0.15 s per review (check each alone, index writes,
// apply, diff, replay), during which no other review was read or answered. A review whose
// patches are small is combined in place (a message to a thread costs more than that); a large
// one waits for the merger, one review at a time, within its deadline: a merge still running
// at the deadline is stopped with its thread (a new one starts for the next review), and the
// review's patching policies fail per their failurePolicy, as for any merge the host cannot do.
import { extname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';
import type { JsonValue } from '@portcullis/sdk';
import { PortcullisError } from '../errors.ts';
import { combinePatches, type CombinedPatch, type PolicyPatch } from './patches.ts';

/** From this many operations in all, a review's patches are combined off the main thread (~3 ms in place). */
export const OFFLOAD_FROM_OPERATIONS = 256;
/** Longest a merge may take when the caller gives no deadline. */
export const MAX_MERGE_MS = 10_000;

export interface MergeRequest { id: number; object: JsonValue; patches: PolicyPatch[] }
export type MergeReply = { id: number; ok: true; combined: CombinedPatch } | { id: number; ok: false; message: string };

export class MergeError extends PortcullisError {
  constructor(message: string) {
    super('MERGE_FAILED', message);
  }
}

interface Job {
  request: MergeRequest;
  resolve: (combined: CombinedPatch) => void;
  reject: (error: MergeError) => void;
  timer: NodeJS.Timeout;
}

export class PatchMerger {
  #worker: Worker | undefined;
  #queue: Job[] = [];
  #running: Job | undefined;
  #next = 0;
  #closed = false;

  /**
   * The combined patch of `patches` on `object`, as combinePatches gives it. Small ones are
   * combined now; large ones on the merger's thread. Rejects with a MergeError when the merge
   * fails or does not finish within `withinMs`.
   */
  combine(object: JsonValue, patches: PolicyPatch[], withinMs = MAX_MERGE_MS): Promise<CombinedPatch> {
    let operations = 0;
    for (const p of patches) operations += p.operations.length;
    if (operations < OFFLOAD_FROM_OPERATIONS || this.#closed) {
      try {
        return Promise.resolve(combinePatches(object, patches));
      } catch (error) {
        return Promise.reject(new MergeError(error instanceof Error ? error.message : String(error)));
      }
    }
    return new Promise((resolve, reject) => {
      const ms = Math.max(0, Math.min(withinMs, MAX_MERGE_MS));
      const job: Job = { request: { id: ++this.#next, object, patches }, resolve, reject, timer: setTimeout(() => this.#late(job, ms), ms) };
      this.#queue.push(job);
      this.#start();
    });
  }

  /** Stops the thread; merges still waiting fail, later ones are combined in place. */
  async close(): Promise<void> {
    this.#closed = true;
    for (const job of [...this.#queue, ...(this.#running ? [this.#running] : [])]) this.#fail(job, 'the host is shutting down');
    this.#queue = [];
    this.#running = undefined;
    const worker = this.#worker;
    this.#worker = undefined;
    await worker?.terminate();
  }

  #start(): void {
    if (this.#running || this.#queue.length === 0) return;
    const job = this.#queue.shift()!;
    this.#running = job;
    this.#thread().postMessage(job.request);
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
      const job = this.#running;
      if (this.#worker !== worker || !job || job.request.id !== reply.id) return;
      this.#running = undefined;
      clearTimeout(job.timer);
      if (reply.ok) job.resolve(reply.combined);
      else job.reject(new MergeError(reply.message));
      this.#start();
    });
    const lost = (why: string) => {
      if (this.#worker !== worker) return;
      this.#worker = undefined;
      const job = this.#running;
      this.#running = undefined;
      if (job) this.#fail(job, why);
      this.#start();
    };
    worker.on('error', (error: Error) => lost(`the merge failed: ${error.message}`));
    worker.on('exit', (code) => lost(`the merging thread stopped (exit code ${code})`));
    this.#worker = worker;
    return worker;
  }

  #late(job: Job, ms: number): void {
    if (this.#running === job) {
      // Still merging at the deadline: the thread goes with it, and the next review gets a new one.
      const worker = this.#worker;
      this.#worker = undefined;
      this.#running = undefined;
      void worker?.terminate();
      this.#fail(job, `merging the patches took longer than ${ms} ms`);
      this.#start();
    } else {
      const at = this.#queue.indexOf(job);
      if (at >= 0) this.#queue.splice(at, 1);
      this.#fail(job, `merging the patches waited ${ms} ms behind other reviews' and was not started`);
    }
  }

  #fail(job: Job, message: string): void {
    clearTimeout(job.timer);
    job.reject(new MergeError(message));
  }
}
