// Combines the JSONPatch operations of several mutating policies, each written against the
// same original object, into one patch. Every policy's operations are expanded into the leaf
// paths they write (an `add` that creates a missing map under an existing one counts as writes
// to its keys, so two policies adding different annotations to an object without annotations
// compose). Two policies writing overlapping paths with different values conflict; identical
// writes do not. Every policy wrote its paths against the original, so one that inserts or
// removes a list element conflicts with any other writing inside that list (applied one after
// the other, the second one's indices would point at other elements: red team, a fix aimed at
// a privileged container landed on its neighbour); appends compose with each other and with
// element writes, but not with a write to the list itself or to an element only an append made.
// The final patch is the difference between the original and the merged object, so it applies
// to the original by construction, and is checked once more.
//
// Patches are untrusted and applied on the main thread, with json-patch.ts (strict RFC 6902:
// own properties, canonical indices, bounded copies); conflicts are found through an index, not
// by comparing every pair of writes; anything one policy's patch makes throw rejects that
// policy only.
import type { JsonValue, PatchOperation } from '@portcullis/sdk';
import { diff } from './diff.ts';
import { foreignText } from '../util/text.ts';
import { stringifyAnyDepth } from '../util/deep-json.ts';
import { operationsOf, type SomePatch } from '../util/patch-text.ts';
import { applyOperation, applyPatch, copyOf, CopyBudget, define, Draft, equal, isMap, parsePointer, patched, PatchError, pointerSegment, toPointer, valueAt } from './json-patch.ts';

export { MAX_COPIED_BYTES } from './json-patch.ts';

/**
 * The most of a patch error put in a message. It quotes the guest's paths, which are as long as
 * the guest makes them: a 900 KB path came back whole in the response and the log (red team).
 */
const PATCH_ERROR_LENGTH = 500;

export interface PolicyPatch<P extends SomePatch = SomePatch> {
  policy: string;
  /** As text when a worker kept it so (sandbox/outcome.ts PATCH_TEXT_FROM): parsed where it is combined. */
  operations: P;
  /**
   * Its policy's failure is ignored (failurePolicy Ignore): in a conflict with a policy whose is
   * not, this patch is the one left out, whichever comes first.
   */
  yields?: boolean;
  /** Its policy is on trial (enforcement warn): it yields to any patch not on trial, Ignore or not. */
  trial?: boolean;
}

/** A policy's patch as operations, as combinePatches reads it. */
type Decoded = PolicyPatch<PatchOperation[]>;

/** Which of two conflicting patches stays: the stronger; between equals, the earlier. */
function strength(patch: PolicyPatch): number {
  return patch.trial ? 0 : patch.yields ? 1 : 2;
}

export type PatchRejection =
  | { policy: string; reason: 'invalid'; message: string }
  /** The host could not merge it in time (merge/offload.ts): not the patch's fault. */
  | { policy: string; reason: 'unmerged'; message: string }
  | { policy: string; reason: 'conflict'; other: string; path: string; message: string };

export interface CombinedPatch {
  patch: PatchOperation[];
  /** Policies whose patch was left out, in input order. */
  rejected: PatchRejection[];
}

interface Write {
  policy: string;
  path: string[];
  /** JSON text of the value written (keys sorted), or undefined for a removal. */
  value: string | undefined;
  /** It adds an element at the end of a list of the original (`-`, or the index of its end). */
  append: boolean;
  /** It inserts or removes an element of a list of the original, before its last: later elements move. */
  shifts: boolean;
  /** It writes into an element past the end of a list of the original (one its own append made). */
  beyond: boolean;
  /** That list's pointer, when `beyond`. */
  beyondList: string | undefined;
  /** It removes the last element of a list of the original: positions past the new end change. */
  trims: boolean;
  /**
   * An empty map or list added where the original has none: it only makes sure one is there
   * (other policies may fill the map in, or append to the list; an SDK appending to a missing
   * list writes the empty list first).
   */
  ensures: boolean;
  /**
   * The list it indexes into after its own patch moved that list's elements or appended to it
   * (then its index counts what its own patch did there, which another policy's appends change).
   */
  relative?: string;
}

const NO_LIST_EFFECT = { append: false, shifts: false, beyond: false, beyondList: undefined, trims: false } as const;

// What identifies the object under review. A patch that changes one of these would make the
// apiserver refuse the response or, worse, store a different object than the one it admitted.
const IDENTITY = [['apiVersion'], ['kind'], ['metadata', 'name'], ['metadata', 'namespace'], ['metadata', 'uid']] as const;
const IDENTITY_POINTERS = IDENTITY.map((path) => toPointer(path));

