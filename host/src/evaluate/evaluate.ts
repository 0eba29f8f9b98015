// Evaluates one loaded policy against one request in the sandbox pool and returns a typed
// Outcome. Sandbox faults become failures here: caps and deadlines are temporary, traps and
// garbage are crashes. It never throws for anything a guest does.
import type { EvaluationInput, Mode, PatchOperation } from '@portcullis/sdk';
import type { LoadedPolicy } from '../policy/loaded.ts';
import type { PolicyEntry } from '../policy/policy-set.ts';
import type { CallResult, SandboxPool } from '../sandbox/pool.ts';
import type { Deferred, SharedInput } from '../sandbox/protocol.ts';
import { errorMessage } from '../errors.ts';
import { copyBytes } from '../util/bytes.ts';
import { guestMessage, MAX_MESSAGE_LENGTH, MESSAGE_SLACK } from '../util/text.ts';
import { stringifyDeep } from '../util/deep-json.ts';
import { operationsOf } from '../util/patch-text.ts';
import { decodeOutput, MalformedOutput, PATCH_FROM_VALIDATE, type Outcome } from '../sandbox/outcome.ts';

/** An outcome as the host's API gives it: its patch as operations. */
export type PublicOutcome = Outcome<PatchOperation[]>;

/**
 * `answerWithinMs`: how long the caller (the apiserver's `?timeout=`) will still wait. A call may
 * then wait for a worker only as long as it could still finish in time (at least MIN_WAIT_MS):
 * one that waited its whole deadline and then ran for it was answered long after the apiserver
 * had given up, and kept a worker busy for nobody (red team: 17.6 s for a 10 s webhook).
 * `judged`: the caller asked the pool's refusals() for this review in the same turn (see SandboxPool.call).
 */
export async function evaluatePolicy(
  pool: SandboxPool, policy: LoadedPolicy, mode: Mode, input: EvaluationInput | string, answerWithinMs?: number, judged = false,
): Promise<PublicOutcome> {
  const outcome = await evaluateCall(pool, policy, mode, input, answerWithinMs, judged);
  return outcome.status === 'allowed' && !Array.isArray(outcome.patch) ? { ...outcome, patch: operationsOf(outcome.patch) } : outcome as PublicOutcome;
}

/** As evaluatePolicy, where a large patch may stay text until the merger's thread (sandbox/outcome.ts PATCH_TEXT_FROM). */
async function evaluateCall(
  pool: SandboxPool, policy: LoadedPolicy, mode: Mode, input: EvaluationInput | string, answerWithinMs?: number, judged = false,
): Promise<Outcome> {
  const payload = typeof input === 'string' ? input : sharedInput(input, policy);
  const { timeoutMs } = policy.limits;
  const waitMs = answerWithinMs === undefined ? timeoutMs : Math.max(Math.min(timeoutMs, MIN_WAIT_MS), answerWithinMs - timeoutMs);
  const result = await pool.call(policy.key, mode, payload, timeoutMs, waitMs, judged);
  const outcome = toOutcome(policy.name, result);
  // The SDKs patch only from mutate. A validating webhook's answer must not carry a patch, and
  // merging one would run patch code for a validation (red team).
  if (mode === 'validate' && outcome.status === 'allowed' && outcome.patch.length > 0) {
    return { policy: policy.name, status: 'failed', failure: 'crash', message: PATCH_FROM_VALIDATE, warnings: outcome.warnings, ...timingOf(outcome) };
  }
  return outcome;
}

/** However little time is left, a call may wait this long for a worker (a free one takes it at once). */
const MIN_WAIT_MS = 100;

function timingOf(outcome: Outcome): Pick<Outcome, 'guestMicros' | 'totalMicros' | 'logs'> {
  return {
    ...(outcome.guestMicros !== undefined ? { guestMicros: outcome.guestMicros } : {}),
    ...(outcome.totalMicros !== undefined ? { totalMicros: outcome.totalMicros } : {}),
    ...(outcome.logs ? { logs: outcome.logs } : {}),
  };
}

// A review evaluated by ten policies is serialized and encoded once: the envelope without
// settings goes into shared memory, cached per input object; each policy's settings are
// serialized once per policy and travel beside it.
//
// What a review's input carries for its calls (its envelope, and where values lie for the
// policies that take them apart) is kept on the input itself, in non-enumerable symbol-keyed
// fields, not in WeakMaps keyed by it: a long-lived WeakMap's entries kept each review's
// values alive through scavenges until a full collection. Serve with one TypeScript policy
// that takes values apart, 16 connections (`--trace-gc`): 580-860 bytes promoted per request
// and 5-18 ms scavenges with the WeakMaps, 56-83 bytes and 1.0-1.2 ms with these fields.
const ENVELOPE = Symbol('envelope');
const DEFERRED = Symbol('deferred');
type Deferreds = { nested: readonly Deferred[]; flat: readonly Deferred[] } | (() => readonly Deferred[]);
type Carrying = EvaluationInput & { [ENVELOPE]?: Uint8Array; [DEFERRED]?: Deferreds };
function carry<K extends typeof ENVELOPE | typeof DEFERRED>(input: EvaluationInput, key: K, value: Carrying[K]): void {
  Object.defineProperty(input, key, { value, writable: true, configurable: true });
}

