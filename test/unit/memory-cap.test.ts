import { readFile } from 'node:fs/promises';
import { expect, it } from 'vitest';
import { moduleKind } from '../../host/src/sandbox/module-kind.ts';
import { capMemory } from '../../host/src/sandbox/memory-cap.ts';
import { wasm } from '../helpers/policies.ts';

// A module with one memory (the given limits) exported as "memory".
const moduleWithMemory = (limits: number[]) => new Uint8Array([
  0x00, 0x61, 0x73, 0x6d, 1, 0, 0, 0,
  5, limits.length + 1, 1, ...limits,
  7, 10, 1, 6, ...new TextEncoder().encode('memory'), 0x02, 0,
]);

it('gives a memory without a maximum the cap as its maximum, and grow fails there', async () => {
  const capped = capMemory(moduleWithMemory([0x00, 2]), 4 * 65536);
  expect(Array.from(capped.subarray(8, 14))).toEqual([5, 4, 1, 0x01, 2, 4]);
  const { memory } = new WebAssembly.Instance(await WebAssembly.compile(capped)).exports as { memory: WebAssembly.Memory };
  expect(memory.grow(2)).toBe(2);
  expect(() => memory.grow(1)).toThrow(RangeError);
});

it('keeps a smaller declared maximum, and lowers a larger one', () => {
  expect(Array.from(capMemory(moduleWithMemory([0x01, 1, 3]), 10 * 65536).subarray(8, 14))).toEqual([5, 4, 1, 0x01, 1, 3]);
  expect(Array.from(capMemory(moduleWithMemory([0x01, 1, 100]), 10 * 65536).subarray(8, 14))).toEqual([5, 4, 1, 0x01, 1, 10]);
});

it('refuses a module whose initial memory is above the cap', () => {
  expect(() => capMemory(moduleWithMemory([0x00, 20]), 2 * 65536)).toThrow('it declares 1.3 MiB before running (memories 1.3 MiB, tables 0 MiB), above its 0.1 MiB memory budget');
});

it('leaves a real policy module valid', async () => {
  const bytes = new Uint8Array(await readFile(wasm('no-delete')));
  const capped = capMemory(bytes, 2 ** 20);
  expect(capped).not.toEqual(bytes);
  await expect(WebAssembly.compile(capped)).resolves.toBeInstanceOf(WebAssembly.Module);
});

it('tells components from core modules by the header', async () => {
  expect(moduleKind(new Uint8Array(await readFile(wasm('no-delete'))))).toBe('core');
  expect(moduleKind(new Uint8Array(await readFile(wasm('numbers'))))).toBe('component');
  expect(moduleKind(new TextEncoder().encode('not wasm at all'))).toBeUndefined();
});

it('refuses more exception tags than a policy needs, and function types with exception references', async () => {
  const { readLayout, MAX_TAGS, writeLeb: leb } = await import('../../host/src/sandbox/memory-cap.ts');
  const section = (id: number, payload: number[]) => [id, ...leb(payload.length), ...payload];
  const header = [0, 0x61, 0x73, 0x6d, 1, 0, 0, 0];
  // Red team: a million tags, 23 MiB of a worker's heap per instance, outside the memory cap.
  const tags = (count: number) => Uint8Array.from([
    ...header, ...section(1, [1, 0x60, 0, 0]), ...section(13, [...leb(count), ...Array.from({ length: count }, () => [0, 0]).flat()]),
  ]);
  expect(() => readLayout(tags(MAX_TAGS))).not.toThrow();
  expect(() => readLayout(tags(MAX_TAGS + 1))).toThrow(`the module declares ${MAX_TAGS + 1} exception tags; a policy may have at most ${MAX_TAGS}`);
  // (func (param (ref null exn))) and (ref noexn); (ref null func) stays allowed.
  const takes = (...param: number[]) => Uint8Array.from([...header, ...section(1, [1, 0x60, 1, ...param, 0])]);
  expect(() => readLayout(takes(0x63, 0x70))).not.toThrow();
  expect(() => readLayout(takes(0x63, 0x69))).toThrow('type 0 takes or returns an exception reference (exnref), which a policy may not use');
  expect(() => readLayout(takes(0x64, 0x74))).toThrow(/exnref/);
  expect(() => readLayout(takes(0x69))).toThrow(/value type 0x69/);
});
