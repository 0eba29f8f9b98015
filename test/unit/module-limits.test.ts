// Red team, session 22: shapes of module that cost the host outside every per-policy cap, each
// refused at load, before V8 compiles anything, with the limit named.
import { expect, it } from 'vitest';
import { DEFAULT_LIMITS } from '../../host/src/config/limits.ts';
import { MAX_ELEMENT_BYTES, MAX_EXPORTS, MAX_IMPORTS, MAX_TABLE_ENTRIES, MAX_TYPE_VALUES, MAX_TYPES, writeLeb as leb } from '../../host/src/sandbox/memory-cap.ts';
import { prepareSandbox, TypeBudget } from '../../host/src/sandbox/prepare.ts';
import { module, RETURN_0 } from '../helpers/wasm.ts';

const HEADER = [0x00, 0x61, 0x73, 0x6d, 1, 0, 0, 0];
const section = (id: number, payload: number[]) => [id, ...leb(payload.length), ...payload];
const vector = (items: number[][]) => [...leb(items.length), ...items.flat()];
const name = (text: string) => { const b = [...new TextEncoder().encode(text)]; return [...leb(b.length), ...b]; };
const prepare = (bytes: number[] | Uint8Array) => prepareSandbox('hostile', Uint8Array.from(bytes), DEFAULT_LIMITS, false);

// One function () -> i32 that returns 0, exported as "validate" under each name given.
function withExports(names: string[], extra: number[] = []): number[] {
  return [
    ...HEADER,
    ...section(1, vector([[0x60, 0, 1, 0x7f]])),
    ...section(3, vector([[0]])),
    ...extra,
    ...section(7, vector(names.map((n) => [...name(n), 0, 0]))),
    ...section(10, vector([[4, 0, ...RETURN_0, 0x0b]])),
  ];
}

it('refuses a module of more function types than toolchains make (V8 keeps them for the life of the process)', async () => {
  // Distinct types: () -> (i32 x k)
  const types = Array.from({ length: MAX_TYPES + 1 }, (_, k) => [0x60, 0, ...leb(k % 64 + 1), ...Array<number>(k % 64 + 1).fill(0x7f)]);
  await expect(prepare([...HEADER, ...section(1, vector(types))])).rejects.toThrow(`the module declares ${MAX_TYPES + 1} types; a policy may have at most ${MAX_TYPES}`);
});

it('refuses a module whose function types are wider in all than toolchains make, before decoding them all', async () => {
  // Red team: 4,095 types of 1,000 parameters and 1,000 results left ~60 MB in the host per
  // version loaded, under the type count; decoding them held the main thread for a second.
  const wide = (k: number) => Buffer.concat([
    Buffer.from([0x60, ...leb(1000)]), Buffer.alloc(1000, 0x7f), Buffer.from(leb(1000 + (k % 7))), Buffer.alloc(1000 + (k % 7), 0x7e),
  ]);
  const body = Buffer.concat([Buffer.from(leb(4095)), ...Array.from({ length: 4095 }, (_, k) => wide(k))]);
  const bytes = Buffer.concat([Buffer.from(HEADER), Buffer.from([1, ...leb(body.length)]), body]);
  const started = performance.now();
  await expect(prepare(bytes)).rejects.toThrow(
    `the module's function types have more than ${MAX_TYPE_VALUES} parameters and results in all (${MAX_TYPE_VALUES} at most; real modules have about a thousand)`,
  );
  // Stopped at the bound, not after 8 million value types (a second on the main thread).
  expect(performance.now() - started).toBeLessThan(500);
});

it('refuses a module of more exports or imports than a policy has', async () => {
  const names = Array.from({ length: MAX_EXPORTS + 1 }, (_, i) => `validate${i || ''}`);
  await expect(prepare(withExports(names))).rejects.toThrow(`the module has ${MAX_EXPORTS + 1} exports; a policy may have at most ${MAX_EXPORTS}`);
  const imports = section(2, vector(Array.from({ length: MAX_IMPORTS + 1 }, (_, i) => [...name('extism:host/env'), ...name(`f${i}`), 0, 0])));
  const bytes = withExports(['validate']);
  // imports go right after the type section
  const typeEnd = HEADER.length + section(1, vector([[0x60, 0, 1, 0x7f]])).length;
  await expect(prepare([...bytes.slice(0, typeEnd), ...imports, ...bytes.slice(typeEnd)])).rejects.toThrow(`the module has ${MAX_IMPORTS + 1} imports`);
});

it('refuses element segments past their budget (kept on the worker\'s heap, outside the memory cap)', async () => {
  // A passive segment (flags 1, elemkind funcref) of function 0, once per byte past the budget.
  const entries = MAX_ELEMENT_BYTES;
  const elements = section(9, vector([[1, 0x00, ...leb(entries), ...Array<number>(entries).fill(0)]]));
  const bytes = withExports(['validate']);
  const exportAt = bytes.indexOf(7, HEADER.length + 10);
  await expect(prepare([...bytes.slice(0, exportAt), ...bytes.slice(exportAt, bytes.length - 8), ...elements, ...bytes.slice(bytes.length - 8)]))
    .rejects.toThrow(/its element segments take \d+ bytes; a policy may have at most 65536/);
});

it('refuses tables past their entry budget, whatever the memory cap', async () => {
  await expect(prepare(module({ tables: [{ min: MAX_TABLE_ENTRIES + 1 }], functions: [RETURN_0], exports: [{ name: 'validate', kind: 'func', index: 0 }] })))
    .rejects.toThrow(`its tables start with ${MAX_TABLE_ENTRIES + 1} entries; a policy may have at most ${MAX_TABLE_ENTRIES}`);
  // At the budget: loaded.
  await expect(prepare(module({ tables: [{ min: MAX_TABLE_ENTRIES }], functions: [RETURN_0], exports: [{ name: 'validate', kind: 'func', index: 0 }] }))).resolves.toBeDefined();
});

it('charges function types once per distinct module, for the life of the process, and refuses past the budget', () => {
  const budget = new TypeBudget(10);
  budget.charge('a', 6);
  budget.charge('a', 6); // the same module again: V8 has its types already
  expect(() => budget.charge('b', 5)).toThrow('this host has compiled modules declaring 6 function types, which V8 keeps until the process ends; ' +
    'this module\'s 5 more would pass 10: restart the host (a rolling restart) to load it');
  budget.charge('c', 4);
  expect(() => budget.charge('d', 1)).toThrow(/declaring 10 function types/);
});
