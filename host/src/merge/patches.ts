// Combines the JSONPatch operations of several mutating policies, each written against the
// same original object, into one patch. Every policy's operations are expanded into the leaf
// paths they write (an `add` that creates a missing map counts as writes to its keys, so two
// policies adding different annotations to an object without annotations compose). Two
// policies writing overlapping paths with different values conflict; identical writes do not.
// The final patch is the difference between the original and the merged object, so it applies
// cleanly to the original by construction, and is checked once more with fast-json-patch.
// Every policy wrote its paths against the original, so a policy that inserts or removes a list
// element conflicts with any other policy writing inside that list: applied one after the
// other, the second policy's indices would point at different elements (red team: a fix aimed
// at a privileged container landed on its neighbour). Patches are untrusted and applied on the
// main thread: `copy` clones are bounded (MAX_COPIED_BYTES), conflicts are found through an
// index rather than by comparing every pair of writes, and anything one policy's patch makes
// throw rejects that policy only.
import jsonpatch from 'fast-json-patch';
import type { JsonValue, PatchOperation } from '@portcullis/sdk';

const { applyOperation, compare, deepClone, getValueByPointer } = jsonpatch;
type Operation = jsonpatch.Operation;

export interface PolicyPatch {
  policy: string;
  operations: PatchOperation[];
}

export type PatchRejection =
  | { policy: string; reason: 'invalid'; message: string }
  | { policy: string; reason: 'conflict'; other: string; path: string; message: string };

export interface CombinedPatch {
  patch: PatchOperation[];
  /** Policies whose patch was left out, in input order. */
  rejected: PatchRejection[];
}

interface Write {
  policy: string;
  path: string[];
  /** JSON text of the value written, or undefined for a removal; appends never collide. */
  value: string | undefined;
  append: boolean;
  /** It inserts or removes an element of a list the original has, before its last: later elements move. */
  shifts: boolean;
}

/**
 * Most a patch's `copy` operations may clone, as JSON text, in all: thirty copies of a parent
 * into its child (1.5 KB of patch) doubled a Pod 30 times and took the host's heap (red team).
 * The apiserver's own JSON patch bounds accumulated copies the same way.
 */
export const MAX_COPIED_BYTES = 2 ** 20;

// What identifies the object under review. A patch that changes one of these would make the
// apiserver refuse the response or, worse, store a different object than the one it admitted.
const IDENTITY = [['apiVersion'], ['kind'], ['metadata', 'name'], ['metadata', 'namespace'], ['metadata', 'uid']] as const;
const IDENTITY_POINTERS = IDENTITY.map((path) => `/${path.join('/')}`);

/** Why a policy's patch may not be applied at all, whatever the other policies do. */
export function forbiddenChange(original: JsonValue, operations: PatchOperation[]): string | undefined {
  const touches = (pointer: string | undefined) => pointer !== undefined &&
    (pointer === '' || IDENTITY_POINTERS.some((p) => p === pointer || p.startsWith(`${pointer}/`)));
  const root = operations.find((op) => op.path === '' || ('from' in op && op.from === ''));
  if (root) return `returned a patch that would ${root.op === 'remove' ? 'remove' : 'replace'} the whole object (path ""); a policy may change parts of it only`;
  if (!operations.some((op) => touches(op.path) || ('from' in op && touches(op.from)))) return undefined;
  const patched = deepClone(original) as JsonValue;
  try {
    applyAll(patched, operations, false);
  } catch {
    return undefined; // Not applicable at all: reported as such by the caller.
  }
  for (const path of IDENTITY) {
    const before = identityAt(original, path);
    const after = identityAt(patched, path);
    if (JSON.stringify(before) !== JSON.stringify(after)) {
      return `returned a patch that changes ${path.join('.')} (${JSON.stringify(before) ?? 'absent'} to ${JSON.stringify(after) ?? 'absent'}); ` +
        'a policy may not change apiVersion, kind, metadata.name, metadata.namespace or metadata.uid';
    }
  }
  return undefined;
}

function identityAt(value: JsonValue | undefined, path: readonly string[]): JsonValue | undefined {
  let node = value;
  for (const key of path) node = node !== null && typeof node === 'object' && !Array.isArray(node) ? node[key] : undefined;
  return node;
}