/** Why a policy's patch may not be applied at all, whatever the other policies do. */
export function forbiddenChange(original: JsonValue, operations: PatchOperation[]): string | undefined {
  const root = operations.find((op) => op.path === '' || ('from' in op && op.from === ''));
  if (root) return `returned a patch that would ${root.op === 'remove' ? 'remove' : 'replace'} the whole object (path ""); a policy may change parts of it only`;
  // Only a patch that goes near the identity is applied here (a copy of the object each time).
  const near = (pointer: string) => IDENTITY_POINTERS.some((p) => p === pointer || p.startsWith(`${pointer}/`) || pointer.startsWith(`${p}/`));
  if (!operations.some((op) => near(op.path) || ('from' in op && near(op.from)))) return undefined;
  let changed: string | undefined;
  try {
    changed = identityChange(original, patched(original, operations));
  } catch {
    return undefined; // Not applicable at all: reported as such by the caller.
  }
  return changed ? `returned a patch that ${changed}` : undefined;
}

function identityChange(original: JsonValue, result: JsonValue): string | undefined {
  for (const path of IDENTITY) {
    const before = valueAt(original, path);
    const after = valueAt(result, path);
    // Compared and shown without recursion: a patch may move a value of the object nested deeper
    // than JSON.stringify goes, and an overflow here read as "no change" (review 4: a 6,000-deep
    // element moved to /metadata/namespace was allowed).
    if (before === undefined || after === undefined ? before !== after : !equal(before, after)) {
      const shown = (value: JsonValue | undefined) => (value === undefined ? 'absent' : foreignText(stringifyAnyDepth(value)));
      return `changes ${path.join('.')} (${shown(before)} to ${shown(after)}); ` +
        'a policy may not change apiVersion, kind, metadata.name, metadata.namespace or metadata.uid';
    }
  }
  return undefined;
}

export function combinePatches(original: JsonValue, given: PolicyPatch[]): CombinedPatch {
  const patches = given.map((p): Decoded => (Array.isArray(p.operations) ? p as Decoded : { ...p, operations: operationsOf(p.operations) }));
  const forbidden: PatchRejection[] = [];
  let allowed = patches.filter((p) => {
    let message: string | undefined;
    try {
      message = p.operations.length > 0 ? forbiddenChange(original, p.operations) : undefined;
    } catch (error) {
      message = `returned a patch the host cannot check: ${firstLine(error).message}`;
    }
    if (message) forbidden.push({ policy: p.policy, reason: 'invalid', message });
    return message === undefined;
  });
  let combined = combineAllowed(original, allowed);
  // A patch that must not fail, left out for a conflict with one whose failure is ignored: the
  // merge is made again without the latter (red team: an optional default label made the
  // mandatory one's policy deny the request, when per-policy webhooks would have applied both).
  // A patch on trial likewise gives way to any other. Once out of `allowed`, a patch is in no
  // later rejection, so each gives way at most once.
  const strengths = new Map(allowed.map((p) => [p.policy, strength(p)]));
  const gaveWay: PatchRejection[] = [];
  for (;;) {
    const blocked = combined.rejected.find((r): r is Extract<PatchRejection, { reason: 'conflict' }> =>
      r.reason === 'conflict' && (strengths.get(r.policy) ?? 2) > (strengths.get(r.other) ?? 2));
    if (!blocked) break;
    const winner = strengths.get(blocked.policy) === 2 ? 'which is enforced and whose failure is not ignored' : 'which is enforced (this one is on trial)';
    gaveWay.push({
      policy: blocked.other, reason: 'conflict', other: blocked.policy, path: blocked.path,
      message: `its patch conflicts with policy "${blocked.policy}"${blocked.path ? ` at ${foreignText(blocked.path)}` : ''}, ${winner}, and was left out`,
    });
    allowed = allowed.filter((p) => p.policy !== blocked.other);
    combined = combineAllowed(original, allowed);
  }
  // A patch that gave way to one left out in the end after all (it lost to a stronger one, or to
  // an equal) is tried again, in order, and kept if every patch taken without it is still taken
  // (review 4: a trial patch gave way to an Ignore one that a Fail one then pushed out, and
  // neither was sent). A patch rejected both with and without it keeps the reason it had
  // without it: the one given back is not what stopped it.
  for (const entry of gaveWay.concat()) {
    if (entry.reason !== 'conflict') continue;
    const before = taken(combined, allowed);
    if (before.includes(entry.other)) continue;
    const candidate = patches.filter((p) => p.policy === entry.policy || allowed.includes(p));
    const retried = combineAllowed(original, candidate);
    const after = taken(retried, candidate);
    if (!after.includes(entry.policy) || !before.every((name) => after.includes(name))) continue;
    const reasons = combined.rejected;
    allowed = candidate;
    combined = { patch: retried.patch, rejected: retried.rejected.map((r) => reasons.find((old) => old.policy === r.policy) ?? r) };
    gaveWay.splice(gaveWay.indexOf(entry), 1);
  }
  const rejected = [...forbidden, ...gaveWay, ...combined.rejected];
  return rejected.length === combined.rejected.length ? combined : { patch: combined.patch, rejected };
}

