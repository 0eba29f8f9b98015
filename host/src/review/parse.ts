// The edge: turns an untrusted request body into a typed AdmissionReview, or a ReviewError
// that says exactly what is wrong. Nothing past this point re-checks the shape.
import type { AdmissionRequest, JsonObject, Operation } from '@portcullis/sdk';
import { ReviewError } from '../errors.ts';
import { MAX_BODY_DEPTH, type ReviewScan, type Span } from './scan.ts';
import { memberOf, nestedDeeperThan, parsedCostOf } from '../util/json-bytes.ts';

export { nestedDeeperThan, parsedCostOf } from '../util/json-bytes.ts';

export { MAX_BODY_DEPTH };

export type ReviewVersion = 'admission.k8s.io/v1' | 'admission.k8s.io/v1beta1';

export interface AdmissionReview {
  apiVersion: ReviewVersion;
  request: AdmissionRequest;
  /** The request differs from the body's (a missing userInfo became {}): its bytes cannot stand in for it. */
  normalized?: true;
}

const MAX_UID_LENGTH = 256;
const VERSIONS = new Set<string>(['admission.k8s.io/v1', 'admission.k8s.io/v1beta1']);
const OPERATIONS = new Set<string>(['CREATE', 'UPDATE', 'DELETE', 'CONNECT']);

const TOO_DEEP = `the body nests objects or arrays more than ${MAX_BODY_DEPTH} levels deep; the API server sends nothing that deep`;

/** Smaller bodies cannot nest deep enough to cost much: 32,768 levels parse to about 2 MB. */
const DEPTH_CHECK_FROM = 64 * 1024;

export function parseReviewText(body: string | Uint8Array): AdmissionReview {
  // Checked before JSON.parse: a 2.8 MB body of 1.4 million nested arrays took 260 ms of the
  // main thread and 150 MB to parse, and a dozen at once took the host past 1 GiB (red team).
  if (body.length >= DEPTH_CHECK_FROM && nestedDeeperThan(typeof body === 'string' ? Buffer.from(body) : body, MAX_BODY_DEPTH)) {
    throw new ReviewError(TOO_DEEP);
  }
  return parseWhole(body);
}

/** JSON.parse of the whole body, then the review's shape; its depth was checked already. */
function parseWhole(body: string | Uint8Array): AdmissionReview {
  const text = typeof body === 'string' ? body : Buffer.from(body.buffer, body.byteOffset, body.length).toString('utf8');
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (error) {
    throw new ReviewError(`the body is not JSON: ${(error as Error).message}`);
  }
  return parseReview(value);
}

/**
 * Invalid bodies under this size are parsed whole, so that JSON.parse says what is wrong in its
 * own words; larger ones are refused with where the scan stopped: a 2.9 MB body of tiny
 * containers with one wrong byte at its end took 110-270 ms and 110 MB to parse (red team).
 */
export const PARSED_WHOLE_BELOW = 64 * 1024;

/**
 * The review from a body scanReview has walked. The request's object and oldObject are parsed
 * when first read (a getter on the request): the main thread reads them only to merge patches
 * or match labels, and they are most of a review's bytes. The scan checked their grammar, so
 * reading them cannot fail; a body the scan found no such spans in is parsed whole.
 */
export function parseScannedReview(bytes: Buffer, scan: ReviewScan): AdmissionReview {
  if (scan.tooDeep) throw new ReviewError(TOO_DEEP);
  if (!scan.valid && bytes.length >= PARSED_WHOLE_BELOW) throw new ReviewError(notJson(bytes, scan.stoppedAt ?? 0));
  const spans = [scan.object, scan.oldObject].filter((span) => span !== undefined).sort((a, b) => a.start - b.start);
  if (!scan.valid) return parseWhole(bytes);
  if (spans.length === 0) {
    if (scan.parsedCost > MAX_PARSED_OUTSIDE_OBJECTS) throw new ReviewError(tooManyValues(scan.parsedCost));
    return parseWhole(bytes);
  }
  // The body with each lazily read value replaced by null: the spans lie on ASCII bytes.
  let text = '';
  let from = 0;
  let outside = 0;
  for (const span of spans) {
    text += `${bytes.toString('utf8', from, span.start)}null`;
    outside += span.start - from;
    from = span.end;
  }
  text += bytes.toString('utf8', from);
  outside += bytes.length - from;
  if (outside >= PARSED_WHOLE_BELOW) {
    // Between the spans lie whole values, so each stretch is read as JSON tokens.
    let cost = parsedCostOf(bytes.subarray(from));
    let at = 0;
    for (const span of spans) {
      cost += parsedCostOf(bytes.subarray(at, span.start));
      at = span.end;
    }
    if (cost > MAX_PARSED_OUTSIDE_OBJECTS) throw new ReviewError(tooManyValues(cost));
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    return parseWhole(bytes); // Never expected (the scan checked the grammar); the whole parse then decides.
  }
  const review = parseReview(value);
  readLater(review.request, bytes, scan.object, scan.oldObject);
  return review;
}

