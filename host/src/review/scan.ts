// One strict walk over a request body's bytes, before anything parses it. It says whether the
// bytes are JSON (by the grammar JSON.parse applies), how deep they nest, what parsing them
// would cost the heap, and where the request and its object and oldObject lie.
//
// Why (issue 14): the main thread parsed every review whole, though it reads only the small
// fields (uid, kind, operation, namespace, userInfo) unless a policy patched or a selector
// looks at labels. The object is most of a review's bytes; parse.ts parses the rest now and
// the object only when something reads it. Because the walk checks the whole grammar, a body
// with a broken object is still refused at the edge, as when it was parsed whole.
//
// The walk reads bytes, not a string: over a string made by Buffer.toString a loop like this
// fell, at random after a few dozen large bodies, into ~6 µs a character (red team). UTF-8
// never puts a byte below 0x80 inside a multi-byte character, so bytes say what characters do.
import { isUtf8 } from 'node:buffer';
import { PARSED_CONTAINER_BYTES, PARSED_ELEMENT_BYTES } from '../util/json-bytes.ts';

/**
 * The API server decodes no object nested deeper than 10,000 levels (Go's encoding/json), so a
 * review it sends is at most a few levels more: the review, its request, the object.
 */
export const MAX_BODY_DEPTH = 10_010;


export interface Span {
  start: number;
  end: number;
}

export interface ReviewScan {
  /** One JSON value and nothing else, by JSON.parse's grammar. When false, the rest is unset but stoppedAt. */
  valid: boolean;
  /** Where the walk found the bytes not to be JSON (or too deep): the start of the token at fault. */
  stoppedAt?: number;
  /** Nested deeper than MAX_BODY_DEPTH (the walk stopped there; `valid` is false). */
  tooDeep: boolean;
  /** About what JSON.parse would add to the heap beyond the bytes: containers and elements (parsedCostOf). */
  parsedCost: number;
  /**
   * The top-level `request` value: set when the body is an object whose keys are written
   * without escapes and name `request` once.
   */
  request?: Span;
  /** No key anywhere inside the request is written with an escape (so every parser reads the same keys). */
  plainKeys: boolean;
  /** The request's `object` and `oldObject` when they are objects, named once, and plainKeys holds. */
  object?: Span;
  oldObject?: Span;
  /**
   * Lists the members of `object` (`oldObject`): key (without its quotes) and value, in order, a
   * key named twice listed twice; undefined when it has more than MAX_MEMBERS or was not found.
   * For guests that parse large members only when read. The walk's notes are kept as numbers and
   * made into lists only when asked: built as objects on every review, they were the main
   * thread's largest allocation after parsing (about 4 KB of a Pod review), and only a policy
   * input taken apart reads them (evaluate.ts).
   */
  listMembers?: (which: 'object' | 'oldObject') => Member[] | undefined;
}

/** Whether object (oldObject) has at most MAX_MEMBERS, so that its members are listed. */
interface Listable {
  object: boolean;
  oldObject: boolean;
}

export interface Member {
  key: Span;
  value: Span;
  /**
   * When the value is a map of at most MAX_MEMBERS: its own members, likewise (without `inner`).
   * Noted by the same walk, so that evaluate.ts can take a Pod's containers apart from its spec.
   */
  inner?: Member[];
}

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const COMMA = 0x2c;
const COLON = 0x3a;
const OPEN_BRACE = 0x7b;
const CLOSE_BRACE = 0x7d;
const OPEN_BRACKET = 0x5b;
const CLOSE_BRACKET = 0x5d;

const IN_OBJECT = 1;
const IN_ARRAY = 2;
/** What each open container is, by depth. One walk runs at a time (it is synchronous). */
const stack = new Uint8Array(MAX_BODY_DEPTH + 2);
/** The tracked value each open container is, by depth (NONE for most). */
const tags = new Uint8Array(MAX_BODY_DEPTH + 2);

// Which tracked value the next value is.
const NONE = 0;
const REQUEST = 1;
const OBJECT = 2;
const OLD_OBJECT = 3;
/** A member of the object or oldObject. */
const MEMBER = 4;
/** A member of a map that is a member of the object or oldObject. */
const INNER = 5;

/** The members of object and oldObject as the walk meets them: which (OBJECT or OLD_OBJECT), key start and end, value start and end. */
const members: number[] = [];
/**
 * Members noted per object at most. Kubernetes objects have a handful at the top (apiVersion,
 * kind, metadata, spec, status); one with more is taken apart whole. Red team: 400,000 members
 * each noted (and checked for duplicates) made the scan cost three times a whole parse.
 */
