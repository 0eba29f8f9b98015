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
