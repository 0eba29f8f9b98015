// The one JSONPatch that takes the original object to the merged one, for the response. Its size
// and the time to make it follow the object's size, never a product of sizes: fast-json-patch's
// compare() rewrote every later element of a list whose first element was removed, and a 2.6 MiB
// Pod with a 680,000-element list (any user may send one; the apiserver validates it only after
// the mutating webhooks) became an 88 MB response and 3 s of main thread (red team).
import type { JsonValue, PatchOperation } from '@portcullis/sdk';
import { equal, isMap, pointerSegment } from './json-patch.ts';

/** Past this many operations under one map or list, the whole of it is replaced in one. */
export const MAX_OPERATIONS_PER_NODE = 64;
/**
 * Past this many pointer characters in the operations under one map or list, it is replaced
 * too: each operation repeats its ancestors' keys, and 64 changes under a 1.4 MB key made an
 * 89.6 MB patch (red team). A replace writes the key once and the value once.
 */
export const MAX_POINTER_CHARS_PER_NODE = 64 * 1024;
/** Past this many elements inserted into or removed from one place of a list, the list is replaced. */
const MAX_LIST_EDITS = 16;
/**
 * A map or list nested deeper than this is not replaced whole but walked, whatever the number
 * of operations: the replace would carry it in the response, and serializing a value some 5,000
 * levels deep overflows the call stack (red team: a custom resource with such a field, and a
 * policy touching 70 of its list's elements, failed every patching policy). The apiserver lets
 * objects nest 10,000 deep; patches from policies nest at most 64 (sandbox/outcome.ts).
 */
export const MAX_REPLACED_DEPTH = 1000;
/** A resized list too deep to replace is edited element by element, up to this many edits. */
const MAX_DEEP_LIST_EDITS = 4096;

/**
 * A map or list being walked. `at` is its pointer, already escaped: a child's is `at` plus its
 * own segment, so no operation rebuilds its whole path (red team: a long key above many changes
 * cost minutes). `start` and `chars` are where the output stood when the walk entered it.
 */
interface Node {
  readonly before: JsonValue;
  readonly after: JsonValue;
  readonly at: string;
  readonly start: number;
  readonly chars: number;
  /** Map: the keys of `before` (looking for removals), then those of `after`. List: unused. */
  keys: string[];
  removals: boolean;
  next: number;
  /** Its value nests deeper than MAX_REPLACED_DEPTH, or holds an inexact number: walked, never replaced. */
  deep?: boolean;
}

/**
 * The walk keeps its own stack: an object may nest thousands deep (the apiserver does not limit
 * depth before the webhooks), and a recursive walk overflowed at 3,711 levels, failing every
 * patching policy on such a request (red team).
 */
export function diff(original: JsonValue, merged: JsonValue): PatchOperation[] {
  const out: PatchOperation[] = [];
  let chars = 0;
  const stack: Node[] = [];
  const emit = (operation: PatchOperation) => {
    out.push(operation);
    chars += operation.path.length;
  };
  const visit = (before: JsonValue, after: JsonValue, at: string) => {
    if (before === after) return;
    if (isMap(before) && isMap(after)) {
      stack.push({ before, after, at, start: out.length, chars, keys: Object.keys(before), removals: true, next: 0 });
    } else if (Array.isArray(before) && Array.isArray(after)) {
      if (before.length === after.length) stack.push({ before, after, at, start: out.length, chars, keys: [], removals: false, next: 0 });
      else walkResized(before, after, at, emit);
    } else if (!equal(before, after)) {
      emit({ op: 'replace', path: at, value: after });
    }
  };

  visit(original, merged, '');
  while (stack.length > 0) {
    const node = stack[stack.length - 1]!;
    const { before, after, at } = node;
    // Below the root a node with too much changed is replaced whole; the walk under it stops there.
    if (at !== '' && !node.deep && (out.length - node.start > MAX_OPERATIONS_PER_NODE || chars - node.chars > MAX_POINTER_CHARS_PER_NODE)) {
      if (deeperThan(after, MAX_REPLACED_DEPTH) || holdsInexactNumber(after)) {
        // So is every node above it, which contains it.
        for (let i = stack.length - 1; i >= 0 && !stack[i]!.deep; i--) stack[i]!.deep = true;
        continue;
      }
      out.length = node.start;
      chars = node.chars;
      emit({ op: 'replace', path: at, value: after });
      stack.pop();
      continue;
    }
    if (Array.isArray(before) && Array.isArray(after)) {
      // Element by element; a list whose elements all moved (a rotation) is soon full, and replaced.
      let i = node.next;
      while (i < after.length && before[i] === after[i]) i++;
      if (i === after.length) {
        stack.pop();
        continue;
      }
      node.next = i + 1;
      visit(before[i]!, after[i]!, `${at}/${i}`);
      continue;
    }
    if (!isMap(before) || !isMap(after)) throw new Error('diff: a walked node is neither a map nor a list');
    if (node.removals) {
      const key = node.keys[node.next++];
      if (key !== undefined) {
        if (!Object.hasOwn(after, key)) emit({ op: 'remove', path: at + pointerSegment(key) });
        continue;
      }
      node.removals = false;
      node.keys = Object.keys(after);
      node.next = 0;
    }
    const key = node.keys[node.next++];
    if (key === undefined) {
      stack.pop();
      continue;
    }
    const value = after[key]!;
    if (!Object.hasOwn(before, key)) emit({ op: 'add', path: at + pointerSegment(key), value });
    else if (before[key] !== value) visit(before[key]!, value, at + pointerSegment(key));
  }
  return out;
}