/** The policies among `from` whose patches `result` took. */
function taken(result: CombinedPatch, from: Decoded[]): string[] {
  return from.filter((p) => !result.rejected.some((r) => r.policy === p.policy)).map((p) => p.policy);
}

function combineAllowed(original: JsonValue, patches: Decoded[]): CombinedPatch {
  const active = patches.filter((p) => p.operations.length > 0);
  // One patching policy (the common case): nothing to compose, only to check.
  if (active.length === 1) {
    const { policy, operations } = active[0]!;
    const error = checkApplies(original, operations);
    return error
      ? { patch: [], rejected: [{ policy, reason: 'invalid', message: `returned a patch that does not apply to the object: ${foreignText(error.message, PATCH_ERROR_LENGTH)}` }] }
      : { patch: operations, rejected: [] };
  }
  // Several: each patch is checked alone on its own copy (whether it applies must not depend on
  // the policies before it: red team), then applied to one working copy, in place.
  let merged = new Draft(original);
  const accepted: Decoded[] = [];
  const writes = new WriteIndex();
  /** Where accepted policies copied or moved from: another policy writing there changes what they copied. */
  const reads = new WriteIndex();
  const rejected: PatchRejection[] = [];
  /** What accepted policies removed: the same removal by a later one is done once, not twice. */
  let removed = new Set<string>();
  const rebuild = () => {
    merged = new Draft(original);
    removed = new Set();
    for (const done of accepted) applyInPlace(merged, done.operations, original, removed);
  };
  for (const entry of active) {
    const { policy, operations } = entry;
    // What does not apply to the original is the policy's own fault, whatever the others did.
    const mine = checkApplies(original, operations) ?? policyWrites(policy, operations, original);
    if (mine instanceof Error) {
      rejected.push({ policy, reason: 'invalid', message: `returned a patch that does not apply to the object: ${foreignText(mine.message, PATCH_ERROR_LENGTH)}` });
      continue;
    }
    const clash = writes.conflict(mine.writes) ?? writes.conflict(mine.reads) ?? reads.conflict(mine.writes);
    if (clash) {
      rejected.push({ policy, reason: 'conflict', other: clash.policy, path: clash.path, message: `its patch conflicts with policy "${clash.policy}" at ${foreignText(clash.path)}` });
      continue;
    }
    const failure = applyInPlace(merged, operations, original, removed);
    // Each patch alone was checked; with the others, the identity could still change (one copies
    // from where another wrote).
    const changed = failure ? undefined : identityChange(original, merged.root);
    if (failure || changed) {
      // The working copy may be half-patched: rebuild it from the patches accepted so far.
      rebuild();
      const other = accepted.find((p) => p.policy !== policy)?.policy ?? policy;
      rejected.push(changed
        ? { policy, reason: 'invalid', message: `returned a patch that, applied after the patch of policy "${other}", ${changed}` }
        : { policy, reason: 'conflict', other, path: '', message: `its patch cannot apply after the patch of policy "${other}": ${foreignText(failure!.message, PATCH_ERROR_LENGTH)}` });
      continue;
    }
    accepted.push(entry);
    // The last patch is checked against no later one: its writes need no index.
    if (entry === active.at(-1)) continue;
    for (const write of mine.writes) writes.add(write);
    for (const read of mine.reads) reads.add(read);
  }
  const patch = diff(original, merged.root);
  // Belt and braces: the combined patch must take the original to the merged object, as the apiserver will apply it.
  const replayed = new Draft(original);
  const check = applies(replayed, patch);
  if (check) throw new Error(`internal error: combined patch does not apply: ${check.message}`);
  if (!equal(replayed.root, merged.root)) throw new Error('internal error: combined patch does not make the merged object');
  return { patch, rejected };
}

/** Applies operations to a copy of the document; returns why they do not apply, if they do not. */
function checkApplies(document: JsonValue, operations: PatchOperation[]): Error | undefined {
  return applies(new Draft(document), operations);
}