/**
 * The most the request may hold outside its object and oldObject, as parsedCostOf counts it
 * (about 10,000 maps, or 65,000 list elements), which the main thread parses on arrival: an
 * API server's review holds a few hundred values there (its user's groups are the most).
 * Parsing costs by values, and most for maps with keys of their own: red team (session 48), a
 * review of 1-2 MiB with `{"k0":0},{"k1":0},…` in a member the host never reads held the main
 * thread 100-430 ms; at this bound it takes about 8 ms.
 */
export const MAX_PARSED_OUTSIDE_OBJECTS = 2 ** 20;

function tooManyValues(cost: number): string {
  return `the request holds too many JSON values outside its object and oldObject (about ${(cost / 2 ** 20).toFixed(1)} MiB once parsed, `
    + `over the ${MAX_PARSED_OUTSIDE_OBJECTS / 2 ** 20} MiB this host takes); the API server sends no such review`;
}

function notJson(bytes: Buffer, at: number): string {
  if (at >= bytes.length) return `the body is not JSON: it ends at byte ${bytes.length} before its value does`;
  const near = JSON.stringify(bytes.toString('utf8', at, Math.min(bytes.length, at + 24)));
  return `the body is not JSON: what starts at byte ${at} is not valid there (${near}…)`;
}

/** Whether the request has an object, without parsing one that is read when first needed. */
export function hasObject(request: AdmissionRequest): boolean {
  return hasValue(request, 'object');
}

/** Whether the request has an object (`object`) or an old object, without parsing one still unread. */
export function hasValue(request: AdmissionRequest, which: 'object' | 'oldObject'): boolean {
  // Still unread: scanReview found one there (a getter stands only for `{...}`).
  if (Object.getOwnPropertyDescriptor(request, which)?.get) return true;
  return request[which] !== null && request[which] !== undefined;
}

/**
 * Whether the object (`which`) has metadata that is a map, and its labels when they are a map,
 * as read from the parsed object. An object still unread is not parsed for them: its labels are
 * found in its bytes and only they are parsed. Selecting by labels read the whole object on the
 * main thread, and a body sent straight to the webhook may hold a megabyte of tiny maps in it
 * (red team, session 48: such parses held the main thread hundreds of ms).
 */
export function labelsIn(request: AdmissionRequest, which: 'object' | 'oldObject'): { metadata: boolean; labels: JsonObject | undefined } {
  const unread = (request as WithUnread)[UNREAD];
  const span = unread?.[which];
  if (unread && span && Object.getOwnPropertyDescriptor(request, which)?.get) {
    const metadata = memberOf(unread.bytes, span, 'metadata');
    if (!metadata || unread.bytes[metadata.start] !== 0x7b) return { metadata: false, labels: undefined };
    const labels = memberOf(unread.bytes, metadata, 'labels');
    if (!labels || unread.bytes[labels.start] !== 0x7b) return { metadata: true, labels: undefined };
    return { metadata: true, labels: JSON.parse(unread.bytes.toString('utf8', labels.start, labels.end)) as JsonObject };
  }
  const object = request[which];
  const metadata = isObject(object) ? object.metadata : undefined;
  if (!isObject(metadata)) return { metadata: false, labels: undefined };
  return { metadata: true, labels: isObject(metadata.labels) ? metadata.labels : undefined };
}

/** Where a request's unread object and oldObject lie in its body (readLater). */
interface Unread {
  bytes: Buffer;
  object?: Span;
  oldObject?: Span;
}
const UNREAD = Symbol('unread');
type WithUnread = AdmissionRequest & { [UNREAD]?: Unread };

/**
 * Shared accessors, one pair per field, not closures made per request: a getter made per
 * request kept its request (and the body) alive through every scavenge until a full collection,
 * most likely from the hidden classes it made, which live in the old generation. Promoted per
 * request, measured up to the parse: 2.2 KB with such getters, 38 bytes with these
 * (`--trace-gc`, serve with one AS policy, the bench review, 16 connections).
 */
