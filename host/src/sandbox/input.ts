// Puts a SharedInput back together as the guest's JSON input: `{"settings":S,` followed by the
// envelope without its opening brace. Text for components (jco takes a string), bytes for
// Extism plugins (which take bytes, so nothing is decoded at all).
import type { CallInput, SharedInput } from './protocol.ts';

const encoder = new TextEncoder();

export function joinInput(input: SharedInput): string {
  const { envelope, settings } = input;
  // Buffer over the shared memory: decoding reads it in place.
  const rest = Buffer.from(envelope.buffer, envelope.byteOffset, envelope.byteLength).toString('utf8', 1);
  return rest === '}' ? `{"settings":${settings}}` : `{"settings":${settings},${rest}`;
}

export function joinInputBytes(input: SharedInput): Uint8Array {
  const { envelope, settings } = input;
  const head = encoder.encode(envelope.byteLength <= 2 ? `{"settings":${settings}` : `{"settings":${settings},`);
  const bytes = new Uint8Array(head.length + envelope.byteLength - 1);
  bytes.set(head);
  bytes.set(envelope.subarray(1), head.length);
  return bytes;
}

export function inputText(input: CallInput): string {
  return typeof input === 'string' ? input : joinInput(input);
}

export function inputBytes(input: CallInput): string | Uint8Array {
  return typeof input === 'string' ? input : joinInputBytes(input);
}
