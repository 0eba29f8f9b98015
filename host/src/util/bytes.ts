// Copies between byte arrays where one side may be a SharedArrayBuffer (the review's envelope).
// TypedArray#set into or out of shared memory copies one element at a time (V8 keeps each
// access atomic): 3.3-3.6 µs for a 5 KB review, on the main thread once per review and in a
// worker once per policy call. Buffer#copy of a part of its source is a memmove in Node 24
// (0.2 µs); of the whole source it calls TypedArray#set, so the first byte is copied apart.

/** Copies all of `source` into `target` from index `at`; `target` must have room for it. */
export function copyBytes(source: Uint8Array, target: Uint8Array, at = 0): void {
  if (at + source.length > target.length) throw new RangeError(`${source.length} bytes do not fit at ${at} of ${target.length}`);
  if (source.length === 0) return;
  // Within one buffer the two ranges may overlap, which the first byte copied apart would spoil.
  if (source.buffer === target.buffer) {
    target.set(source, at);
    return;
  }
  target[at] = source[0]!;
  Buffer.from(source.buffer, source.byteOffset, source.length).copy(target, at + 1, 1);
}

/** `parts` one after another in a new array. */
export function concatBytes(parts: readonly (Uint8Array | readonly number[])[]): Uint8Array<ArrayBuffer> {
  const result = new Uint8Array(parts.reduce((n, part) => n + part.length, 0));
  let offset = 0;
  for (const part of parts) {
    result.set(part, offset);
    offset += part.length;
  }
  return result;
}

/**
 * Most bytes carved from one chunk of shared memory, and the largest request carved rather than
 * given a buffer of its own (a quarter: at most that much of a chunk goes unused).
 */
export const SHARED_CHUNK_BYTES = 256 * 1024;
const CARVED_UP_TO = SHARED_CHUNK_BYTES / 4;

let chunk: SharedArrayBuffer | undefined;
let chunkUsed = 0;

/**
 * `length` bytes of zeroed shared memory, for a review's envelope. A SharedArrayBuffer made per
 * review cost the main thread 4.6 µs to make, and the main thread and the worker together 8-25
 * µs more to post it than a view of a larger one (/tmp microbenchmarks, Node 24: each new buffer
 * is registered and counted apart on both sides). So small ones are cut from a chunk in turn.
 * A chunk is never handed out twice: a view is its review's alone for as long as anything holds
 * it (a worker still reading after its deadline included), and the chunk goes to the garbage
 * collector once the last view of it does. The views share `.buffer`: code that reads one must
 * keep to its byteOffset and length, as every reader here does.
 */
export function sharedBytes(length: number): Uint8Array<SharedArrayBuffer> {
  if (length > CARVED_UP_TO) return new Uint8Array(new SharedArrayBuffer(length));
  if (chunk === undefined || chunkUsed + length > SHARED_CHUNK_BYTES) {
    chunk = new SharedArrayBuffer(SHARED_CHUNK_BYTES);
    chunkUsed = 0;
  }
  const view = new Uint8Array(chunk, chunkUsed, length);
  // Each view starts on 8 bytes, as a buffer of its own would.
  chunkUsed += (length + 7) & ~7;
  return view;
}