/** Applies operations to the document, in place; returns why they do not apply, if they do not. */
function applies(document: Draft, operations: PatchOperation[]): Error | undefined {
  try {
    applyPatch(document, operations);
    return undefined;
  } catch (error) {
    return firstLine(error);
  }
}

/**
 * Applies one policy's operations to the merged object, in place. An `add` that creates a map
 * the original lacked is applied leaf by leaf, so it fills in a map an earlier policy created
 * instead of replacing it (an empty one only makes sure the map is there); a removal an earlier
 * policy made already is not made again (twice, at the end of a list, it took another
 * policy's appended element: red team); every other operation applies as written. `removed`
 * gains what this patch removes.
 */
function applyInPlace(merged: Draft, operations: PatchOperation[], original: JsonValue, removed: Set<string>): Error | undefined {
  try {
    const budget = new CopyBudget();
    const touched = new Touched();
    // Shared by the patch's adds, as in policyWrites, so a map is filled in here exactly where it was indexed leaf by leaf.
    const expansion = { left: MAX_EXPANDED_WRITES };
    const mine: string[] = [];
    for (const op of operations) {
      const path = parsePointer(op.path);
      if (op.op === 'add' && fillsIn(path, op.value, original, touched)) {
        if (Object.keys(op.value as object).length === 0) {
          if (!isMap(valueAt(merged.root, path))) applyOperation(merged, op, budget);
        } else {
          fillIn(merged, path, op.value, expansion);
        }
      } else if (op.op === 'add' && ensuresList(path, op.value, original, touched)) {
        // An earlier policy's list there, with what it appended, stays.
        if (!Array.isArray(valueAt(merged.root, path))) applyOperation(merged, op, budget);
      } else if (op.op === 'remove' && removed.has(op.path) && !touched.overlaps(path)) {
        // Removed already by an earlier policy: the same removal, once.
      } else {
        applyOperation(merged, op, budget);
        if (op.op === 'remove' && valueAt(original, path) !== undefined) mine.push(op.path);
      }
      touched.add(path);
      if (op.op === 'move') touched.add(parsePointer(op.from));
    }
    for (const pointer of mine) removed.add(pointer);
    return undefined;
  } catch (error) {
    return firstLine(error);
  }
}

/** Writes an added map into the merged object leaf by leaf, where expand() indexed leaves. */
function fillIn(merged: Draft, path: string[], value: JsonValue, expansion: { left: number }): void {
  // An empty list in a new map only makes sure of it (expand): an earlier policy's list there stays.
  if (isEmptyList(value) && Array.isArray(valueAt(merged.root, path))) return;
  const keys = isMap(value) ? Object.keys(value) : [];
  if (keys.length === 0 || keys.length > expansion.left) return setDeep(merged, path, copyOf(value));
  expansion.left -= keys.length;
  for (const key of keys) fillIn(merged, [...path, key], (value as Record<string, JsonValue>)[key]!, expansion);
}

function firstLine(error: unknown): Error {
  if (error instanceof PatchError) return error;
  return error instanceof Error ? new Error(error.message.split('\n')[0]) : new Error(String(error));
}

/**
 * Writes a leaf of an expanded map. Its path runs through what the original has (expand saw to
 * that: maps and list elements, own and in range only), then maps this or an earlier policy created.
 */
function setDeep(document: Draft, path: string[], value: JsonValue): void {
  let node = document.own([]);
  for (const [i, segment] of path.slice(0, -1).entries()) {
    if (node === undefined) throw new PatchError(`${toPointer(path.slice(0, i))}: not an object`);
    if (valueAt(node, [segment]) !== undefined) {
      node = document.child(node, segment);
      continue;
    }
    if (!isMap(node)) throw new PatchError(`${toPointer(path.slice(0, i + 1))} does not exist`);
    const created = document.adopt({});
    define(node, segment, created);
    node = created;
  }
  if (!isMap(node)) throw new PatchError(`${toPointer(path)}: its parent is not an object`);
  define(node, path[path.length - 1]!, value);
}

/** Leaves a patch may be expanded into; past it, a new map is one write (it then conflicts rather than composes). */
const MAX_EXPANDED_WRITES = 10_000;
/**
 * The work of indexing a patch's writes: path segments times pointer length, summed. A patch
 * of deep paths with long keys made the index hash megabytes per write (red team: 14.7 s).
 */
const MAX_INDEX_WORK = 20_000_000;

interface PolicyWrites {
  writes: Write[];
  /** Where its copies and moves read from. */
  reads: Write[];
}

