// copyBytes must copy exactly what TypedArray#set copies, into and out of shared memory.
import { expect, it } from 'vitest';
import { concatBytes, copyBytes } from '../../host/src/util/bytes.ts';

const shared = (length: number) => new Uint8Array(new SharedArrayBuffer(length));
const counting = (length: number) => new Uint8Array(length).map((_, i) => (i * 7 + 3) & 255);

it.each([
  ['plain to shared', counting(5000).subarray(10, 4900), () => shared(5200), 100],
  ['shared to plain', (() => { const s = shared(5000); s.set(counting(5000)); return s.subarray(1); })(), () => new Uint8Array(5200), 3],
  ['one byte', counting(1), () => shared(4), 3],
  ['to the very end', counting(64), () => new Uint8Array(64), 0],
])('copies %s as TypedArray#set does', (_name, source, target, at) => {
  const expected = target();
  expected.set(source, at);
  const actual = target();
  copyBytes(source, actual, at);
  expect(Buffer.compare(actual, expected)).toBe(0);
});

it('copies overlapping ranges of one buffer as TypedArray#set does', () => {
  const expected = shared(64);
  expected.set(counting(64));
  const actual = shared(64);
  actual.set(counting(64));
  expected.set(expected.subarray(0, 20), 5);
  copyBytes(actual.subarray(0, 20), actual, 5);
  expect(Buffer.compare(actual, expected)).toBe(0);
});

it('copies nothing from an empty source, and refuses a target without room', () => {
  const target = new Uint8Array([1, 2, 3]);
  copyBytes(new Uint8Array(0), target, 3);
  expect([...target]).toEqual([1, 2, 3]);
  expect(() => copyBytes(counting(3), target, 1)).toThrow(new RangeError('3 bytes do not fit at 1 of 3'));
  expect([...target]).toEqual([1, 2, 3]);
});

it('joins byte arrays and plain byte lists in order, empty ones included', () => {
  expect([...concatBytes([Uint8Array.of(0, 1, 2), [], [9, 8], new Uint8Array(0), Uint8Array.of(7)])]).toEqual([0, 1, 2, 9, 8, 7]);
  expect(concatBytes([]).length).toBe(0);
});