export function combinePatches(original: JsonValue, patches: PolicyPatch[]): CombinedPatch {
  const forbidden: PatchRejection[] = [];
  const allowed = patches.filter((p) => {
    let message: string | undefined;
    try {
      message = p.operations.length > 0 ? forbiddenChange(original, p.operations) : undefined;
    } catch (error) {
      message = `returned a patch the host cannot check: ${firstLine(error).message}`;
    }
    if (message) forbidden.push({ policy: p.policy, reason: 'invalid', message });
    return message === undefined;
  });
  const combined = combineAllowed(original, allowed);
  return forbidden.length === 0 ? combined : { patch: combined.patch, rejected: [...forbidden, ...combined.rejected] };
}

function combineAllowed(original: JsonValue, patches: PolicyPatch[]): CombinedPatch {
  const active = patches.filter((p) => p.operations.length > 0);
  // One patching policy (the common case): nothing to compose, only to check.
  if (active.length === 1) {
    const { policy, operations } = active[0]!;
    const error = checkApplies(original, operations);
    return error
      ? { patch: [], rejected: [{ policy, reason: 'invalid', message: `returned a patch that does not apply to the object: ${error.message}` }] }
      : { patch: operations, rejected: [] };
  }
  // Several: one working copy, patched in place. Copies of the whole object are the main
  // cost of a mutating review, so the per-policy "does it apply alone" check only runs
  // when applying it to the working copy fails.
  let merged = deepClone(original) as JsonValue;
  const accepted: PolicyPatch[] = [];
  const writes = new WriteIndex();
  const rejected: PatchRejection[] = [];
  for (const entry of active) {
    const { policy, operations } = entry;
    let mine: Write[];
    try {
      mine = operations.flatMap((op) => leafWrites(policy, op, original));
    } catch (error) {
      rejected.push({ policy, reason: 'invalid', message: `returned a patch the host cannot merge: ${firstLine(error).message}` });
      continue;
    }
    const clash = writes.conflict(mine);
    if (clash) {
      rejected.push({ policy, reason: 'conflict', other: clash.policy, path: clash.path, message: `its patch conflicts with policy "${clash.policy}" at ${clash.path}` });
      continue;
    }
    const failure = applyInPlace(merged, operations, original);
    if (failure) {
      // The working copy may be half-patched: rebuild it from the patches accepted so far.
      merged = deepClone(original) as JsonValue;
      for (const done of accepted) applyInPlace(merged, done.operations, original);
      const alone = checkApplies(original, operations);
      if (alone) {
        rejected.push({ policy, reason: 'invalid', message: `returned a patch that does not apply to the object: ${alone.message}` });
      } else {
        const other = accepted.find((p) => p.policy !== policy)?.policy ?? policy;
        rejected.push({ policy, reason: 'conflict', other, path: '', message: `its patch cannot apply after the patch of policy "${other}": ${failure.message}` });
      }
      continue;
    }
    accepted.push(entry);
    for (const write of mine) writes.add(write);
  }
  const patch = compare(original as object, merged as object) as PatchOperation[];
  // Belt and braces: the combined patch must apply to the original as the apiserver will do it.
  const check = checkApplies(original, patch);
  if (check) throw new Error(`internal error: combined patch does not apply: ${check.message}`);
  return { patch, rejected };
}

/** Applies operations to a copy of the document; returns why they do not apply, if they do not. */
function checkApplies(document: JsonValue, operations: PatchOperation[]): Error | undefined {
  try {
    applyAll(deepClone(document) as JsonValue, operations, true);
    return undefined;
  } catch (error) {
    return firstLine(error);
  }
}

/**
 * Applies one policy's operations to the merged object, in place. An `add` that creates a map
 * the original lacked is applied leaf by leaf, so it fills in a map an earlier policy created
 * instead of replacing it; every other operation applies as written. Values are copied in, so
 * later policies never change the operations a policy returned.
 */