const accessors = {
  object: accessorOf('object'),
  oldObject: accessorOf('oldObject'),
};

function accessorOf(field: 'object' | 'oldObject'): PropertyDescriptor {
  const settle = (request: AdmissionRequest, value: JsonObject | null | undefined) => {
    Object.defineProperty(request, field, { value, writable: true, enumerable: true, configurable: true });
  };
  return {
    enumerable: true,
    configurable: true,
    get(this: WithUnread) {
      const unread = this[UNREAD]!;
      const span = unread[field]!;
      const value = JSON.parse(unread.bytes.toString('utf8', span.start, span.end)) as JsonObject;
      settle(this, value);
      return value;
    },
    set(this: AdmissionRequest, value: JsonObject | null | undefined) {
      settle(this, value);
    },
  };
}

function readLater(request: AdmissionRequest, bytes: Buffer, object: Span | undefined, oldObject: Span | undefined): void {
  Object.defineProperty(request, UNREAD, { value: { bytes, object, oldObject } satisfies Unread });
  if (object) Object.defineProperty(request, 'object', accessors.object);
  if (oldObject) Object.defineProperty(request, 'oldObject', accessors.oldObject);
}

export function parseReview(value: unknown): AdmissionReview {
  if (!isObject(value)) throw new ReviewError('the body is not a JSON object, so not an AdmissionReview');
  if (value.kind !== 'AdmissionReview') throw new ReviewError(`expected kind "AdmissionReview", got ${describe(value.kind)}`);
  if (typeof value.apiVersion !== 'string' || !VERSIONS.has(value.apiVersion)) {
    throw new ReviewError(value.apiVersion === undefined
      ? 'the AdmissionReview has no apiVersion; expected admission.k8s.io/v1 or admission.k8s.io/v1beta1'
      : `unsupported apiVersion ${describe(value.apiVersion)}; expected admission.k8s.io/v1 or admission.k8s.io/v1beta1`);
  }
  const request = value.request;
  if (!isObject(request)) throw new ReviewError('the AdmissionReview has no "request" object');
  if (typeof request.uid !== 'string' || request.uid === '') throw new ReviewError('request.uid is missing or not a non-empty string');
  // Echoed in every error about the request, its answer and the log's lines (red team: a 4 MiB
  // uid made each refused request's log line and answer 4 MiB). The API server's is a UUID.
  if (request.uid.length > MAX_UID_LENGTH) throw new ReviewError(`request.uid is ${request.uid.length} characters long; the API server's are 36 and this host takes at most ${MAX_UID_LENGTH}`);
  const uid = request.uid;
  const fail = (field: string, expected: string): never => {
    throw new ReviewError(`request ${uid}: request.${field} ${expected}`);
  };
  if (!isGvk(request.kind, 'kind')) fail('kind', 'must be {group, version, kind} strings');
  if (!isGvk(request.resource, 'resource')) fail('resource', 'must be {group, version, resource} strings');
  if (typeof request.operation !== 'string' || !OPERATIONS.has(request.operation)) fail('operation', 'must be CREATE, UPDATE, DELETE or CONNECT');
  for (const field of ['name', 'namespace', 'subResource'] as const) {
    if (request[field] !== undefined && typeof request[field] !== 'string') fail(field, 'must be a string');
  }
  for (const field of ['object', 'oldObject', 'options'] as const) {
    if (request[field] !== undefined && request[field] !== null && !isObject(request[field])) fail(field, 'must be an object or null');
  }
  if (request.userInfo !== undefined && !isObject(request.userInfo)) fail('userInfo', 'must be an object');
  if (request.dryRun !== undefined && typeof request.dryRun !== 'boolean') fail('dryRun', 'must be a boolean');
  const typed = { ...request, userInfo: request.userInfo ?? {} } as unknown as AdmissionRequest;
  typed.operation = request.operation as Operation;
  return { apiVersion: value.apiVersion as ReviewVersion, request: typed, ...(request.userInfo === undefined ? { normalized: true as const } : {}) };
}

function isGvk(value: unknown, last: 'kind' | 'resource'): boolean {
  return isObject(value) && typeof value.group === 'string' && typeof value.version === 'string' && typeof value[last] === 'string';
}

function isObject(value: unknown): value is JsonObject {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function describe(value: unknown): string {
  const text = value === undefined ? 'nothing' : JSON.stringify(value);
  return text.length > 60 ? `${text.slice(0, 60)}…` : text;
}

