// Finds where the `request` value of an AdmissionReview body lies in the body's bytes, so that
// guests get the request exactly as it came (issue 14) instead of a copy the main thread
// re-serialized. The body was already checked by JSON.parse; this only walks its top level.
// It answers undefined whenever the bytes could mean something other than what JSON.parse saw
// for guests with another parser, and the caller then serializes the parsed request as before:
// a top-level key written with escapes, `request` twice, a key anywhere inside the request
// written with escapes (the AssemblyScript SDK's parser does not decode escapes in keys, so
// "oper\u0061tion" would not be `operation` to it), or bytes that are not UTF-8 (JSON.parse saw
// replacement characters there).
import { isUtf8 } from 'node:buffer';

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const OPEN_BRACE = 0x7b;
const CLOSE_BRACE = 0x7d;
const OPEN_BRACKET = 0x5b;
const CLOSE_BRACKET = 0x5d;
const COMMA = 0x2c;
const COLON = 0x3a;
const REQUEST = Buffer.from('request');

export interface Span {
  start: number;
  end: number;
}

function isSpace(byte: number): boolean {
  return byte === 0x20 || byte === 0x0a || byte === 0x0d || byte === 0x09;
}

function skipSpace(bytes: Uint8Array, at: number): number {
  while (at < bytes.length && isSpace(bytes[at]!)) at++;
  return at;
}

/** `at` is just past an opening quote; returns the index of the closing quote, or -1. */
function stringEnd(bytes: Buffer, at: number): number {
  for (;;) {
    const quote = bytes.indexOf(QUOTE, at);
    if (quote < 0) return -1;
    // Escaped when preceded by an odd number of backslashes.
    let slashes = 0;
    while (bytes[quote - 1 - slashes] === BACKSLASH) slashes++;
    if (slashes % 2 === 0) return quote;
    at = quote + 1;
  }
}

/** `at` is at the first byte of a value; returns the index just past it, or -1. */
function valueEnd(bytes: Buffer, at: number): number {
  const first = bytes[at];
  if (first === QUOTE) {
    const end = stringEnd(bytes, at + 1);
    return end < 0 ? -1 : end + 1;
  }
  if (first !== OPEN_BRACE && first !== OPEN_BRACKET) {
    // A number or a literal: up to the next structural byte or space.
    while (at < bytes.length) {
      const byte = bytes[at]!;
      if (byte === COMMA || byte === CLOSE_BRACE || byte === CLOSE_BRACKET || isSpace(byte)) break;
      at++;
    }
    return at;
  }
  let depth = 0;
  while (at < bytes.length) {
    const byte = bytes[at]!;
    if (byte === QUOTE) {
      const end = stringEnd(bytes, at + 1);
      if (end < 0) return -1;
      // A string followed by a colon is a key; one with an escape in it is not passed on raw.
      const next = skipSpace(bytes, end + 1);
      if (bytes[next] === COLON) for (let i = at + 1; i < end; i++) if (bytes[i] === BACKSLASH) return -1;
      at = next;
      continue;
    }
    if (byte === OPEN_BRACE || byte === OPEN_BRACKET) depth++;
    else if (byte === CLOSE_BRACE || byte === CLOSE_BRACKET) {
      depth--;
      if (depth === 0) return at + 1;
    }
    at++;
  }
  return -1;
}

/** The span of the top-level `request` value in a JSON object's bytes, or undefined (see above). */
export function requestSpan(bytes: Buffer): Span | undefined {
  let at = skipSpace(bytes, 0);
  if (bytes[at] !== OPEN_BRACE) return undefined;
  at = skipSpace(bytes, at + 1);
  let found: Span | undefined;
  while (at < bytes.length && bytes[at] !== CLOSE_BRACE) {
    if (bytes[at] !== QUOTE) return undefined;
    const keyEnd = stringEnd(bytes, at + 1);
    if (keyEnd < 0) return undefined;
    const key = bytes.subarray(at + 1, keyEnd);
    if (key.includes(BACKSLASH)) return undefined;
    at = skipSpace(bytes, keyEnd + 1);
    if (bytes[at] !== COLON) return undefined;
    const start = skipSpace(bytes, at + 1);
    const end = valueEnd(bytes, start);
    if (end < 0) return undefined;
    if (key.equals(REQUEST)) {
      if (found) return undefined;
      found = { start, end };
    }
    at = skipSpace(bytes, end);
    if (bytes[at] === COMMA) at = skipSpace(bytes, at + 1);
    else if (bytes[at] !== CLOSE_BRACE) return undefined;
  }
  return found && isUtf8(bytes.subarray(found.start, found.end)) ? found : undefined;
}