export const MAX_MEMBERS = 64;
/** Members seen so far of the object and of the oldObject (by OBJECT, OLD_OBJECT). */
const memberCounts = new Uint32Array(4);
/**
 * The members of maps among those members: the index in `members` of the member they are in,
 * key start and end, value start and end. At most MAX_MEMBERS each; a map with more is in
 * `crowded`. Fixed size, written in place: pushing the most a body can make (two objects of 64
 * maps of 64 members) onto an array made its scan three times as slow (red team).
 */
const inner = new Uint32Array(2 * MAX_MEMBERS * MAX_MEMBERS * 5);
let innerLength = 0;
const crowded: number[] = [];
/** Walks so far: the notes above are the last walk's. */
let walks = 0;

function invalid(at: number, tooDeep = false): ReviewScan {
  return { valid: false, stoppedAt: at, tooDeep, parsedCost: 0, plainKeys: false };
}

/** Set by stringEnd: the string it walked holds an escape. */
let escaped = false;

export function scanReview(bytes: Uint8Array): ReviewScan {
  walks++;
  const length = bytes.length;
  let depth = 0;
  let containers = 0;
  let elements = 0;
  let at = skipSpace(bytes, 0);
  let expectKey = false;
  // The tracked value (REQUEST, OBJECT, OLD_OBJECT) that starts at `at`, or that just ended.
  let pending = NONE;
  // Top level: a key with an escape, or `request` twice, hides which value is the request.
  let topPlain = true;
  let requests = 0;
  let requestStart = -1;
  let requestEnd = -1;
  let plainKeys = true;
  let objects = 0;
  let objectStart = -1;
  let objectEnd = -1;
  let oldObjects = 0;
  let oldStart = -1;
  let oldEnd = -1;
  members.length = 0;
  memberCounts.fill(0);
  innerLength = 0;
  crowded.length = 0;
  let innerCount = 0;
  for (;;) {
    if (expectKey) {
      // At a key's opening quote, in an object at `depth`.
      if (byteAt(bytes, at) !== QUOTE) return invalid(at);
      const keyStart = at + 1;
      const keyEnd = stringEnd(bytes, keyStart);
      if (keyEnd < 0) return invalid(at);
      if (depth === 1) {
        if (escaped) topPlain = false;
        else if (isKey(bytes, keyStart, keyEnd, 'request')) {
          requests++;
          pending = REQUEST;
        }
      } else if (requestStart >= 0 && requestEnd < 0) {
        if (escaped) plainKeys = false;
        else if (depth === 2) {
          if (isKey(bytes, keyStart, keyEnd, 'object')) {
            objects++;
            pending = OBJECT;
          } else if (isKey(bytes, keyStart, keyEnd, 'oldObject')) {
            oldObjects++;
            pending = OLD_OBJECT;
          }
        } else if (depth === 3) {
          const which = tags[3]!;
          if ((which === OBJECT || which === OLD_OBJECT) && ++memberCounts[which]! <= MAX_MEMBERS) {
            members.push(which, keyStart, keyEnd);
            pending = MEMBER;
          }
        } else if (depth === 4 && tags[4] === MEMBER) {
          // In a map that is a noted member: it has pushed which, key start and end, value start.
          const member = members.length - 4;
          if (++innerCount <= MAX_MEMBERS) {
            inner[innerLength] = member;
            inner[innerLength + 1] = keyStart;
            inner[innerLength + 2] = keyEnd;
            innerLength += 3;
            pending = INNER;
          } else if (innerCount === MAX_MEMBERS + 1) crowded.push(member);
        }
      }
      at = skipSpace(bytes, keyEnd + 1);
      if (byteAt(bytes, at) !== COLON) return invalid(at);
      at = skipSpace(bytes, at + 1);
      expectKey = false;
    }
    // At a value.
    if (at >= length) return invalid(at);
    const code = bytes[at]!;
    if (pending === REQUEST) requestStart = at;
    else if (pending === OBJECT) objectStart = code === OPEN_BRACE ? at : -1;
    else if (pending === OLD_OBJECT) oldStart = code === OPEN_BRACE ? at : -1;
    else if (pending === MEMBER) {
      members.push(at);
      innerCount = 0;
    } else if (pending === INNER) inner[innerLength++] = at;
    if (code === OPEN_BRACE || code === OPEN_BRACKET) {
      if (++depth > MAX_BODY_DEPTH) return invalid(at, true);
      containers++;
      tags[depth] = pending;
      pending = NONE;
      stack[depth] = code === OPEN_BRACE ? IN_OBJECT : IN_ARRAY;
      at = skipSpace(bytes, at + 1);
      if (byteAt(bytes, at) !== (code === OPEN_BRACE ? CLOSE_BRACE : CLOSE_BRACKET)) {
        expectKey = code === OPEN_BRACE;
        continue;
      }
      at++;
      pending = tags[depth]!;
      depth--;
    } else {
      const start = at;
      if (code === QUOTE) at = stringEnd(bytes, at + 1) + 1;
      else if (code === 0x74) at = literalEnd(bytes, at, 'true');
      else if (code === 0x66) at = literalEnd(bytes, at, 'false');
      else if (code === 0x6e) at = literalEnd(bytes, at, 'null');
      else at = numberEnd(bytes, at);
      if (at <= 0) return invalid(start);
    }
    // Just past a value at `depth`: note where a tracked one ended, then close what closes here.
    for (;;) {
      if (pending !== NONE) {
        if (pending === REQUEST) requestEnd = at;
        else if (pending === OBJECT) objectEnd = at;
        else if (pending === OLD_OBJECT) oldEnd = at;
        else if (pending === MEMBER) members.push(at);
        else inner[innerLength++] = at;
        pending = NONE;
      }
      if (depth === 0) {
        if (skipSpace(bytes, at) !== length) return invalid(skipSpace(bytes, at));
        const parsedCost = containers * PARSED_CONTAINER_BYTES + elements * PARSED_ELEMENT_BYTES;
        return finish(bytes, {
          parsedCost, topPlain, requests, requestStart, requestEnd, plainKeys, objects, objectStart, objectEnd, oldObjects, oldStart, oldEnd,
        });
      }
      at = skipSpace(bytes, at);
      const next = byteAt(bytes, at);
      if (next === COMMA) {
        elements++;
        at = skipSpace(bytes, at + 1);
        expectKey = stack[depth] === IN_OBJECT;
        break;
      }
      if (next !== (stack[depth] === IN_OBJECT ? CLOSE_BRACE : CLOSE_BRACKET)) return invalid(at);
      at++;
      pending = tags[depth]!;
      depth--;
    }
  }
}

