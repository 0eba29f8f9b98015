// The sandbox worker's side of context: a read-only replica of the host's store, fed by
// `context` messages from the pool, and the one function guests call to read it. A read is a
// local map lookup in the worker: no round trip to the main thread, so it cannot wait on the
// host's event loop, and the CPU deadline covers it like any other guest work.
import { answerRead, readLimit } from './read.ts';
import { ContextStore, type ContextChange } from './store.ts';
import type { Grant } from './grants.ts';

const replica = new ContextStore();

export function applyContextChange(change: ContextChange): void {
  replica.apply(change);
}

export interface ContextReader {
  (request: string): string;
}

/** The read function one policy's guest gets: its own grants, its own size limit. */
export function contextReader(policy: string, grants: readonly Grant[], memoryCapBytes: number): ContextReader {
  const scope = { policy, grants, maxBytes: readLimit(memoryCapBytes) };
  return (request) => answerRead(replica, scope, request);
}