function applyInPlace(merged: JsonValue, operations: PatchOperation[], original: JsonValue): Error | undefined {
  try {
    const copies = new CopyBudget();
    for (const op of operations) {
      const path = parsePointer(op.path);
      const writes = op.op === 'add' || op.op === 'replace' ? expand('', path, op.value, original, false) : [];
      if (writes.length > 1 || (writes.length === 1 && writes[0]!.path.length > path.length)) {
        for (const write of writes) setDeep(merged, write.path, JSON.parse(write.value!) as JsonValue);
        continue;
      }
      const copy = 'value' in op ? { ...op, value: deepClone(op.value) as JsonValue } : op;
      copies.spend(merged, op);
      applyOperation(merged, copy as Operation, true, true);
    }
    return undefined;
  } catch (error) {
    return firstLine(error);
  }
}

/** Applies operations to `document` in place (fast-json-patch's checks, bounded copies); throws as fast-json-patch does. */
function applyAll(document: JsonValue, operations: PatchOperation[], validate: boolean): void {
  const copies = new CopyBudget();
  for (const op of operations) {
    copies.spend(document, op);
    applyOperation(document, op as Operation, validate, true);
  }
}

class CopyBudget {
  #left = MAX_COPIED_BYTES;

  spend(document: JsonValue, op: PatchOperation): void {
    if (op.op !== 'copy') return;
    // A missing `from` is fast-json-patch's to report.
    const text = JSON.stringify(valueAt(document, op.from) ?? null);
    this.#left -= text.length;
    if (this.#left < 0) throw new Error(`its copy operations clone more than ${MAX_COPIED_BYTES / 2 ** 20} MiB in all`);
  }
}

function firstLine(error: unknown): Error {
  return error instanceof Error ? new Error(error.message.split('\n')[0]) : new Error(String(error));
}

function setDeep(document: JsonValue, path: string[], value: JsonValue): JsonValue {
  let node = document as Record<string, JsonValue>;
  for (const segment of path.slice(0, -1)) {
    // Own properties only: an inherited one (`constructor`) is not part of the object.
    const child = Object.hasOwn(node, segment) ? node[segment] : undefined;
    // Lists are walked by index like maps; only a missing or scalar step becomes a new map.
    if (typeof child !== 'object' || child === null) define(node, segment, {});
    node = node[segment] as Record<string, JsonValue>;
  }
  define(node, path[path.length - 1]!, value);
  return document;
}

/** Sets an own property even where plain assignment would not (a key named like an accessor). */
function define(node: Record<string, JsonValue>, key: string, value: JsonValue): void {
  Object.defineProperty(node, key, { value, writable: true, enumerable: true, configurable: true });
}

function leafWrites(policy: string, op: PatchOperation, original: JsonValue): Write[] {
  const path = parsePointer(op.path);
  const write = (at: string[], value: string | undefined, inserts: boolean): Write =>
    ({ policy, path: at, value, append: false, shifts: shiftsList(original, at, inserts) });
  switch (op.op) {
    case 'test':
      return [];
    case 'remove':
      return [write(path, undefined, false)];
    case 'move':
      return [
        write(parsePointer(op.from), undefined, false),
        write(path, JSON.stringify(valueAt(original, op.from) ?? null), true),
      ];
    case 'copy':
      return expand(policy, path, valueAt(original, op.from) ?? null, original, true);
    case 'add':
    case 'replace':
      if (path[path.length - 1] === '-') return [{ policy, path, value: JSON.stringify(op.value), append: true, shifts: false }];
      return expand(policy, path, op.value, original, op.op === 'add');
  }
}

/**
 * Whether writing at `path` moves elements of a list in the original: inserting before its end
 * (`inserts`: add, copy or move to an index), or removing any element but the last.
 */
function shiftsList(original: JsonValue, path: string[], inserts: boolean): boolean {
  const last = path[path.length - 1];
  if (last === undefined || !/^(0|[1-9]\d*)$/.test(last)) return false;
  const list = valueAt(original, toPointer(path.slice(0, -1)));
  if (!Array.isArray(list)) return false;
  const index = Number(last);
  return inserts ? index < list.length : index < list.length - 1;
}

/**
 * An object written where the original has nothing is a set of writes to its leaves. Not an
 * element added to a list: its path is a position, not a key (expanded, an append of a map
 * became a property "-" of the list and was lost).
 */
function expand(policy: string, path: string[], value: JsonValue, original: JsonValue, inserts: boolean): Write[] {
  const isMap = typeof value === 'object' && value !== null && !Array.isArray(value);
  if (isMap && Object.keys(value).length > 0 && valueAt(original, toPointer(path)) === undefined &&
    path.length > 0 && !Array.isArray(valueAt(original, toPointer(path.slice(0, -1))))) {
    return Object.entries(value).flatMap(([key, child]) => expand(policy, [...path, key], child, original, false));
  }
  return [{ policy, path, value: JSON.stringify(value), append: false, shifts: shiftsList(original, path, inserts) }];
}

/**
 * The writes of the policies accepted so far, indexed by path, so a policy's writes are checked
 * in time proportional to their number and depth (comparing every pair took 12 s with two
 * policies of 20,000 writes each, red team).
 */
class WriteIndex {
  /** Writes by their exact path. */
  readonly #at = new Map<string, Write[]>();
  /** The first write strictly below each path. */
  readonly #below = new Map<string, Write>();
  /** Writes that move the elements of a list, by the list's path. */
  readonly #shifting = new Map<string, Write>();