/** Bytes [start, end) of a body. */
interface Span { start: number; end: number }
/** Where the body's scan found the request's object and oldObject (review/scan.ts). */
interface ObjectsFound {
  object?: Span | undefined;
  oldObject?: Span | undefined;
  /** The object's (oldObject's) members, when the scan noted them; listed only when asked (review/scan.ts). */
  listMembers?: ((which: 'object' | 'oldObject') => Member[] | undefined) | undefined;
}
interface Member { key: Span; value: Span; inner?: Member[] | undefined }
const settingsJson = new WeakMap<LoadedPolicy, string>();
const encoder = new TextEncoder();

/**
 * The review's envelope in shared memory, if its policies were given one: JSON text of an object
 * whose `request` is the review's request. The patch merger reads the object from it (offload.ts).
 */
export function envelopeOf(input: EvaluationInput): Uint8Array | undefined {
  return (input as Carrying)[ENVELOPE];
}

export function sharedInput(input: EvaluationInput, policy: LoadedPolicy): SharedInput {
  let envelope = (input as Carrying)[ENVELOPE];
  if (envelope === undefined) {
    // Encoded straight into shared memory: no second copy (Buffer.byteLength counts what encodeInto writes).
    const text = serialized(input);
    envelope = new Uint8Array(new SharedArrayBuffer(Buffer.byteLength(text)));
    encoder.encodeInto(text, envelope);
    carry(input, ENVELOPE, envelope);
  }
  let settings = settingsJson.get(policy);
  if (settings === undefined) {
    settings = JSON.stringify(policy.settings ?? {});
    settingsJson.set(policy, settings);
  }
  const apart = policy.objectsApart ? deferredOf(input, policy.nestedApart === true) : undefined;
  return apart ? { envelope, settings, apart } : { envelope, settings };
}

/** Worked out for the first policy of the review that reads values apart, then kept (with and without values nested). */
function deferredOf(input: EvaluationInput, nested: boolean): readonly Deferred[] | undefined {
  let found = (input as Carrying)[DEFERRED];
  if (typeof found === 'function') {
    const all = found();
    // Without nested-apart: no value inside another (an object's member is at request.object.key).
    found = { nested: all, flat: all.filter(([, , path]) => path.length <= 3) };
    carry(input, DEFERRED, found);
  }
  const apart = found?.[nested ? 'nested' : 'flat'];
  return apart !== undefined && apart.length > 0 ? apart : undefined;
}

/**
 * The envelope as JSON text. A request nested deeper than JSON.stringify can recurse (about 5,000
 * levels; Go's decoder allows 10,000) is written without recursion: the host re-serializes only
 * requests whose bytes it cannot pass on, and a 400 for those alone denied a valid object for how
 * one key was spelled (red team: an annotation key with `<`, which the apiserver escapes).
 */
function serialized(input: EvaluationInput): string {
  const envelope = { ...input, settings: undefined };
  try {
    return JSON.stringify(envelope);
  } catch (error) {
    if (!(error instanceof RangeError)) throw error;
    return stringifyDeep(envelope);
  }
}

/**
 * Issue 14: the envelope made from the request body's own bytes. Only the small per-review
 * fields are serialized; `request` is the body's span, copied once into shared memory, so the
 * main thread never re-serializes the review. `input.request` must be what that span parses to.
 */
export function rawEnvelope(input: EvaluationInput, body: Uint8Array, span: Span, objects: ObjectsFound = {}): void {
  const head = JSON.stringify({ headers: input.headers, sslpeer: input.sslpeer, dryRun: input.dryRun, webhook: input.webhook });
  // `{...fields,"request":` + span + `}`
  const prefix = `${head.slice(0, -1)},"request":`;
  const prefixBytes = Buffer.byteLength(prefix);
  const length = span.end - span.start;
  const envelope = new Uint8Array(new SharedArrayBuffer(prefixBytes + length + 1));
  encoder.encodeInto(prefix, envelope);
  copyBytes(body.subarray(span.start, span.end), envelope, prefixBytes);
  envelope[prefixBytes + length] = 0x7d; // }
  carry(input, ENVELOPE, envelope);
  // Where object and oldObject lie in the envelope, worked out when a policy first asks (deferredOf).
  if (objects.object || objects.oldObject) carry(input, DEFERRED, () => deferredValues(body, objects, prefixBytes - span.start));
}