interface Found {
  parsedCost: number;
  topPlain: boolean;
  requests: number;
  requestStart: number;
  requestEnd: number;
  plainKeys: boolean;
  objects: number;
  objectStart: number;
  objectEnd: number;
  oldObjects: number;
  oldStart: number;
  oldEnd: number;
}

function finish(bytes: Uint8Array, found: Found): ReviewScan {
  const scan: ReviewScan = { valid: true, tooDeep: false, parsedCost: found.parsedCost, plainKeys: found.plainKeys };
  const { requestStart, requestEnd } = found;
  if (!found.topPlain || found.requests !== 1 || requestStart < 0 || bytes[requestStart] !== OPEN_BRACE) return { ...scan, plainKeys: false };
  scan.request = { start: requestStart, end: requestEnd };
  if (!found.plainKeys) return scan;
  const hasObject = found.objects === 1 && found.objectStart >= 0;
  const hasOld = found.oldObjects === 1 && found.oldStart >= 0;
  if (hasObject) scan.object = { start: found.objectStart, end: found.objectEnd };
  if (hasOld) scan.oldObject = { start: found.oldStart, end: found.oldEnd };
  if (hasObject || hasOld) {
    const walk = walks;
    const listable: Listable = { object: hasObject && memberCounts[OBJECT]! <= MAX_MEMBERS, oldObject: hasOld && memberCounts[OLD_OBJECT]! <= MAX_MEMBERS };
    // The walk's own arrays serve the next body: read in place while they are this body's (a
    // review lists members in the same turn as its walk), else walked again. Copied on every
    // walk instead, they cost 1.7 µs of each review (profile), for the few that list.
    scan.listMembers = (which) => (walk === walks ? membersOf(bytes, listable, which) : scanReview(bytes).listMembers?.(which));
  }
  return scan;
}

/**
 * ReviewScan.listMembers: and for a value that is a map of at most MAX_MEMBERS, its own members
 * likewise (`inner`). Keys named twice are listed twice: whoever takes members apart checks.
 */
function membersOf(bytes: Uint8Array, listable: Listable, which: 'object' | 'oldObject'): Member[] | undefined {
  if (!listable[which]) return undefined;
  const tag = which === 'object' ? OBJECT : OLD_OBJECT;
  const list: Member[] = [];
  // `inner` lists members by the member they are in, in order.
  let next = 0;
  for (let i = 0; i < members.length; i += 5) {
    while (next < innerLength && inner[next]! < i) next += 5;
    if (members[i] !== tag) continue;
    const member: Member = { key: { start: members[i + 1]!, end: members[i + 2]! }, value: { start: members[i + 3]!, end: members[i + 4]! } };
    if (bytes[member.value.start] === OPEN_BRACE && !crowded.includes(i)) {
      const own: Member[] = [];
      for (; next < innerLength && inner[next] === i; next += 5) {
        own.push({ key: { start: inner[next + 1]!, end: inner[next + 2]! }, value: { start: inner[next + 3]!, end: inner[next + 4]! } });
      }
      member.inner = own;
    }
    list.push(member);
  }
  return list;
}

