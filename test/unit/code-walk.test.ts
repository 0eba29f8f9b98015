// The nesting bound must never refuse what real toolchains emit: walk large modules built by
// Rust (wasm-tools, jco's bindgen), C++ (SpiderMonkey's splicer) and our AssemblyScript policies.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { expect, it } from 'vitest';
import { checkCodeSection, MAX_BODY_BYTES, MAX_NESTING } from '../../host/src/sandbox/code-walk.ts';
import { readLayout, writeLeb as leb } from '../../host/src/sandbox/memory-cap.ts';
import { root, wasm } from '../helpers/policies.ts';
import { module as handMade, RETURN_0 } from '../helpers/wasm.ts';

const packageDir = (name: string) => join(root, 'node_modules', name);

function walk(bytes: Uint8Array): void {
  const { codeSection } = readLayout(bytes);
  expect(codeSection).toBeDefined();
  checkCodeSection(bytes, codeSection!.start, codeSection!.end);
}

it.each([
  ['wasm-tools (Rust)', () => join(packageDir('@bytecodealliance/jco-transpile'), 'vendor/wasm-tools.core.wasm')],
  ['js-component-bindgen (Rust)', () => join(packageDir('@bytecodealliance/jco-transpile'), 'vendor/js-component-bindgen-component.core.wasm')],
  ['spidermonkey-embedding-splicer (C++/Rust)', () => join(packageDir('@bytecodealliance/componentize-js'), 'lib/spidermonkey-embedding-splicer.core.wasm')],
  ['no-delete (AssemblyScript)', () => wasm('no-delete')],
  ['added-by (AssemblyScript)', () => wasm('added-by')],
])('accepts %s', (_, file) => {
  expect(() => walk(readFileSync(file()))).not.toThrow();
});

it('counts every structured instruction and refuses one level past the bound', () => {
  // (func) with `levels` nested blocks: type, function, code sections by hand.
  const module = (levels: number, opener: number[]) => {
    const body = [0x00, ...Array.from({ length: levels }, () => opener).flat(), ...Array<number>(levels).fill(0x0b), 0x0b];
    const entry = [...leb(body.length), ...body];
    const code = [...leb(1), ...entry];
    return Uint8Array.from([0, 0x61, 0x73, 0x6d, 1, 0, 0, 0, 1, 4, 1, 0x60, 0, 0, 3, 2, 1, 0, 10, ...leb(code.length), ...code]);
  };
  for (const opener of [[0x02, 0x40], [0x03, 0x40], [0x1f, 0x40, 0x00]]) {
    expect(() => walk(module(MAX_NESTING - 1, opener))).not.toThrow();
    expect(() => walk(module(MAX_NESTING, opener))).toThrow(/nests blocks more than 10000 deep/);
  }
});

it('refuses an instruction it cannot decode rather than guess its length', () => {
  const bytes = Uint8Array.from([0, 0x61, 0x73, 0x6d, 1, 0, 0, 0, 1, 4, 1, 0x60, 0, 0, 3, 2, 1, 0, 10, 5, 1, 3, 0, 0xf0, 0x0b]);
  expect(() => walk(bytes)).toThrow(/function body 0 uses instruction 0xf0 \(byte 23\), which the host does not accept in a policy/);
});

it('refuses a function body larger than 512 KiB, whatever it holds, and accepts one just below', () => {
  // Bodies of `nop`s: the optimising compiler's memory grows with a body's size (red team: 2 GB for 7.6 MB).
  const ofSize = (bytes: number) => handMade({ functions: [[...Array<number>(bytes - RETURN_0.length - 2).fill(0x01), ...RETURN_0]] });
  expect(() => walk(ofSize(MAX_BODY_BYTES))).not.toThrow();
  expect(() => walk(ofSize(MAX_BODY_BYTES + 1))).toThrow("function body 0 is 524289 bytes; a policy's functions may be at most 512 KiB (524288 bytes) each");
});

it('refuses a try_table that catches an exception as a value (catch_ref, catch_all_ref), and accepts catch and catch_all', () => {
  // Red team: exceptions kept as exnref values chained on the host's heap, 2.5 GB from a 5 KB module.
  const withClause = (clause: number[]) => {
    const body = [0x00, 0x1f, 0x40, 0x01, ...clause, 0x0b, 0x0b]; // try_table, one clause, branching to the function's block
    const code = [...leb(1), ...leb(body.length), ...body];
    return Uint8Array.from([0, 0x61, 0x73, 0x6d, 1, 0, 0, 0, 1, 4, 1, 0x60, 0, 0, 3, 2, 1, 0, 10, ...leb(code.length), ...code]);
  };
  expect(() => walk(withClause([0x00, 0x00, 0x00]))).not.toThrow(); // catch $tag 0
  expect(() => walk(withClause([0x02, 0x00]))).not.toThrow(); // catch_all 0
  expect(() => walk(withClause([0x01, 0x00, 0x00]))).toThrow('function body 0 catches an exception as a value (try_table catch_ref), which the host does not accept in a policy');
  expect(() => walk(withClause([0x03, 0x00]))).toThrow(/catch_all_ref/);
});
