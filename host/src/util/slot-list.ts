/**
 * A set of short-lived objects held by a long-lived owner (the server's unanswered responses):
 * array slots reused through a free list, not a Set or Map.
 *
 * Why: a long-lived Set or Map that each request's response enters and leaves kept whole
 * requests (response, request, parsed review) alive through scavenges until the next full
 * collection. Most likely (not checked in V8's source) the copies a rehash leaves behind keep
 * their entries, and a scavenge takes everything in the old generation as live. Measured with
 * `--trace-gc` on the bare HTTPS server (bench/limit-server.ts) at 16 connections:
 * - as it is: 6 bytes promoted per request, a 0.6 ms scavenge every 50 ms;
 * - with one Set of its responses, added on request, deleted on close: 2.5 KB promoted per
 *   request, 12% fewer requests a second, and a full collection every 90 ms;
 * - with these slots: 9 bytes per request.
 * The slots array reaches the most requests ever open at once, then stops growing.
 */
export class SlotList<T extends object> {
  readonly #slots: (T | undefined)[] = [];
  readonly #free: number[] = [];

  get size(): number {
    return this.#slots.length - this.#free.length;
  }

  /** Holds `item` until the returned function is called (calling it again does nothing). */
  add(item: T): () => void {
    const index = this.#free.pop() ?? this.#slots.length;
    this.#slots[index] = item;
    let held = true;
    return () => {
      if (!held) return;
      held = false;
      this.#slots[index] = undefined;
      this.#free.push(index);
    };
  }

  *[Symbol.iterator](): IterableIterator<T> {
    for (const item of this.#slots) if (item !== undefined) yield item;
  }
}