/** A patch's writes and reads for the index, or why the host will not merge it. */
function policyWrites(policy: string, operations: PatchOperation[], original: JsonValue): PolicyWrites | Error {
  try {
    return indexedWrites(policy, operations, original);
  } catch (error) {
    return firstLine(error);
  }
}

function indexedWrites(policy: string, operations: PatchOperation[], original: JsonValue): PolicyWrites {
  const budget = new CopyBudget();
  const expansion = { left: MAX_EXPANDED_WRITES };
  const writes: Write[] = [];
  const reads: Write[] = [];
  // A value no other write can equal: what a copy or move writes depends on what the patch did
  // before it, so two policies writing "the same" there is no proof of agreement.
  let opaque = 0;
  const unique = () => `\u0000${policy}\u0000${opaque++}`;
  const write = (path: string[], value: string | undefined, kind: Change): Write =>
    ({ policy, path, value, ensures: false, ...listEffect(original, path, kind) });
  let work = 0;
  const touched = new Touched();
  // Lists whose positions this patch has changed so far (an insert, a removal, an append).
  const moved = new Set<string>();
  // Lists the original lacks that this patch made sure of (an empty one added), by pointer.
  const ensured = new Set<string>();
  let seen = { writes: 0, reads: 0 };
  for (const op of operations) {
    const path = parsePointer(op.path);
    const from = op.op === 'move' || op.op === 'copy' ? parsePointer(op.from) : [];
    switch (op.op) {
      case 'test':
        reads.push(write(path, unique(), 'set'));
        break;
      case 'remove':
        writes.push(write(path, undefined, 'remove'));
        break;
      case 'move':
      case 'copy': {
        // What following it costs, bounded like the copies themselves.
        const source = valueAt(original, from);
        if (source !== undefined) budget.spend(source);
        reads.push(write(from, unique(), 'set'));
        if (op.op === 'move') writes.push(write(from, undefined, 'remove'));
        writes.push(write(path, unique(), 'insert'));
        break;
      }
      case 'add': {
        const made = expand(policy, path, op.value, original, expansion, touched);
        for (const w of made) if (w.ensures && w.value === '[]') ensured.add(toPointer(w.path));
        writes.push(...made);
        break;
      }
      case 'replace':
        writes.push(write(path, JSON.stringify(sorted(op.value)), 'set'));
        break;
    }
    touched.add(path);
    if (op.op === 'move') touched.add(from);
    // In the order the operation does them: a move's removal comes before its insert.
    for (const w of [...reads.slice(seen.reads), ...writes.slice(seen.writes)]) {
      if (ensured.size > 0) intoEnsured(w, ensured, op.op === 'add' && w.path.length === path.length);
      const relative = relativeTo(w.path, moved);
      if (relative !== undefined) w.relative = relative;
      if (w.append || w.shifts || w.trims) moved.add(toPointer(w.path.slice(0, -1)));
    }
    seen = { writes: writes.length, reads: reads.length };
  }
  for (const w of [...writes, ...reads]) work += w.path.length * (w.path.reduce((n, s) => n + s.length + 1, 0));
  if (work > MAX_INDEX_WORK) throw new PatchError(`its patch writes too many, too deep paths to merge (${writes.length} writes)`);
  return { writes, reads };
}

/**
 * A write into a list its own patch made sure of (`ensured`, empty in the original's stead) is
 * what the same write into an empty list of the original is: `-` last, an append; any other
 * position, past the end (a position among what was appended, which another policy's appends
 * change). Red team: a policy inserting at the head of such a list moved another's own index
 * write onto the wrong element.
 */
function intoEnsured(w: Write, ensured: Set<string>, adds: boolean): void {
  let pointer = '';
  for (let i = 0; i < w.path.length; i++) {
    if (ensured.has(pointer)) {
      if (w.path[i] === '-' && i === w.path.length - 1 && adds) w.append = true;
      else Object.assign(w, { beyond: true, beyondList: pointer });
      return;
    }
    pointer += pointerSegment(w.path[i]!);
  }
}

/**
 * The first list of `moved` that `path` goes into by index (not by `-`, an append, which lands at
 * the end whatever came before). Red team: a policy that moved its first container to the end
 * and then wrote into index 1 (its own moved container, applied alone) wrote into another
 * policy's appended sidecar when the two were combined.
 */
function relativeTo(path: string[], moved: Set<string>): string | undefined {
  if (moved.size === 0) return undefined;
  let pointer = '';
  for (const segment of path) {
    if (moved.has(pointer) && segment !== '-') return pointer;
    pointer += pointerSegment(segment);
  }
  return undefined;
}

