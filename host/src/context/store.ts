// The cluster objects a host (or one sandbox worker) can answer reads from, per granted kind.
// The main thread fills one store from informers (or a file, offline) and sends the same
// changes as messages to every sandbox worker, which keeps a read-only replica: a guest's read
// is then a synchronous, local map lookup, with no round trip to the main thread.
import type { JsonObject } from '@portcullis/sdk';
import { kindKey } from './grants.ts';

/** One object, serialized once in the main thread; workers hand the JSON text to guests as is. */
export interface ContextEntry {
  namespace: string;
  name: string;
  labels: Record<string, string>;
  json: string;
  /** UTF-8 size of `json`, counted once here, for the read limit. */
  bytes: number;
}

/** The changes a store takes; also the message a worker receives (`type: 'context'`). */
export type ContextChange =
  | { type: 'context'; op: 'reset'; kind: string; entries: ContextEntry[]; synced: boolean }
  | { type: 'context'; op: 'upsert'; kind: string; entry: ContextEntry }
  | { type: 'context'; op: 'delete'; kind: string; namespace: string; name: string }
  | { type: 'context'; op: 'synced'; kind: string; synced: boolean };

interface KindState {
  synced: boolean;
  /** namespace -> name -> entry; cluster-scoped objects live under "". */
  byNamespace: Map<string, Map<string, ContextEntry>>;
}

export class ContextStore {
  #kinds = new Map<string, KindState>();

  apply(change: ContextChange): void {
    if (change.op === 'reset') {
      const state: KindState = { synced: change.synced, byNamespace: new Map() };
      for (const entry of change.entries) put(state, entry);
      this.#kinds.set(change.kind, state);
      return;
    }
    const state = this.#state(change.kind);
    if (change.op === 'upsert') put(state, change.entry);
    else if (change.op === 'delete') state.byNamespace.get(change.namespace)?.delete(change.name);
    else state.synced = change.synced;
  }

  /** undefined: the kind is not cached at all; otherwise whether its first list has arrived. */
  synced(apiVersion: string, kind: string): boolean | undefined {
    return this.#kinds.get(kindKey(apiVersion, kind))?.synced;
  }

  get(apiVersion: string, kind: string, namespace: string, name: string): ContextEntry | undefined {
    return this.#kinds.get(kindKey(apiVersion, kind))?.byNamespace.get(namespace)?.get(name);
  }

  /** Every entry of a kind, or of one namespace of it. */
  *entries(apiVersion: string, kind: string, namespace?: string): Generator<ContextEntry> {
    const state = this.#kinds.get(kindKey(apiVersion, kind));
    if (!state) return;
    if (namespace !== undefined) {
      yield* state.byNamespace.get(namespace)?.values() ?? [];
      return;
    }
    for (const names of state.byNamespace.values()) yield* names.values();
  }

  /** The whole store as reset messages: what a new sandbox worker receives first. */
  snapshot(): ContextChange[] {
    return [...this.#kinds].map(([kind, state]) => ({
      type: 'context', op: 'reset', kind, synced: state.synced,
      entries: [...state.byNamespace.values()].flatMap((names) => [...names.values()]),
    }));
  }

  kinds(): { kind: string; synced: boolean; objects: number }[] {
    return [...this.#kinds].map(([kind, state]) => ({
      kind, synced: state.synced, objects: [...state.byNamespace.values()].reduce((n, names) => n + names.size, 0),
    }));
  }

  #state(kind: string): KindState {
    let state = this.#kinds.get(kind);
    if (!state) {
      state = { synced: false, byNamespace: new Map() };
      this.#kinds.set(kind, state);
    }
    return state;
  }
}

function put(state: KindState, entry: ContextEntry): void {
  let names = state.byNamespace.get(entry.namespace);
  if (!names) {
    names = new Map();
    state.byNamespace.set(entry.namespace, names);
  }
  names.set(entry.name, entry);
}

/** Turns an object into an entry; undefined when it has no metadata.name (nothing can look it up). */
export function toEntry(object: JsonObject): ContextEntry | undefined {
  const metadata = object.metadata;
  if (typeof metadata !== 'object' || metadata === null || Array.isArray(metadata)) return undefined;
  const name = metadata.name;
  if (typeof name !== 'string' || name === '') return undefined;
  const namespace = typeof metadata.namespace === 'string' ? metadata.namespace : '';
  const labels: Record<string, string> = {};
  const raw = metadata.labels;
  if (typeof raw === 'object' && raw !== null && !Array.isArray(raw)) {
    for (const [key, value] of Object.entries(raw)) if (typeof value === 'string') labels[key] = value;
  }
  const json = JSON.stringify(object);
  return { namespace, name, labels, json, bytes: Buffer.byteLength(json) };
}