/**
 * Values of the request a guest may parse only when it reads them (SharedInput.apart), their
 * offsets moved by `shift` into the envelope, an outer value before those inside it: each map or
 * list of DEFER_FROM_BYTES or more among the members of the object and oldObject, and among the
 * members of such a map (a Pod's containers inside its spec), so that a policy reading
 * spec.nodeName parses the spec without its containers. Where the scan could not list an
 * object's members, or a key is named twice there (JSON.parse keeps the last), the whole object
 * goes apart; a map whose members are too many or named twice goes apart without values inside.
 */
function deferredValues(body: Uint8Array, found: ObjectsFound, shift: number): Deferred[] {
  const apart: Deferred[] = [];
  const defer = (value: Span, path: readonly string[]) => apart.push([value.start + shift, value.end + shift, path]);
  // { or [: a scalar costs nothing to parse
  const large = (value: Span) => value.end - value.start >= DEFER_FROM_BYTES && (body[value.start] === 0x7b || body[value.start] === 0x5b);
  for (const [span, which] of [[found.object, 'object'], [found.oldObject, 'oldObject']] as const) {
    if (!span) continue;
    const members = found.listMembers?.(which);
    const names = namesOnce(body, members);
    if (!members || !names) {
      if (large(span)) defer(span, ['request', which]);
      continue;
    }
    members.forEach(({ value, inner }, i) => {
      if (!large(value)) return;
      const path = ['request', which, names[i]!];
      defer(value, path);
      if (!inner?.some((member) => large(member.value))) return;
      const innerNames = namesOnce(body, inner);
      if (innerNames) inner.forEach((member, j) => { if (large(member.value)) defer(member.value, [...path, innerNames[j]!]); });
    });
  }
  return apart;
}

/** The members' keys when each is named once, else undefined. The scan takes no key written with an escape: its bytes are the key. */
function namesOnce(body: Uint8Array, members: Member[] | undefined): string[] | undefined {
  if (!members) return undefined;
  const bytes = Buffer.from(body.buffer, body.byteOffset, body.byteLength);
  const names = members.map(({ key }) => bytes.toString('utf8', key.start, key.end));
  return new Set(names).size === names.length ? names : undefined;
}

/**
 * Smaller maps and lists cost a guest less to parse with the rest than apart: in QuickJS a value
 * apart costs about as much as parsing 300 bytes (its getter, its place in the header), whether
 * the policy reads it or not.
 */
export const DEFER_FROM_BYTES = 512;

export function toOutcome(policy: string, result: CallResult): Outcome {
  // A refused call has no totalMicros: it never ran.
  const timing = {
    ...(result.totalMicros !== undefined ? { totalMicros: result.totalMicros } : {}), ...(result.ok ? { guestMicros: result.guestMicros } : {}),
    ...(result.logs.length > 0 ? { logs: result.logs } : {}),
  };
  if (!result.ok) {
    const temporary = result.fault === 'deadline' || result.fault === 'memory' || result.fault === 'output' || result.fault === 'unloaded';
    const failure = temporary ? 'temporary' : 'crash';
    // The worker cuts it already (guestMessage: the slack keeps its note); the inline lane's and
    // the pool's are cut here. A fault message must never carry a guest's megabytes (red team).
    return { policy, status: 'failed', failure, message: guestMessage(result.message, MAX_MESSAGE_LENGTH + MESSAGE_SLACK), warnings: [], ...timing };
  }
  try {
    return { ...decodeOutput(policy, result.output, result.compact), ...timing };
  } catch (error) {
    // Whatever reading a guest's answer throws is that policy's crash, never the review's: a
    // check that overflowed on a crafted answer once made every review answer 500 (red team).
    const message = error instanceof MalformedOutput ? error.message : `returned output the host could not read (${errorMessage(error)})`;
    return { policy, status: 'failed', failure: 'crash', message: guestMessage(message), warnings: [], ...timing };
  }
}

/** A configured policy: evaluated if it loaded; one that did not still answers, as a permanent failure. */
export function evaluateEntry(
  pool: SandboxPool, entry: PolicyEntry, mode: Mode, input: EvaluationInput, answerWithinMs?: number, judged = false,
): Promise<Outcome> {
  if (!entry.loaded) {
    // A policy that failed to load still answers, per its failure policy: failing closed is
    // the default, so a broken module never silently stops guarding the cluster.
    // The answer is prefixed with the policy's name, which the load error's message already starts with.
    const text = entry.error?.message ?? 'unknown reason';
    const own = `policy "${entry.config.name}" `;
    const message = text.startsWith(own) ? text.slice(own.length) : `is not loaded: ${text}`;
    return Promise.resolve({ policy: entry.config.name, status: 'failed', failure: 'permanent', message, warnings: [] });
  }
  return evaluateCall(pool, entry.loaded, mode, input, answerWithinMs, judged);
}