/** What a write does at its place: add there (insert), remove what is there, or replace it. */
type Change = 'insert' | 'remove' | 'set';

/**
 * What writing at `path` does to the lists of the original it goes through, in one walk: an
 * append (`-` at the end of the path), a move of later elements (insert before the end, remove
 * before the last), or a write past the original end (at an index the original list does not
 * have: it depends on what appends came before).
 */
function listEffect(original: JsonValue, path: string[], change: Change): Pick<Write, 'append' | 'shifts' | 'beyond' | 'beyondList' | 'trims'> {
  const none = NO_LIST_EFFECT;
  const beyond = (i: number) => ({ ...none, beyond: true, beyondList: toPointer(path.slice(0, i)) });
  let node: JsonValue | undefined = original;
  for (const [i, segment] of path.entries()) {
    const last = i === path.length - 1;
    if (Array.isArray(node)) {
      if (segment === '-') return last && change === 'insert' ? { ...none, append: true } : beyond(i);
      if (/^\d+$/.test(segment)) {
        const index = Number(segment);
        if (index >= node.length) return beyond(i);
        if (last) return { ...none, shifts: change === 'insert' || (change === 'remove' && index < node.length - 1), trims: change === 'remove' && index === node.length - 1 };
      }
    }
    if (last || node === undefined) return none;
    node = valueAt(node, [segment]);
  }
  return none;
}

/**
 * An object added where the original has nothing, under an object it has, is a set of writes
 * to its leaves. Not an element of a list (its path is a position, not a key: expanded, an
 * append of a map became a property "-" of the list and was lost), nor under something missing
 * (the add does not apply) or not an object.
 */
function expand(
  policy: string, path: string[], value: JsonValue, original: JsonValue, expansion: { left: number }, touched: Touched, created = false,
): Write[] {
  // An empty list, where the original has none or inside a map this add creates, only makes sure of it.
  if (created ? isEmptyList(value) : ensuresList(path, value, original, touched)) return [{ policy, path, value: '[]', ensures: true, ...NO_LIST_EFFECT }];
  const keys = isMap(value) ? Object.keys(value) : [];
  if (keys.length <= expansion.left && (created ? keys.length > 0 : fillsIn(path, value, original, touched))) {
    // An empty map only makes sure a map is there: other policies may fill it in, or add the same,
    // but not write something else there (red team: their list was replaced by it).
    if (keys.length === 0) return [{ policy, path, value: '{}', ensures: true, ...NO_LIST_EFFECT }];
    expansion.left -= keys.length;
    return keys.flatMap((key) => expand(policy, [...path, key], (value as Record<string, JsonValue>)[key]!, original, expansion, touched, true));
  }
  const effect = created ? NO_LIST_EFFECT : listEffect(original, path, 'insert');
  return [{ policy, path, value: JSON.stringify(sorted(value)), ensures: false, ...effect }];
}

/**
 * Whether an `add` of an empty list only makes sure a list is there: where the original has
 * nothing, under a map it has, and where this patch has not written before. Two policies
 * appending to a list the original lacks each write it first (the SDKs do), then append: the
 * appends compose as they do on a list the original has (newcomer: they conflicted, and the
 * Pod was denied, where per-policy webhooks would have added both).
 */
function ensuresList(path: string[], value: JsonValue, original: JsonValue, touched: Touched): boolean {
  return isEmptyList(value) && newUnderMap(path, original, touched);
}

/** A place the original lacks, under a map it has, where this patch has not written before. */
function newUnderMap(path: string[], original: JsonValue, touched: Touched): boolean {
  return path.length > 0 && valueAt(original, path) === undefined && isMap(valueAt(original, path.slice(0, -1))) && !touched.overlaps(path);
}

function isEmptyList(value: JsonValue): boolean {
  return Array.isArray(value) && value.length === 0;
}

/**
 * Whether an `add` fills in a map rather than writing its value as a whole: a map, where the
 * original has nothing, under a map it has, and where this patch has not written before (its
 * own earlier map there is replaced, as RFC 6902 says, not merged into: red team).
 */
function fillsIn(path: string[], value: JsonValue, original: JsonValue, touched: Touched): boolean {
  return isMap(value) && newUnderMap(path, original, touched);
}

/**
 * The paths a patch has written so far. Indexed only when asked (only an `add` of a map asks):
 * a patch of thousands of plain writes spent a third of its merge here (red team).
 */
