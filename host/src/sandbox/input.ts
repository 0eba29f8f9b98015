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
 * each value's keys and length), NUL, the JSON with null in their places, then the values. A
 * value that holds others in `apart` (only a nested-apart guest is given such a list) is itself
 * in this form, keys relative to it. Lengths count UTF-16 code units, as JavaScript strings do
 * here and in the guest.
 */
function joinApart(bytes: Buffer, settings: string, apart: readonly Deferred[]): string {
  // By start, an outer value comes before the values inside it.
  const values = [...apart].sort((a, b) => a[0] - b[0]);
  const inside = new Map<Deferred | undefined, Deferred[]>();
  const open: Deferred[] = [];
  for (const value of values) {
    while (open.length > 0 && open[open.length - 1]![1] <= value[0]) open.pop();
    const outer = open[open.length - 1];
    const list = inside.get(outer);
    if (list) list.push(value);
    else inside.set(outer, [value]);
    open.push(value);
  }
  /** [from, to) with null for each value inside it, in the form when it has any. */
  const form = (from: number, to: number, head: string, outer: Deferred | undefined): string => {
    const cuts = inside.get(outer);
    if (!cuts) return head + bytes.toString('utf8', from, to);
    let json = head;
    for (const [start, end] of cuts) {
      json += `${bytes.toString('utf8', from, start)}null`;
      from = end;
    }
    json += bytes.toString('utf8', from, to);
    const lengths: (number | readonly string[])[] = [json.length];
    let tail = '';
    const depth = outer ? outer[2].length : 0;
    for (const value of cuts) {
      const piece = form(value[0], value[1], '', value);
      lengths.push(value[2].slice(depth), piece.length);
      tail += piece;
    }
    return `\u0000${JSON.stringify(lengths)}\u0000${json}${tail}`;
  };
  return form(1, bytes.length, `{"settings":${settings},`, undefined);
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
