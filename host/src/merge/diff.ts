// The one JSONPatch that takes the original object to the merged one, for the response. Its size
// follows what the policies changed, not the size of the lists they changed: fast-json-patch's
// compare() rewrote every later element of a list whose first element was removed, and a 2.6 MiB
// Pod with a 680,000-element list (any user may send one; the apiserver validates it only after
// the mutating webhooks) became an 88 MB response and 3 s of main thread (red team).
import type { JsonValue, PatchOperation } from '@portcullis/sdk';
import { equal, isMap, toPointer } from './json-patch.ts';

export function diff(original: JsonValue, merged: JsonValue): PatchOperation[] {
  const operations: PatchOperation[] = [];
  walk(original, merged, [], operations);
  return operations;
}

function walk(before: JsonValue, after: JsonValue, path: string[], out: PatchOperation[]): void {
  if (before === after) return;
  if (isMap(before) && isMap(after)) {
    for (const key of Object.keys(before)) {
      if (!Object.hasOwn(after, key)) out.push({ op: 'remove', path: toPointer([...path, key]) });
    }
    for (const key of Object.keys(after)) {
      if (Object.hasOwn(before, key)) walk(before[key]!, after[key]!, [...path, key], out);
      else out.push({ op: 'add', path: toPointer([...path, key]), value: after[key]! });
    }
    return;
  }
  if (Array.isArray(before) && Array.isArray(after)) return walkList(before, after, path, out);
  if (!equal(before, after)) out.push({ op: 'replace', path: toPointer(path), value: after });
}

/**
 * Elements kept at the front and at the back are left alone; between them, elements only
 * inserted become adds, elements only removed become removes, the same number on both sides is
 * compared element by element, and anything else is one replace of the list (never more
 * operations than the list has elements).
 */
function walkList(before: JsonValue[], after: JsonValue[], path: string[], out: PatchOperation[]): void {
  let front = 0;
  const shorter = Math.min(before.length, after.length);
  while (front < shorter && equal(before[front]!, after[front]!)) front++;
  let back = 0;
  while (back < shorter - front && equal(before[before.length - 1 - back]!, after[after.length - 1 - back]!)) back++;
  const removed = before.length - front - back;
  const added = after.length - front - back;
  if (removed === 0) {
    for (let i = 0; i < added; i++) out.push({ op: 'add', path: toPointer([...path, String(front + i)]), value: after[front + i]! });
  } else if (added === 0) {
    // Each removal at the same index takes the next element down.
    for (let i = 0; i < removed; i++) out.push({ op: 'remove', path: toPointer([...path, String(front)]) });
  } else if (removed === added) {
    for (let i = 0; i < added; i++) walk(before[front + i]!, after[front + i]!, [...path, String(front + i)], out);
  } else {
    out.push({ op: 'replace', path: toPointer(path), value: after });
  }
}
