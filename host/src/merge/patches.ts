// Combines the JSONPatch operations of several mutating policies, each written against the
// same original object, into one patch. Every policy's operations are expanded into the leaf
// paths they write (an `add` that creates a missing map counts as writes to its keys, so two
// policies adding different annotations to an object without annotations compose). Two
// policies writing overlapping paths with different values conflict; identical writes do not.
// The final patch is the difference between the original and the merged object, so it applies
// cleanly to the original by construction, and is checked once more with fast-json-patch.
import jsonpatch from 'fast-json-patch';
import type { JsonValue, PatchOperation } from '@portcullis/sdk';

const { applyOperation, applyPatch, compare, deepClone, getValueByPointer } = jsonpatch;
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
}

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
  let patched: JsonValue;
  try {
    patched = applyPatch(deepClone(original), operations as Operation[], false, false).newDocument as JsonValue;
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
    const message = p.operations.length > 0 ? forbiddenChange(original, p.operations) : undefined;
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
  const writes: Write[] = [];
  const rejected: PatchRejection[] = [];
  for (const entry of active) {
    const { policy, operations } = entry;
    const mine = operations.flatMap((op) => leafWrites(policy, op, original));
    const clash = findConflict(mine, writes);
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
        const other = writes.find((w) => w.policy !== policy)?.policy ?? policy;
        rejected.push({ policy, reason: 'conflict', other, path: '', message: `its patch cannot apply after the patch of policy "${other}": ${failure.message}` });
      }
      continue;
    }
    accepted.push(entry);
    writes.push(...mine);
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
    applyPatch(deepClone(document), operations as Operation[], true, false);
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
    for (const op of operations) {
      const path = parsePointer(op.path);
      const writes = op.op === 'add' || op.op === 'replace' ? expand('', path, op.value, original) : [];
      if (writes.length > 1 || (writes.length === 1 && writes[0]!.path.length > path.length)) {
        for (const write of writes) setDeep(merged, write.path, JSON.parse(write.value!) as JsonValue);
        continue;
      }
      const copy = 'value' in op ? { ...op, value: deepClone(op.value) as JsonValue } : op;
      applyOperation(merged, copy as Operation, true, true);
    }
    return undefined;
  } catch (error) {
    return firstLine(error);
  }
}

function firstLine(error: unknown): Error {
  return error instanceof Error ? new Error(error.message.split('\n')[0]) : new Error(String(error));
}

function setDeep(document: JsonValue, path: string[], value: JsonValue): JsonValue {
  let node = document as Record<string, JsonValue>;
  for (const segment of path.slice(0, -1)) {
    const child = node[segment];
    // Lists are walked by index like maps; only a missing or scalar step becomes a new map.
    if (typeof child !== 'object' || child === null) node[segment] = {};
    node = node[segment] as Record<string, JsonValue>;
  }
  node[path[path.length - 1]!] = value;
  return document;
}

function leafWrites(policy: string, op: PatchOperation, original: JsonValue): Write[] {
  const path = parsePointer(op.path);
  switch (op.op) {
    case 'test':
      return [];
    case 'remove':
      return [{ policy, path, value: undefined, append: false }];
    case 'move':
      return [
        { policy, path: parsePointer(op.from), value: undefined, append: false },
        { policy, path, value: JSON.stringify(valueAt(original, op.from) ?? null), append: false },
      ];
    case 'copy':
      return expand(policy, path, valueAt(original, op.from) ?? null, original);
    case 'add':
    case 'replace':
      if (path[path.length - 1] === '-') return [{ policy, path, value: JSON.stringify(op.value), append: true }];
      return expand(policy, path, op.value, original);
  }
}

/** An object written where the original has nothing is a set of writes to its leaves. */
function expand(policy: string, path: string[], value: JsonValue, original: JsonValue): Write[] {
  const isMap = typeof value === 'object' && value !== null && !Array.isArray(value);
  if (isMap && Object.keys(value).length > 0 && valueAt(original, toPointer(path)) === undefined) {
    return Object.entries(value).flatMap(([key, child]) => expand(policy, [...path, key], child, original));
  }
  return [{ policy, path, value: JSON.stringify(value), append: false }];
}

function findConflict(mine: Write[], earlier: Write[]): { policy: string; path: string } | undefined {
  for (const a of mine) {
    if (a.append) continue;
    for (const b of earlier) {
      if (b.append || b.policy === a.policy) continue;
      const overlap = isPrefix(a.path, b.path) || isPrefix(b.path, a.path);
      if (!overlap) continue;
      if (a.path.length === b.path.length && a.value === b.value) continue;
      return { policy: b.policy, path: toPointer(a.path.length <= b.path.length ? a.path : b.path) };
    }
  }
  return undefined;
}

function isPrefix(prefix: string[], path: string[]): boolean {
  return prefix.length <= path.length && prefix.every((segment, i) => segment === path[i]);
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
  return applyPatch(deepClone(object), patch as Operation[], false, true).newDocument as JsonValue;
}
