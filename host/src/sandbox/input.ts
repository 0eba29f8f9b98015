// Puts a SharedInput back together as the guest's JSON input: `{"settings":S,` followed by the
// envelope without its opening brace. Text for components (jco takes a string), bytes for
// Extism plugins (which take bytes, so nothing is decoded at all).
import { copyBytes } from '../util/bytes.ts';
import type { CallInput, Deferred, SharedInput } from './protocol.ts';

const encoder = new TextEncoder();

export function joinInput(input: SharedInput): string {
  const { envelope, settings, apart } = input;
  // Buffer over the shared memory: decoding reads it in place.
  const bytes = Buffer.from(envelope.buffer, envelope.byteOffset, envelope.byteLength);
  if (apart) return joinApart(bytes, settings, apart);
  const rest = bytes.toString('utf8', 1);
  return rest === '}' ? `{"settings":${settings}}` : `{"settings":${settings},${rest}`;
}

/**
 * The input with large values of the request after the JSON, for an SDK that parses each when
 * first read (sdk/src/input.ts has the form): NUL, a JSON list of the lengths (the JSON's, then
 * each value's keys and length), NUL, the JSON with null in their places, then the values.
 * Lengths count UTF-16 code units, as JavaScript strings do here and in the guest.
 */
function joinApart(bytes: Buffer, settings: string, apart: readonly Deferred[]): string {
  const cuts = [...apart].sort((a, b) => a[0] - b[0]);
  let text = `{"settings":${settings},`;
  let from = 1;
  for (const [start, end] of cuts) {
    text += `${bytes.toString('utf8', from, start)}null`;
    from = end;
  }
  text += bytes.toString('utf8', from);
  let values = '';
  const lengths: (number | readonly string[])[] = [text.length];
  for (const [start, end, path] of apart) {
    const value = bytes.toString('utf8', start, end);
    lengths.push(path, value.length);
    values += value;
  }
  return `\u0000${JSON.stringify(lengths)}\u0000${text}${values}`;
}

export function joinInputBytes(input: SharedInput): Uint8Array {
  const [head, tail] = inputParts(input);
  const bytes = new Uint8Array(head.length + tail.length);
  copyBytes(head, bytes);
  copyBytes(tail, bytes, head.length);
  return bytes;
}

const NOTHING = new Uint8Array(0);

/**
 * The guest's input as two runs of bytes, one after the other, for a host that writes them
 * straight into guest memory (issue 14): the shared envelope is not copied to be joined first.
 */
export function inputParts(input: CallInput): [head: Uint8Array, tail: Uint8Array] {
  if (typeof input === 'string') return [encoder.encode(input), NOTHING];
  const { envelope, settings } = input;
  const head = encoder.encode(envelope.byteLength <= 2 ? `{"settings":${settings}` : `{"settings":${settings},`);
  return [head, envelope.subarray(1)];
}

export function inputText(input: CallInput): string {
  return typeof input === 'string' ? input : joinInput(input);
}

export function inputBytes(input: CallInput): string | Uint8Array {
  return typeof input === 'string' ? input : joinInputBytes(input);
}
