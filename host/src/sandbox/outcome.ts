// The typed result of evaluating one policy, and the reading of what a guest returned. Guest
// output is untrusted: anything not in the contract's shape is a crash of that policy. Here, in
// the sandbox layer, because a worker reads a long answer before the main thread sees it
// (compactOutput).
import type { JsonValue, PatchOperation } from '@portcullis/sdk';
import { PortcullisError } from '../errors.ts';
import type { PatchText, SomePatch } from '../util/patch-text.ts';
import { guestMessage, MAX_MESSAGE_LENGTH, MAX_WARNING_LENGTH, MESSAGE_SLACK, WARNING_CONTROLS } from '../util/text.ts';

/**
 * Why a policy failed, in merge priority order after an explicit denial:
 *  permanent (the policy says it cannot decide) > temporary (it says retry later, or it hit
 *  a CPU/memory/output cap) > crash (uncaught exception, trap, malformed output).
 */
export type FailureKind = 'permanent' | 'temporary' | 'crash';

interface Common {
  policy: string;
  warnings: string[];
  /** Time inside the guest, and the whole call including the hop into the sandbox (µs). */
  guestMicros?: number;
  totalMicros?: number;
  /** What the guest logged during the call (ctx.log, console, Extism's log functions); absent when nothing. */
  logs?: GuestLog[];
}

/** One line a guest logged: its level (debug, info, warn, error) and text, already cut to size. */
export type GuestLog = [level: string, message: string];

/** `patch`: text when a worker kept a long answer's large patch so (compactOutput); the public API's is operations (evaluatePolicy). */
export type Outcome<P extends SomePatch = SomePatch> =
  | (Common & { status: 'allowed'; patch: P })
  | (Common & { status: 'denied'; code: number; message: string })
  | (Common & { status: 'failed'; failure: FailureKind; message: string });

const OPS = new Set(['add', 'remove', 'replace', 'move', 'copy', 'test']);

export class MalformedOutput extends PortcullisError {
  constructor(message: string) {
    super('MALFORMED_OUTPUT', message);
  }
}

/**
 * `compacted`: the text is compactOutput's, made by the worker from an answer it checked: its
 * message is cut already, and its patch is not walked again.
 */
export function decodeOutput(policy: string, text: string, compacted = false): Outcome {
  return decodeValue(policy, parseOutput(text), compacted);
}

function parseOutput(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    throw new MalformedOutput(`returned output that is not JSON (${preview(text)})`);
  }
}

/** Answers shorter than this go to the main thread as they came: a few hundred µs to parse at worst. */
export const COMPACT_FROM_CHARS = 8192;

/**
 * What the main thread is handed of a long answer, as the worker that ran the guest reads it:
 * the contract's members alone, checked (an answer the contract refuses becomes an error answer
 * saying why, which decodes to the same failure). Parsing a guest's answer costs by its count of
 * values, not its bytes: red team 10, 1 MB of `{"0":0},{"1":0},...` in a member the host never
 * reads took the main thread 130-240 ms a review, and every other review and /healthz waited.
 * Left for the main thread: strings, and a patch whose operations and values' members number
 * fewer than PATCH_TEXT_FROM; a larger one is handed over as JSON text, in a string, for the
 * merger's thread to parse (merge/offload.ts).
 */
