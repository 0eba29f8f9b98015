// RFC 6902 applied strictly to JSON values, for patches a policy returned: own properties only
// (a pointer through `constructor` reached Object.prototype through fast-json-patch, which
// resolves inherited properties), list indices in canonical form and within the list (`00`
// was index 0 to fast-json-patch and a map key to the merge; a huge one made a sparse list of
// four billion keys), values copied at most MAX_COPIED_BYTES in all, and no copy of the whole
// document per operation (fast-json-patch's validation cloned it for every move and copy, so
// thousands of them stalled the main thread for a minute). Red team, 2026-11-23.
import type { JsonValue, PatchOperation } from '@portcullis/sdk';
import { stringifyAnyDepth } from '../util/deep-json.ts';

/** A patch that does not apply; the message says where and why. */
export class PatchError extends Error {}

/**
 * Most a patch's `copy` operations may clone, as JSON text, in all (and the most the merge
 * reads to follow its moves and copies): thirty copies of a parent into its child (1.5 KB of
 * patch) doubled a Pod 30 times and took the host's heap. The apiserver bounds accumulated
 * copies the same way.
 */
export const MAX_COPIED_BYTES = 2 ** 20;
/**
 * Most list elements a patch's inserts and removes may move (each moves those after it):
 * inserting and removing at the front of a 200,000-element list 26,000 times took 3 s (red team).
 */
export const MAX_SHIFTED_ELEMENTS = 5_000_000;

type JsonMap = { [key: string]: JsonValue };

const INDEX = /^(0|[1-9]\d*)$/;

