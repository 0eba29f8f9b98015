// The main thread's side of context: one ContextStore that informers (or an offline file) fill,
// and every change forwarded to the sandbox workers' replicas. Also answers the host's own
// questions: the labels of a namespace (single-webhook namespaceSelector) and readiness.
import { kindKey } from './grants.ts';
import { ContextStore, type ContextChange } from './store.ts';

/** What the sandbox pool offers context: a snapshot for each new worker, and a broadcast. */
export interface ContextSink {
  attachContext(snapshot: () => ContextChange[]): void;
  broadcastContext(change: ContextChange): void;
}

export class ContextHub {
  readonly store = new ContextStore();
  #sinks: ContextSink[] = [];
  /** Kinds some policy is granted: /readyz waits for these (not for Namespaces cached only for selectors). */
  #required = new Set<string>();

  apply(change: ContextChange): void {
    this.store.apply(change);
    for (const sink of this.#sinks) sink.broadcastContext(change);
  }

  /** Feeds a pool: its workers get the current state now (and on every restart), then every change. */
  attach(sink: ContextSink): void {
    this.#sinks.push(sink);
    sink.attachContext(() => this.store.snapshot());
  }

  /** A namespace's labels from the Namespace cache; undefined when not cached, not synced or unknown. */
  namespaceLabels(namespace: string): Record<string, string> | undefined {
    if (this.store.synced('v1', 'Namespace') !== true) return undefined;
    return this.store.get('v1', 'Namespace', '', namespace)?.labels;
  }

  /** Kinds some policy is granted; readiness waits for these to sync. */
  require(kinds: readonly { apiVersion: string; kind: string }[]): void {
    for (const k of kinds) this.#required.add(kindKey(k.apiVersion, k.kind));
  }

  /** Required kinds not synced yet: /readyz waits for this to be empty. */
  waiting(): string[] {
    return this.store.kinds().filter((k) => !k.synced && this.#required.has(k.kind)).map((k) => k.kind);
  }
}