/**
 * A list that grew or shrank: elements kept at the front and at the back are left alone; a few
 * elements only inserted between them are adds, a few only removed are removes, and anything
 * else is one replace of the list. Nothing here walks into elements, so the comparisons cost
 * each element once.
 */
function walkResized(before: JsonValue[], after: JsonValue[], at: string, emit: (operation: PatchOperation) => void): void {
  const shorter = Math.min(before.length, after.length);
  let front = 0;
  while (front < shorter && equal(before[front]!, after[front]!)) front++;
  let back = 0;
  while (back < shorter - front && equal(before[before.length - 1 - back]!, after[after.length - 1 - back]!)) back++;
  const removed = before.length - front - back;
  const added = after.length - front - back;
  if (removed === 0 && added <= MAX_LIST_EDITS) {
    for (let i = 0; i < added; i++) emit({ op: 'add', path: `${at}/${front + i}`, value: after[front + i]! });
  } else if (added === 0 && removed <= MAX_LIST_EDITS) {
    // Each removal at the same index takes the next element down.
    for (let i = 0; i < removed; i++) emit({ op: 'remove', path: `${at}/${front}` });
  } else if (removed + added <= MAX_DEEP_LIST_EDITS && (deeperThan(after, MAX_REPLACED_DEPTH) || keepsExact(after, front, front + added))) {
    for (let i = 0; i < removed; i++) emit({ op: 'remove', path: `${at}/${front}` });
    for (let i = 0; i < added; i++) emit({ op: 'add', path: `${at}/${front + i}`, value: after[front + i]! });
  } else {
    emit({ op: 'replace', path: at, value: after });
  }
}

/**
 * Whether `value` holds a number JSON.parse could not read exactly: an integer beyond 2^53 (an
 * int64 field of a custom resource), or one too large for a double. The object is the host's
 * parse of the request, so a replace that carries such a number writes back a rounded one (or
 * null) where no policy wrote (red team: 65 containers each with 9223372036854775807, and three
 * policies patching them, sent back 9223372036854776000, outside int64): a map or list holding
 * one is walked, and only what changed is written.
 */
export function holdsInexactNumber(value: JsonValue): boolean {
  const pending: JsonValue[] = [value];
  while (pending.length > 0) {
    const node = pending.pop()!;
    if (typeof node === 'number') {
      if (!Number.isFinite(node) || (Number.isInteger(node) && !Number.isSafeInteger(node))) return true;
    } else if (node !== null && typeof node === 'object') {
      for (const child of Array.isArray(node) ? node : Object.values(node)) pending.push(child);
    }
  }
  return false;
}

/**
 * A resized list holding inexact numbers, whose inserted elements [from, to) hold none: removing
 * and inserting elements writes only those, exactly. Where the inserted ones hold such numbers
 * (a policy moved elements that carry them), the list is replaced: docs/policy-contract.md says so.
 */
function keepsExact(after: JsonValue[], from: number, to: number): boolean {
  return holdsInexactNumber(after) && !after.slice(from, to).some(holdsInexactNumber);
}

/** Whether maps and lists nest more than `limit` levels in `value` (its own stack; stops at the first such path). */
export function deeperThan(value: JsonValue, limit: number): boolean {
  const pending: [JsonValue, number][] = [[value, 0]];
  while (pending.length > 0) {
    const [node, depth] = pending.pop()!;
    if (node === null || typeof node !== 'object') continue;
    if (depth >= limit) return true;
    for (const child of Array.isArray(node) ? node : Object.values(node)) {
      if (child !== null && typeof child === 'object') pending.push([child, depth + 1]);
    }
  }
  return false;
}
