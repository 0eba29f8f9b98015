// The one JSONPatch that takes the original object to the merged one, for the response. Its size
// and the time to make it follow the object's size, never a product of sizes: fast-json-patch's
// compare() rewrote every later element of a list whose first element was removed, and a 2.6 MiB
// Pod with a 680,000-element list (any user may send one; the apiserver validates it only after
// the mutating webhooks) became an 88 MB response and 3 s of main thread (red team).
import type { JsonValue, PatchOperation } from '@portcullis/sdk';
import { equal, isMap, pointerSegment } from './json-patch.ts';

/** Past this many operations under one map or list, the whole of it is replaced in one. */
export const MAX_OPERATIONS_PER_NODE = 64;
/** Past this many elements inserted into or removed from one place of a list, the list is replaced. */
const MAX_LIST_EDITS = 16;

export function diff(original: JsonValue, merged: JsonValue): PatchOperation[] {
  const operations: PatchOperation[] = [];
  walk(original, merged, '', operations);
  return operations;
}

/**
 * `at` is the node's pointer, already escaped: a child's is `at` plus its own segment, so no
 * operation rebuilds its whole path (red team: a long key above many changes cost minutes).
 */
function walk(before: JsonValue, after: JsonValue, at: string, out: PatchOperation[]): void {
  if (before === after) return;
  const start = out.length;
  // Below the root a node with too much changed is replaced whole; the walk under it stops there.
  const full = () => at !== '' && out.length - start > MAX_OPERATIONS_PER_NODE;
  if (isMap(before) && isMap(after)) {
    for (const key of Object.keys(before)) {
      if (Object.hasOwn(after, key)) continue;
      out.push({ op: 'remove', path: at + pointerSegment(key) });
      if (full()) return replaceWhole(after, at, out, start);
    }
    for (const key of Object.keys(after)) {
      const value = after[key]!;
      if (!Object.hasOwn(before, key)) out.push({ op: 'add', path: at + pointerSegment(key), value });
      else if (before[key] === value) continue;
      else walk(before[key]!, value, at + pointerSegment(key), out);
      if (full()) return replaceWhole(after, at, out, start);
    }
    return;
  }
  if (Array.isArray(before) && Array.isArray(after)) {
    if (before.length === after.length) {
      // Element by element; a list whose elements all moved (a rotation) is soon full, and replaced.
      for (let i = 0; i < after.length; i++) {
        if (before[i] === after[i]) continue;
        walk(before[i]!, after[i]!, `${at}/${i}`, out);
        if (full()) return replaceWhole(after, at, out, start);
      }
      return;
    }
    return walkResized(before, after, at, out);
  }
  if (!equal(before, after)) out.push({ op: 'replace', path: at, value: after });
}

function replaceWhole(after: JsonValue, at: string, out: PatchOperation[], start: number): void {
  out.length = start;
  out.push({ op: 'replace', path: at, value: after });
}

/**
 * A list that grew or shrank: elements kept at the front and at the back are left alone; a few
 * elements only inserted between them are adds, a few only removed are removes, and anything
 * else is one replace of the list. Nothing here walks into elements, so the comparisons cost
 * each element once.
 */
function walkResized(before: JsonValue[], after: JsonValue[], at: string, out: PatchOperation[]): void {
  const shorter = Math.min(before.length, after.length);
  let front = 0;
  while (front < shorter && equal(before[front]!, after[front]!)) front++;
  let back = 0;
  while (back < shorter - front && equal(before[before.length - 1 - back]!, after[after.length - 1 - back]!)) back++;
  const removed = before.length - front - back;
  const added = after.length - front - back;
  if (removed === 0 && added <= MAX_LIST_EDITS) {
    for (let i = 0; i < added; i++) out.push({ op: 'add', path: `${at}/${front + i}`, value: after[front + i]! });
  } else if (added === 0 && removed <= MAX_LIST_EDITS) {
    // Each removal at the same index takes the next element down.
    for (let i = 0; i < removed; i++) out.push({ op: 'remove', path: `${at}/${front}` });
  } else {
    out.push({ op: 'replace', path: at, value: after });
  }
}