/**
 * The request's span for guests to get as it came: when every parser reads the same request
 * from it (plain keys, valid UTF-8: JSON.parse saw replacement characters elsewhere).
 */
export function rawRequestSpan(bytes: Uint8Array, scan: ReviewScan): Span | undefined {
  const span = scan.request;
  return span && scan.plainKeys && isUtf8(bytes.subarray(span.start, span.end)) ? span : undefined;
}

/** scanReview then rawRequestSpan. */
export function requestSpan(bytes: Uint8Array): Span | undefined {
  return rawRequestSpan(bytes, scanReview(bytes));
}

function skipSpace(bytes: Uint8Array, at: number): number {
  const length = bytes.length;
  for (; at < length; at++) {
    const code = bytes[at]!;
    if (code !== 0x20 && code !== 0x0a && code !== 0x0d && code !== 0x09) return at;
  }
  return at;
}

/**
 * The byte at `at`, or -1 past the end. Every read that can fall past the end goes through here:
 * a typed-array read out of bounds, once seen at a site (every body's last skipSpace read one),
 * makes V8 compile that site for `number | undefined`, and the whole walk ran a third slower.
 */
function byteAt(bytes: Uint8Array, at: number): number {
  return at < bytes.length ? bytes[at]! : -1;
}

function isKey(bytes: Uint8Array, start: number, end: number, key: string): boolean {
  if (end - start !== key.length) return false;
  for (let i = 0; i < key.length; i++) if (bytes[start + i] !== key.charCodeAt(i)) return false;
  return true;
}

/** `at` is just past an opening quote: the index of the closing quote, or -1 (unterminated, a raw control character, a bad escape). Sets `escaped`. */
function stringEnd(bytes: Uint8Array, at: number): number {
  escaped = false;
  const length = bytes.length;
  while (at < length) {
    const code = bytes[at]!;
    if (code === QUOTE) return at;
    if (code === BACKSLASH) {
      escaped = true;
      const next = byteAt(bytes, at + 1);
      if (next === 0x75) {
        if (!isHex(byteAt(bytes, at + 2)) || !isHex(byteAt(bytes, at + 3)) || !isHex(byteAt(bytes, at + 4)) || !isHex(byteAt(bytes, at + 5))) return -1;
        at += 6;
        continue;
      }
      // " \ / b f n r t
      if (next !== QUOTE && next !== BACKSLASH && next !== 0x2f && next !== 0x62 && next !== 0x66 && next !== 0x6e && next !== 0x72 && next !== 0x74) return -1;
      at += 2;
      continue;
    }
    if (code < 0x20) return -1;
    at++;
  }
  return -1;
}

function isHex(code: number): boolean {
  return (code >= 0x30 && code <= 0x39) || (code >= 0x41 && code <= 0x46) || (code >= 0x61 && code <= 0x66);
}

function isDigit(code: number): boolean {
  return code >= 0x30 && code <= 0x39;
}

/** Just past `word` at `at`, or -1. */
function literalEnd(bytes: Uint8Array, at: number, word: string): number {
  for (let i = 0; i < word.length; i++) if (byteAt(bytes, at + i) !== word.charCodeAt(i)) return -1;
  return at + word.length;
}

/** Just past a number at `at` (-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?), or -1. */
function numberEnd(bytes: Uint8Array, at: number): number {
  if (byteAt(bytes, at) === 0x2d) at++;
  if (byteAt(bytes, at) === 0x30) at++;
  else if (isDigit(byteAt(bytes, at))) {
    do at++; while (isDigit(byteAt(bytes, at)));
  } else return -1;
  if (byteAt(bytes, at) === 0x2e) {
    at++;
    if (!isDigit(byteAt(bytes, at))) return -1;
    do at++; while (isDigit(byteAt(bytes, at)));
  }
  if (byteAt(bytes, at) === 0x65 || byteAt(bytes, at) === 0x45) {
    at++;
    if (byteAt(bytes, at) === 0x2b || byteAt(bytes, at) === 0x2d) at++;
    if (!isDigit(byteAt(bytes, at))) return -1;
    do at++; while (isDigit(byteAt(bytes, at)));
  }
  return at;
}