export function compactOutput(text: string, fn: 'validate' | 'mutate'): { output: string; compact: boolean } {
  if (text.length < COMPACT_FROM_CHARS) return { output: text, compact: false };
  let value: unknown;
  let outcome: Outcome;
  const count = { members: 0 };
  try {
    value = parseOutput(text);
    outcome = decodeValue('', value, false, count);
  } catch (error) {
    const message = error instanceof MalformedOutput ? error.message : `returned output the host could not read (${error instanceof Error ? error.message : String(error)})`;
    // It may quote the guest's text (a preview of its output, a patch path).
    return { output: JSON.stringify({ outcome: 'error', message: guestMessage(message) }), compact: true };
  }
  // Warnings as WarningList will read them, cut here: it collapses control characters and
  // keeps 256 characters of each (with the policy's name), and a megabyte of them took the main
  // thread 16 ms there (review). Enough is kept that it cuts each the same.
  const warnings = outcome.warnings.map((warning) => {
    const collapsed = warning.replace(WARNING_CONTROLS, ' ');
    return collapsed.length > MAX_WARNING_LENGTH + 1 ? collapsed.slice(0, MAX_WARNING_LENGTH) + (collapsed.slice(MAX_WARNING_LENGTH).trim() ? 'x' : '') : collapsed;
  });
  const compact = (answer: Record<string, unknown>) => ({ output: JSON.stringify({ ...answer, warnings }), compact: true });
  switch (outcome.status) {
    case 'allowed':
      // The patch a validating policy may not return is not handed over: the failure evaluate.ts would give.
      if (fn === 'validate' && outcome.patch.length > 0) return compact({ outcome: 'error', message: PATCH_FROM_VALIDATE });
      if (outcome.patch.length + count.members >= PATCH_TEXT_FROM || (Array.isArray(outcome.patch) && pathWork(outcome.patch) >= PATCH_TEXT_FROM_PATH_WORK)) return compact({ outcome: 'allow', patchText: JSON.stringify(outcome.patch), patchLength: outcome.patch.length });
      return compact({ outcome: 'allow', patch: outcome.patch });
    case 'denied':
      return compact({ outcome: 'deny', code: outcome.code, message: outcome.message });
    case 'failed':
      return compact({ outcome: 'error', kind: outcome.failure === 'crash' ? undefined : outcome.failure, message: outcome.message });
  }
}

/**
 * A long answer's patch whose operations and the members of its values number this many or more
 * stays JSON text until the merger's thread: the main thread parsed, combined and wrote out
 * such a patch at ~1.1 µs a member (red team 11: 4-8 ms a review at MAX_PATCH_MEMBERS). Below
 * it, about a millisecond at most, it is combined in place, which is quicker for the review. A
 * Pod's whole spec holds a few hundred members.
 */
export const PATCH_TEXT_FROM = 1024;
/**
 * Likewise for a patch whose paths cost much to index: combining indexes every ancestor of each
 * path (merge/patches.ts), its segments escaped again, so a path costs about its length times
 * its depth. Red team (session 48): 76 operations 64 levels deep, each key 60 slashes (574 KiB
 * of answer, 38 million of this measure), held the main thread 275-310 ms a review; about 8 ns a
 * unit. A thousand labels, `/metadata/labels/name`, are 60,000.
 */
export const PATCH_TEXT_FROM_PATH_WORK = 250_000;

/** Each path's (and from's) length times its depth, summed: see PATCH_TEXT_FROM_PATH_WORK. */
function pathWork(patch: readonly { path: string; from?: string }[]): number {
  let work = 0;
  for (const op of patch) {
    for (const pointer of op.from === undefined ? [op.path] : [op.path, op.from]) {
      let depth = 0;
      for (let at = pointer.indexOf('/'); at >= 0; at = pointer.indexOf('/', at + 1)) depth++;
      work += pointer.length * depth;
    }
  }
  return work;
}

/** What a validating policy's answer with a patch fails with. */
export const PATCH_FROM_VALIDATE = 'returned a patch from validate; only mutate may change the object';

/** `count`: where the members of the patch's values are counted. */
function decodeValue(policy: string, value: unknown, compacted = false, count = { members: 0 }): Outcome {
  if (!isObject(value)) throw new MalformedOutput('returned output that is not a JSON object');
  const warnings = decodeWarnings(value.warnings);
  switch (value.outcome) {
    case 'allow':
      return { policy, status: 'allowed', warnings, patch: compacted ? compactedPatch(value) : decodePatch(value.patch, count) };
    case 'deny': {
      const code = value.code === undefined ? 403 : value.code;
      if (typeof code !== 'number' || !Number.isInteger(code) || code < 100 || code > 599) {
        throw new MalformedOutput(`returned a denial with an invalid HTTP code ${shown(code)}`);
      }
      return { policy, status: 'denied', code, message: decodeMessage(value.message, compacted), warnings };
    }
    case 'error': {
      const kind = value.kind;
      const failure = kind === 'permanent' || kind === 'temporary' ? kind : 'crash';
      return { policy, status: 'failed', failure, message: decodeMessage(value.message, compacted), warnings };
    }
    default:
      throw new MalformedOutput(`returned an unknown outcome ${shown(value.outcome)}`);
  }
}