export function isMap(value: JsonValue | undefined): value is JsonMap {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

export function parsePointer(pointer: string): string[] {
  if (pointer === '') return [];
  if (!pointer.startsWith('/')) throw new PatchError(`"${pointer}" is not a JSON pointer`);
  const segments = pointer.slice(1).split('/');
  return pointer.includes('~') ? segments.map((s) => s.replace(/~1/g, '/').replace(/~0/g, '~')) : segments;
}

export function toPointer(path: readonly string[]): string {
  return path.map(pointerSegment).join('');
}

/** One key as it ends a pointer: `/` and the key with `~` and `/` escaped. */
export function pointerSegment(key: string): string {
  return key.includes('~') || key.includes('/') ? '/' + key.replace(/~/g, '~0').replace(/\//g, '~1') : '/' + key;
}

/** The value at a path, or undefined: own properties and canonical indices within the list only. */
export function valueAt(document: JsonValue | undefined, path: readonly string[]): JsonValue | undefined {
  let node = document;
  for (const segment of path) {
    node = childOf(node, segment);
    if (node === undefined) return undefined;
  }
  return node;
}

function childOf(node: JsonValue | undefined, segment: string): JsonValue | undefined {
  if (Array.isArray(node)) return INDEX.test(segment) ? node[Number(segment)] : undefined;
  if (isMap(node)) return Object.hasOwn(node, segment) ? node[segment] : undefined;
  return undefined;
}

export type Container = JsonMap | JsonValue[];

function isContainer(value: JsonValue | undefined): value is Container {
  return typeof value === 'object' && value !== null;
}

/**
 * A patched version of a document, copied on write: a write copies the maps and lists on its
 * path (each once), and everything else stays shared with the original, which is never changed.
 * Copying whole documents cost the main thread 200 ms per copy for a 2.8 MiB map, and merging
 * two policies' patches made five (red team: 1.2 s per review, for every review queued behind);
 * shared parts also let the diff and the final check skip them by identity.
 */
export class Draft {
  #root: JsonValue;
  /** The containers this draft copied or created: the only ones it may change. */
  readonly #owned = new WeakSet<Container>();

  constructor(original: JsonValue) {
    this.#root = original;
  }

  get root(): JsonValue {
    return this.#root;
  }

  /** The container at `path`, made this draft's own with its ancestors; undefined when absent or not a map or list. */
  own(path: readonly string[]): Container | undefined {
    let node = this.#ownRoot();
    for (const segment of path) {
      if (node === undefined) return undefined;
      node = this.child(node, segment);
    }
    return node;
  }

  /** An own container's child at `segment`, made this draft's own too; undefined when absent or not a map or list. */
  child(parent: Container, segment: string): Container | undefined {
    const value = childOf(parent, segment);
    if (!isContainer(value)) return undefined;
    if (this.#owned.has(value)) return value;
    const copy = this.#copy(value);
    if (Array.isArray(parent)) parent[Number(segment)] = copy;
    else define(parent, segment, copy);
    return copy;
  }

  /** A container the caller made (a new map): never shared, so the draft's own. */
  adopt<T extends Container>(value: T): T {
    this.#owned.add(value);
    return value;
  }

  #ownRoot(): Container | undefined {
    const root = this.#root;
    if (!isContainer(root)) return undefined;
    if (this.#owned.has(root)) return root;
    const copy = this.#copy(root);
    this.#root = copy;
    return copy;
  }

  #copy(value: Container): Container {
    // Spread defines own properties, so a key named `__proto__` stays a key (assignment would set the prototype).
    return this.adopt(Array.isArray(value) ? value.slice() : { ...value });
  }
}

/** Sets an own property even where plain assignment would not (a key named like an accessor). */
export function define(node: JsonMap, key: string, value: JsonValue): void {
  // Assignment is several times faster on a large map (red team: 17,500 label adds cost half a
  // second per review); on a plain object only `__proto__` is an accessor it would call instead.
  if (key === '__proto__') Object.defineProperty(node, key, { value, writable: true, enumerable: true, configurable: true });
  else node[key] = value;
}

/** Counts what copies clone (and what the merge reads to follow moves), against MAX_COPIED_BYTES. */
export class CopyBudget {
  #left = MAX_COPIED_BYTES;
  #shifts = MAX_SHIFTED_ELEMENTS;

  /** An insert or a remove at `index` of a list of `length`. */
  shift(length: number, index: number): void {
    this.#shifts -= length - index;
    if (this.#shifts < 0) throw new PatchError(`its inserts and removes move list elements more than ${MAX_SHIFTED_ELEMENTS.toLocaleString('en')} times`);
  }

  /** The value as JSON text, counted. */
  spend(value: JsonValue): string {
    // The object's values may nest deeper than JSON.stringify goes (review 4: a copy of a 6,000-deep element).
    const text = stringifyAnyDepth(value);
    this.#left -= text.length;
    if (this.#left < 0) throw new PatchError(`its copy and move operations clone more than ${MAX_COPIED_BYTES / 2 ** 20} MiB in all`);
    return text;
  }
}

/** Applies operations to the draft; throws PatchError at the first that does not apply (the draft is then half-patched). */
export function applyPatch(document: Draft, operations: readonly PatchOperation[], budget = new CopyBudget()): void {
  for (const op of operations) applyOperation(document, op, budget);
}

/** The document after the operations, sharing what they did not change with it (which is left as it was). */
export function patched(original: JsonValue, operations: readonly PatchOperation[]): JsonValue {
  const draft = new Draft(original);
  applyPatch(draft, operations);
  return draft.root;
}

export function applyOperation(document: Draft, op: PatchOperation, budget: CopyBudget): void {
  const path = parsePointer(op.path);
  if (path.length === 0) throw new PatchError(`${op.op} of the whole document (path ""): a policy may change parts of it only`);
  switch (op.op) {
    // Values go in as copies: later operations would otherwise change the operation itself (and
    // the patch sent to the apiserver with it: an add of a map, then a remove inside it).
    case 'add':
      return add(document, path, copyOf(op.value), budget);
    case 'remove':
      remove(document, path, budget);
      return;
    case 'replace':
      return replace(document, path, copyOf(op.value));
    case 'move': {
      const from = parsePointer(op.from);
      if (from.length < path.length && from.every((s, i) => s === path[i])) throw new PatchError(`move from ${op.from} into its own child ${op.path}`);
      return add(document, path, remove(document, from, budget), budget);
    }
    case 'copy': {
      const value = valueAt(document.root, parsePointer(op.from));
      if (value === undefined) throw new PatchError(`copy from ${op.from}, which does not exist`);
      return add(document, path, JSON.parse(budget.spend(value)) as JsonValue, budget);
    }
    case 'test': {
      const value = valueAt(document.root, path);
      if (value === undefined || !equal(value, op.value)) throw new PatchError(`test at ${op.path} failed`);
      return;
    }
    default:
      throw new PatchError(`unknown operation ${JSON.stringify((op as { op: unknown }).op)}`);
  }
}

/** A plain copy of a JSON value (primitives are their own copy). */
export function copyOf(value: JsonValue): JsonValue {
  // A policy's values nest at most 64 deep, but the combined patch carries values of the object,
  // which the apiserver lets nest 10,000 deep (red team: a 6,000-deep list element that two
  // policies' patches moved failed every patching policy here). JSON.parse does not recurse.
  return typeof value === 'object' && value !== null ? JSON.parse(stringifyAnyDepth(value)) as JsonValue : value;
}

function parentOf(document: Draft, path: string[]): { parent: Container; key: string } {
  const parent = document.own(path.slice(0, -1));
  if (parent === undefined) throw new PatchError(`${toPointer(path)}: its parent does not exist or is neither an object nor a list`);
  return { parent, key: path[path.length - 1]! };
}

/** A list index in canonical form, at most `max`. */
function listIndex(path: string[], key: string, max: number): number {
  if (!INDEX.test(key)) throw new PatchError(`${toPointer(path)}: "${key}" is not a list index`);
  const index = Number(key);
  if (index > max) throw new PatchError(`${toPointer(path)}: index ${index} is past the end of the list`);
  return index;
}

function add(document: Draft, path: string[], value: JsonValue, budget: CopyBudget): void {
  const { parent, key } = parentOf(document, path);
  if (Array.isArray(parent)) {
    const index = key === '-' ? parent.length : listIndex(path, key, parent.length);
    budget.shift(parent.length, index);
    parent.splice(index, 0, value);
  } else {
    define(parent, key, value);
  }
}

function remove(document: Draft, path: string[], budget: CopyBudget): JsonValue {
  if (path.length === 0) throw new PatchError('remove of the whole document');
  const { parent, key } = parentOf(document, path);
  if (Array.isArray(parent)) {
    const index = listIndex(path, key, parent.length - 1);
    budget.shift(parent.length, index);
    return parent.splice(index, 1)[0]!;
  }
  if (!Object.hasOwn(parent, key)) throw new PatchError(`${toPointer(path)} does not exist`);
  const value = parent[key]!;
  delete parent[key];
  return value;
}

function replace(document: Draft, path: string[], value: JsonValue): void {
  const { parent, key } = parentOf(document, path);
  if (Array.isArray(parent)) parent[listIndex(path, key, parent.length - 1)] = value;
  else if (Object.hasOwn(parent, key)) define(parent, key, value);
  else throw new PatchError(`${toPointer(path)} does not exist`);
}

/**
 * JSON equality (key order does not matter), with a stack of its own: nesting a user may send
 * (thousands of levels) must not overflow the call stack, which would fail every patching policy.
 */
export function equal(a: JsonValue, b: JsonValue): boolean {
  const pending: [JsonValue, JsonValue][] = [[a, b]];
  while (pending.length > 0) {
    const [x, y] = pending.pop()!;
    if (x === y) continue;
    if (Array.isArray(x)) {
      if (!Array.isArray(y) || x.length !== y.length) return false;
      for (let i = 0; i < x.length; i++) pending.push([x[i]!, y[i]!]);
      continue;
    }
    if (!isMap(x) || !isMap(y)) return false;
    const keys = Object.keys(x);
    if (keys.length !== Object.keys(y).length) return false;
    for (const key of keys) {
      if (!Object.hasOwn(y, key)) return false;
      pending.push([x[key]!, y[key]!]);
    }
  }
  return true;
}