  add(write: Write): void {
    if (write.append) return; // appends never collide
    const keys = prefixes(write.path);
    const key = keys[keys.length - 1]!;
    const same = this.#at.get(key);
    if (same) same.push(write);
    else this.#at.set(key, [write]);
    for (const prefix of keys.slice(0, -1)) if (!this.#below.has(prefix)) this.#below.set(prefix, write);
    if (write.shifts && !this.#shifting.has(keys[keys.length - 2]!)) this.#shifting.set(keys[keys.length - 2]!, write);
  }

  /** The first earlier write one of `mine` collides with: where it collides, and whose it is. */
  conflict(mine: Write[]): { policy: string; path: string } | undefined {
    for (const a of mine) {
      if (a.append) continue;
      const keys = prefixes(a.path);
      const key = keys[keys.length - 1]!;
      // An earlier write to an ancestor of a's path, or to a list a's path goes into whose elements it moved.
      for (const prefix of keys.slice(0, -1)) {
        const above = this.#at.get(prefix)?.[0];
        if (above) return { policy: above.policy, path: prefix };
        const shifted = this.#shifting.get(prefix);
        if (shifted) return { policy: shifted.policy, path: toPointer(shifted.path) };
      }
      // The same path: only the same value, with no list moving, is no conflict.
      for (const b of this.#at.get(key) ?? []) {
        if (b.value !== a.value || a.shifts || b.shifts) return { policy: b.policy, path: key };
      }
      // An earlier write below a's path; or, when a moves a list's elements, anywhere in that list.
      const below = this.#below.get(key) ?? (a.shifts ? this.#below.get(keys[keys.length - 2]!) : undefined);
      if (below) return { policy: below.policy, path: a.shifts ? key : toPointer(below.path) };
    }
    return undefined;
  }
}

/** The pointers of a path's ancestors and of itself: "", "/a", "/a/b" for ["a", "b"]. */
function prefixes(path: string[]): string[] {
  const keys = [''];
  for (const segment of path) keys.push(`${keys[keys.length - 1]}/${segment.replace(/~/g, '~0').replace(/\//g, '~1')}`);
  return keys;
}

function valueAt(document: JsonValue, pointer: string): JsonValue | undefined {
  try {
    return getValueByPointer(document, pointer) as JsonValue | undefined;
  } catch {
    return undefined;
  }
}

function parsePointer(pointer: string): string[] {
  if (pointer === '') return [];
  return pointer.slice(1).split('/').map((s) => s.replace(/~1/g, '/').replace(/~0/g, '~'));
}

function toPointer(path: string[]): string {
  return path.map((s) => '/' + s.replace(/~/g, '~0').replace(/\//g, '~1')).join('');
}

/** The object as the apiserver would store it after `patch` (a copy; the original is untouched). */
export function patchedObject(object: JsonValue | null | undefined, patch: PatchOperation[]): JsonValue | null {
  if (object === null || object === undefined || patch.length === 0) return object ?? null;
  const patched = deepClone(object) as JsonValue;
  applyAll(patched, patch, false);
  return patched;
}