function decodeWarnings(value: unknown): string[] {
  if (value === undefined) return [];
  if (!Array.isArray(value)) throw new MalformedOutput('returned warnings that are not a list of strings');
  const read = value.length > MAX_WARNINGS_READ ? value.slice(0, MAX_WARNINGS_READ) : value;
  if (!read.every((w) => typeof w === 'string')) throw new MalformedOutput('returned warnings that are not a list of strings');
  return read;
}

/**
 * Longest message kept from a denial or an error: it goes into every response and log line of
 * the review, and a guest may return up to its output cap (red team: 1 MB per review).
 */
export { MAX_MESSAGE_LENGTH } from '../util/text.ts';

function decodeMessage(value: unknown, compacted: boolean): string {
  if (value === undefined) return '';
  if (typeof value !== 'string') throw new MalformedOutput('returned a message that is not a string');
  // A compacted answer's message is guestMessage's already (the worker's compactOutput): the
  // slack leaves it as it is, and shows what a path that missed it let through (review).
  return compacted ? guestMessage(value, MAX_MESSAGE_LENGTH + MESSAGE_SLACK) : guestMessage(value);
}


/**
 * Deepest value a patch may write. Kubernetes objects are far shallower; the merge walks values
 * recursively on the main thread, where 20,000 levels overflowed the stack (red team).
 */
export const MAX_PATCH_DEPTH = 64;
/** Most segments in a patch path: the merge's work per write grows with it (red team: 40,000 took 4.7 s). */
export const MAX_POINTER_SEGMENTS = 64;
/**
 * Most operations in one policy's patch: what the apiserver accepts in one JSON patch
 * (maxJSONPatchOperations). Each is read and checked here, on the main thread: red team, a
 * policy answering every Pod with 17,500 label adds (1 MB, within its output cap) took half a
 * second of it per review, and every other review waited. Not lower: the SDKs' patch helpers
 * write one operation per element they change, so the count is the reviewed object's to choose
 * (review: the numbers example failed at 1,001 list elements under a cap of 1,000). Combining
 * such patches (25 ms alone, 0.1-0.15 s beside another patching policy) happens off the main
 * thread (merge/offload.ts).
 */
export const MAX_PATCH_OPERATIONS = 10_000;
/**
 * Most members and elements the values of one policy's patch may hold in all (the maps and lists
 * it writes, at any depth; a scalar value holds none). Parsing, applying and writing out a patch
 * costs ~1.1-1.5 µs a member (red team 11: one `add` of a map of 65,496 keys cost the main
 * thread ~90 ms a review), and from PATCH_TEXT_FROM that is the merger's thread's. A Pod's whole
 * spec holds a few hundred. The operations themselves are bounded by MAX_PATCH_OPERATIONS.
 */
export const MAX_PATCH_MEMBERS = 4096;
/**
 * Warnings read from one answer: the apiserver keeps 4,096 characters of warnings in all, each
 * one here at least a dozen (the policy's name goes in front), so no more than this can reach
 * it. The rest are not even type-checked (red team: 200,000 warnings, 70-90 ms an answer).
 */
export const MAX_WARNINGS_READ = 512;

/**
 * Patches are applied to plain objects on the main thread: a `__proto__` key or path segment
 * would reach the prototype every object there shares (red team: one policy's patch made every
 * later review answer 500). No Kubernetes field can be named so (label and annotation keys
 * must start with an alphanumeric character), so such a patch is refused, not repaired.
 */
