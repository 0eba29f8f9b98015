// Guards over JSON text as bytes, run before JSON.parse: how deep its brackets nest and about
// what parsing it will cost the heap. Untrusted JSON reaches the host as reviews and as registry
// manifests; JSON.parse of a few MB of tiny containers takes hundreds of MB.

/** Heap that JSON.parse makes of one container, and of one more element, beyond its bytes (Node 24: an empty object ~67 bytes + its slot). */
export const PARSED_CONTAINER_BYTES = 96;
export const PARSED_ELEMENT_BYTES = 16;

/**
 * Whether brackets outside strings nest deeper than `limit`. Only a guard: malformed text is
 * JSON.parse's to refuse, so an unterminated string simply ends the walk. It walks bytes, not
 * a string: over a string (from Buffer.toString, external when over ~1 MB) the same loop fell,
 * at random after a few dozen large bodies, into a state costing ~6 µs a character for the
 * rest of the process: 15-20 s of main thread per 2.5 MB review (red team). UTF-8 never puts a
 * quote or a backslash byte inside a multi-byte character, so bytes say the same as characters.
 */
export function nestedDeeperThan(bytes: Uint8Array, limit: number): boolean {
  let depth = 0;
  const length = bytes.length;
  for (let at = 0; at < length; at++) {
    const code = bytes[at]!;
    if (code === 0x22) {
      at = closingQuote(bytes, at);
      if (at < 0) return false;
    } else if (code === 0x7b || code === 0x5b) {
      if (++depth > limit) return true;
    } else if (code === 0x7d || code === 0x5d) {
      depth--;
    }
  }
  return false;
}

/** `open` is at a string's opening quote; the index of its closing quote (the next one no odd run of backslashes escapes), or -1. */
function closingQuote(bytes: Uint8Array, open: number): number {
  let at = open;
  for (;;) {
    at = nextQuote(bytes, at + 1);
    if (at < 0) return -1;
    let slashes = 0;
    while (bytes[at - 1 - slashes] === 0x5c) slashes++;
    if (slashes % 2 === 0) return at;
  }
}

/**
 * The next quote byte from `from`, or -1. Most strings of a review are short, and a call into
 * C++ (Uint8Array.indexOf) per string cost ~14 µs of main thread a 5 KB review, every review
 * (profile); a loop finds a near quote for less, and hands long strings to indexOf.
 */
function nextQuote(bytes: Uint8Array, from: number): number {
  const near = Math.min(bytes.length, from + 64);
  for (let at = from; at < near; at++) if (bytes[at] === 0x22) return at;
  return near === bytes.length ? -1 : bytes.indexOf(0x22, near);
}

/**
 * About what parsing `bytes` will cost the heap beyond the bytes themselves (an estimate; the
 * HTTP layer charges it to its body budget before the body is parsed): a body of a million
 * empty objects is 3 MB and ~70 MB parsed (red team: 85 of them at once, within the byte budget,
 * took the host to 2.5 GB). Strings are skipped as in nestedDeeperThan.
 */
export function parsedCostOf(bytes: Uint8Array): number {
  let containers = 0;
  let elements = 0;
  const length = bytes.length;
  for (let at = 0; at < length; at++) {
    const code = bytes[at]!;
    if (code === 0x22) {
      at = closingQuote(bytes, at);
      if (at < 0) break;
    } else if (code === 0x7b || code === 0x5b) {
      containers++;
    } else if (code === 0x2c) {
      elements++;
    }
  }
  return containers * PARSED_CONTAINER_BYTES + elements * PARSED_ELEMENT_BYTES;
}

/**
 * The value of the member named `key` in the map at `span` (the last one, as JSON.parse keeps),
 * found without parsing: a walk over the map's own members that skips what they hold. For JSON
 * the review's scan has checked, whose keys are written without escapes (its `plainKeys`).
 */
export function memberOf(bytes: Uint8Array, span: { start: number; end: number }, key: string): { start: number; end: number } | undefined {
  const want = Buffer.from(key);
  let found: { start: number; end: number } | undefined;
  let depth = 0;
  let expectKey = false;
  let named = false;
  let valueStart = -1;
  const close = (at: number) => {
    if (named && valueStart >= 0) {
      let end = at;
      while (end > valueStart && isSpace(bytes[end - 1]!)) end--;
      found = { start: valueStart, end };
    }
    valueStart = -1;
    named = false;
  };
  for (let at = span.start; at < span.end; at++) {
    const code = bytes[at]!;
    if (code === 0x22) {
      const end = closingQuote(bytes, at);
      if (end < 0) return undefined;
      if (depth === 1 && expectKey) {
        named = end - at - 1 === want.length && want.every((byte, i) => bytes[at + 1 + i] === byte);
        expectKey = false;
      }
      at = end;
    } else if (code === 0x7b || code === 0x5b) {
      if (++depth === 1) expectKey = true;
    } else if (code === 0x7d || code === 0x5d) {
      if (depth === 1) close(at);
      if (--depth === 0) break;
    } else if (depth === 1 && code === 0x3a) {
      valueStart = at + 1;
      while (valueStart < span.end && isSpace(bytes[valueStart]!)) valueStart++;
    } else if (depth === 1 && code === 0x2c) {
      close(at);
      expectKey = true;
    }
  }
  return found;
}

function isSpace(code: number): boolean {
  return code === 0x20 || code === 0x0a || code === 0x0d || code === 0x09;
}
