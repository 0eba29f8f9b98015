// Runs inside a sandbox worker: collects discarded instances before their memories pile up.
//
// A discarded instance keeps its linear memories until V8 collects it, and V8 counts wasm
// memory only loosely towards its heap: a policy discarded after every call (isolation: fresh,
// near its memory cap, or trapping) left several of its memories per worker, each touched up to
// the cap. Red team (F8): a 60 MiB policy, 6 calls in flight on 2 workers, put host RSS at
// 0.5-1 GB, bounded only by when V8 chose to collect. Past a budget of discarded bytes a worker
// collects at once, so what it holds is its live instances plus at most the budget.
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';

/**
 * Discarded bytes a worker may leave to V8's own schedule: one default memory cap. A collection
 * costs a worker ~10-15 ms (red team F8 repro), so a fresh policy of a few MiB pays it once in
 * tens of calls, and one near its cap once in two.
 */
export const GARBAGE_BUDGET_BYTES = 64 * 2 ** 20;

export class Garbage {
  readonly #collect: () => void;
  readonly #budget: number;
  #pending = 0;
  /** How many collections this worker ran (tests, and a reason to think when it grows). */
  collections = 0;

  constructor(collect: () => void = firstNeeded(fullCollection), budget = GARBAGE_BUDGET_BYTES) {
    this.#collect = collect;
    this.#budget = budget;
  }

  /** Notes an instance whose memories total `bytes` was dropped. */
  discarded(bytes: number): void {
    this.#pending += bytes;
  }

  /**
   * Collects if the discarded bytes passed the budget. Called between batches, after the
   * answers are sent: a collection (a few ms) delays this worker's next call, never an answer.
   */
  settle(): void {
    if (this.#pending < this.#budget) return;
    this.#pending = 0;
    this.collections++;
    this.#collect();
  }
}

/** Made at its first use: a context costs a worker ~20 ms of its start, and most never collect. */
function firstNeeded(make: () => () => void): () => void {
  let collect: (() => void) | undefined;
  return () => (collect ??= make())();
}

/**
 * V8's `gc()`, which a context gets only while --expose-gc is set. Set for the moment a context
 * is made, so no other code of this worker (component glue) sees a `gc` global. Without it
 * (a V8 that refuses the flag at run time) collection is left to V8, as before.
 */
function fullCollection(): () => void {
  try {
    setFlagsFromString('--expose-gc');
    const gc = runInNewContext('typeof gc === "function" ? gc : undefined') as (() => void) | undefined;
    return typeof gc === 'function' ? () => gc() : () => {};
  } catch {
    return () => {};
  } finally {
    setFlagsFromString('--no-expose-gc');
  }
}