function checkPatchValue(value: unknown, where: string, count: { members: number }): void {
  const stack: [unknown, number][] = [[value, 0]];
  while (stack.length > 0) {
    const [node, depth] = stack.pop()!;
    // 1e999 parses to Infinity, which the apiserver would get as null.
    if (typeof node === 'number' && !Number.isFinite(node)) throw new MalformedOutput(`returned a patch value with a number JSON cannot carry (${where})`);
    if (typeof node !== 'object' || node === null) continue;
    if (depth >= MAX_PATCH_DEPTH) throw new MalformedOutput(`returned a patch value nested deeper than ${MAX_PATCH_DEPTH} levels (${where})`);
    if (!Array.isArray(node) && Object.hasOwn(node, '__proto__')) throw new MalformedOutput(`returned a patch value with a "__proto__" key (${where})`);
    for (const child of Object.values(node)) {
      if (++count.members > MAX_PATCH_MEMBERS) throw tooManyMembers();
      stack.push([child, depth + 1]);
    }
  }
}

function checkPointer(pointer: string): void {
  if (pointer !== '' && !pointer.startsWith('/')) throw new MalformedOutput(`returned a patch path that is not a JSON pointer: ${preview(pointer)}`);
  const segments = pointer.split('/');
  if (segments.includes('__proto__')) throw new MalformedOutput(`returned a patch path through "__proto__": ${preview(pointer)}`);
  if (segments.length - 1 > MAX_POINTER_SEGMENTS) throw new MalformedOutput(`returned a patch path of more than ${MAX_POINTER_SEGMENTS} segments: ${preview(pointer)}`);
}

/** A compact answer's patch, as compactOutput wrote it: checked already. */
function compactedPatch(value: Record<string, unknown>): SomePatch {
  if (typeof value.patchText === 'string') return { json: value.patchText, length: value.patchLength as number } satisfies PatchText;
  return (value.patch ?? []) as PatchOperation[];
}

function decodePatch(value: unknown, count: { members: number }): PatchOperation[] {
  if (value === undefined) return [];
  if (!Array.isArray(value)) throw new MalformedOutput('returned a patch that is not a list of operations');
  if (value.length > MAX_PATCH_OPERATIONS) {
    throw new MalformedOutput(`returned a patch of ${value.length.toLocaleString('en')} operations; a policy may return at most ${MAX_PATCH_OPERATIONS.toLocaleString('en')}, as the apiserver accepts in one JSON patch`);
  }
  // Each operation is rebuilt from the members RFC 6902 gives it: anything else a guest adds
  // would travel to the apiserver unchecked (red team: a member nested 100,000 levels deep made
  // the response's JSON.stringify overflow, and every /mutate review answer 500).
  return value.map((op: unknown): PatchOperation => {
    if (!isObject(op) || typeof op.op !== 'string' || !OPS.has(op.op) || typeof op.path !== 'string') {
      throw new MalformedOutput(`returned an invalid patch operation ${shown(op)}`);
    }
    checkPointer(op.path);
    if (op.op === 'move' || op.op === 'copy') {
      if (typeof op.from !== 'string') throw new MalformedOutput(`returned a ${op.op} without "from"`);
      checkPointer(op.from);
      return { op: op.op, from: op.from, path: op.path };
    }
    if (op.op === 'remove') return { op: op.op, path: op.path };
    if (!('value' in op)) throw new MalformedOutput(`returned an ${op.op} without "value"`);
    checkPatchValue(op.value, `${op.op} ${preview(op.path)}`, count);
    return { op: op.op as 'add' | 'replace' | 'test', path: op.path, value: op.value as JsonValue };
  });
}

function tooManyMembers(): MalformedOutput {
  return new MalformedOutput(`returned a patch whose values hold more than ${MAX_PATCH_MEMBERS.toLocaleString('en')} members and elements in all; a policy may return at most that many`);
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function preview(text: string): string {
  return text.length > 80 ? `${text.slice(0, 80)}…` : text;
}

/**
 * A guest's value in an error message. JSON.stringify recurses, and JSON.parse does not: an
 * answer nested 100,000 levels (200 KB, within the output cap) parsed, then overflowed the
 * stack here, and the whole review answered 500 whatever the other policies said (red team).
 */
function shown(value: unknown): string {
  try {
    return preview(JSON.stringify(value) ?? 'undefined');
  } catch (error) {
    return error instanceof RangeError ? '(a value nested too deeply to show)' : '(a value that cannot be shown)';
  }
}