class Touched {
  readonly #at = new Set<string>();
  /** Every strict prefix of a path written. */
  readonly #above = new Set<string>();
  /** Written since the last question, not yet in the sets. */
  #pending: string[][] = [];

  /** Written at, above or below `path`. */
  overlaps(path: string[]): boolean {
    for (const written of this.#pending) {
      const keys = prefixes(written);
      this.#at.add(keys[keys.length - 1]!);
      for (const key of keys.slice(0, -1)) this.#above.add(key);
    }
    this.#pending = [];
    const keys = prefixes(path);
    const key = keys[keys.length - 1]!;
    return this.#at.has(key) || this.#above.has(key) || keys.slice(0, -1).some((k) => this.#at.has(k));
  }

  add(path: string[]): void {
    this.#pending.push(path);
  }
}

/** The value with its maps' keys in order, so the same value written twice compares equal. */
function sorted(value: JsonValue): JsonValue {
  if (Array.isArray(value)) return value.map(sorted);
  if (!isMap(value)) return value;
  const out: Record<string, JsonValue> = {};
  // Assignment is much faster than defineProperty on a large map; only "__proto__" needs it.
  for (const key of Object.keys(value).sort()) {
    if (key === '__proto__') define(out, key, sorted(value[key]!));
    else out[key] = sorted(value[key]!);
  }
  return out;
}

/**
 * The writes of the policies accepted so far, indexed by path, so a policy's writes are checked
 * in time proportional to their number and depth (comparing every pair took 12 s with two
 * policies of 20,000 writes each, red team).
 */
class WriteIndex {
  /** Writes (not appends) by their exact path. */
  readonly #at = new Map<string, Write[]>();
  /** The first write (not an append) strictly below each path. */
  readonly #below = new Map<string, Write>();
  /** The first write below each path by a key that is no list position there (see #conflict). */
  readonly #keyedBelow = new Map<string, Write>();
  /** The first append into each list, by the list's path. */
  readonly #appends = new Map<string, Write>();
  /** The first write into an element past the end of each list. */
  readonly #beyond = new Map<string, Write>();
  /** The first write that moves the elements of each list, by the list's path. */
  readonly #shifting = new Map<string, Write>();
  /** The first removal of the last element of each list, by the list's path. */
  readonly #trimmed = new Map<string, Write>();
  /** The first write past the end of each list, by that list's path (not its ancestors'). */
  readonly #beyondIn = new Map<string, Write>();
  /** The first write into each list by an index its own patch had moved (see Write.relative). */
  readonly #relative = new Map<string, Write>();

  add(write: Write): void {
    const keys = prefixes(write.path);
    const key = keys[keys.length - 1]!;
    const list = keys[keys.length - 2]!;
    if (write.relative !== undefined && !this.#relative.has(write.relative)) this.#relative.set(write.relative, write);
    if (write.append) {
      if (!this.#appends.has(list)) this.#appends.set(list, write);
      // A later write above the list would undo the append (red team: a replaced securityContext
      // dropped another policy's "ALL" from capabilities.drop).
      this.#noteBelow(write, keys.slice(0, -2));
      return;
    }
    // Two different values are enough to tell any third write there apart: keep at most two, and
    // a whole map beside an empty one that only made sure of it (red team: that one, first, hid the
    // whole map from a third policy filling it in).
    const same = this.#at.get(key);
    if (!same) this.#at.set(key, [write]);
    else if (same.length < 3 && same.every((w) => w.value !== write.value || w.ensures !== write.ensures)) {
      if (same.length < 2 || !write.ensures) same.push(write);
    }
    this.#noteBelow(write, keys.slice(0, -1));
    if (write.shifts && !this.#shifting.has(list)) this.#shifting.set(list, write);
    if (write.trims && !this.#trimmed.has(list)) this.#trimmed.set(list, write);
    if (write.beyond && !this.#beyondIn.has(write.beyondList!)) this.#beyondIn.set(write.beyondList!, write);
    if (write.beyond) {
      for (let i = 0; i < write.path.length; i++) if (!this.#beyond.has(keys[i]!)) this.#beyond.set(keys[i]!, write);
    }
  }

  /** `write` as the first below each of `prefixes` (its ancestors' pointers), and by a key if it is. */
  #noteBelow(write: Write, prefixes: string[]): void {
    for (const [i, prefix] of prefixes.entries()) {
      if (!this.#below.has(prefix)) this.#below.set(prefix, write);
      if (!isPosition(write.path[i]!) && !this.#keyedBelow.has(prefix)) this.#keyedBelow.set(prefix, write);
    }
  }

  /** The first earlier write one of `mine` collides with: where it collides, and whose it is. */
  conflict(mine: Write[]): { policy: string; path: string } | undefined {
    for (const a of mine) {
      const found = this.#conflict(a);
      if (found) return found;
    }
    return undefined;
  }

  #conflict(a: Write): { policy: string; path: string } | undefined {
    const keys = prefixes(a.path);
    const key = keys[keys.length - 1]!;
    const list = keys[keys.length - 2]!;
    const at = (w: Write, path = toPointer(w.path)) => ({ policy: w.policy, path });
    // An earlier write to a's path's ancestor (the list itself, for an append), or to a list
    // a's path goes into whose elements it moved.
    for (const [i, prefix] of keys.slice(0, -1).entries()) {
      // Writing inside a map another policy only made sure of keeps it a map; inside a list one
      // made sure of, only by position (a key there would make it a map: red team).
      const above = this.#at.get(prefix)?.find((w) => !w.ensures || (w.value === '[]' && !isPosition(a.path[i]!)));
      if (above) return at(above, prefix);
      // An append goes to the end of its own list however it moved, not of a list above it.
      const shifted = a.append && prefix === list ? undefined : this.#shifting.get(prefix);
      if (shifted) return at(shifted);
    }
    // An index that counts what its own patch moved in a list, against another's append there
    // (either order): the append makes it another position.
    if (a.relative !== undefined) {
      const other = this.#appends.get(a.relative) ?? this.#beyondIn.get(a.relative);
      if (other) return at(other);
    }
    if (a.append) {
      // Into an element past the end: an append of the other policy would be what it changes.
      const beyond = this.#beyond.get(list) ?? this.#relative.get(list);
      return beyond ? at(beyond) : undefined;
    }
    if (a.beyond) {
      // Positions past the original end belong to what was appended before: another policy's
      // appends, or its own writes there, make them other positions.
      for (const prefix of keys) {
        const other = this.#appends.get(prefix) ?? this.#beyond.get(prefix);
        if (other) return at(other);
      }
      // Only a trim of the very list it writes past the end of moves that end (red team: the last
      // container removed clashed with an env append by index inside the first).
      const trimmed = this.#trimmed.get(a.beyondList!);
      if (trimmed) return at(trimmed);
    }
    // Removing a list's last element moves where writes past the end land (red team: it made
    // another policy's write past the end hit the element that policy had just removed).
    if (a.trims) {
      const beyond = this.#beyondIn.get(list);
      if (beyond) return at(beyond);
    }
    // The same path: only the same value, with no list moving, is no conflict.
    for (const b of this.#at.get(key) ?? []) {
      if (a.ensures || b.ensures) {
        // A map made sure of takes maps; a list made sure of, only the same.
        if (!(isMapText(a.value) && isMapText(b.value)) && !(a.value === '[]' && b.value === '[]')) return at(b, key);
        continue;
      }
      if (b.value !== a.value || a.shifts || b.shifts || a.beyond || b.beyond) return at(b, key);
    }
    // Filling in what it made sure of is no conflict; but a list made sure of where another
    // wrote a key below is (red team: that map's key was lost to the list).
    if (a.ensures) {
      const keyed = a.value === '[]' ? this.#keyedBelow.get(key) : undefined;
      return keyed ? at(keyed) : undefined;
    }
    // An earlier write below a's path (an append into it too); or, when a moves a list's
    // elements, anywhere in that list.
    const below = this.#below.get(key) ?? this.#appends.get(key) ?? (a.shifts ? this.#below.get(list) : undefined);
    if (below) return at(below, a.shifts ? key : toPointer(below.path));
    return undefined;
  }
}

/** A segment that names a position in a list: `-`, or an index. */
function isPosition(segment: string): boolean {
  return segment === '-' || /^\d+$/.test(segment);
}

/** A written value's text is a map's (copies and moves write opaque values, which are not). */
function isMapText(value: string | undefined): boolean {
  return value !== undefined && value.startsWith('{');
}

/** The pointers of a path's ancestors and of itself: "", "/a", "/a/b" for ["a", "b"]. */
function prefixes(path: string[]): string[] {
  const keys = [''];
  for (const segment of path) keys.push(keys[keys.length - 1] + pointerSegment(segment));
  return keys;
}

/** The object as the apiserver would store it after `patch` (a copy; the original is untouched). */
export function patchedObject(object: JsonValue | null | undefined, patch: PatchOperation[]): JsonValue | null {
  if (object === null || object === undefined || patch.length === 0) return object ?? null;
  // Shares what the patch did not change with `object`: read it, do not change it.
  return patched(object, patch);
}
