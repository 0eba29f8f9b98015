// A core policy's entry points take nothing and return a status (Extism's convention: the input
// and the answer travel through host functions). One that takes parameters compiles and loads,
// then fails on every call with whatever the glue says of the missing arguments ("Cannot
// convert undefined to a BigInt"), naming neither the cause nor the fix (red team, and a
// newcomer's `export function validate(ctx: Context)` in AssemblyScript). Read from the binary
// at load, as V8 does not reflect function types; the module has compiled, so it is well formed.
import { readLeb } from './memory-cap.ts';

/** The exports the host calls in a core module. */
export const ENTRY_POINTS = new Set(['validate', 'mutate', 'validate_settings']);

const I32 = 0x7f;
const I64 = 0x7e;
const VALUE_NAMES: Record<number, string> = { 0x7f: 'i32', 0x7e: 'i64', 0x7d: 'f32', 0x7c: 'f64', 0x7b: 'v128', 0x70: 'funcref', 0x6f: 'externref' };

interface Signature { params: number[]; results: number[] }

/** Why each entry point the module exports has the wrong type; empty when all are `() -> i32`. */
export function entryPointProblems(bytes: Uint8Array, module: WebAssembly.Module): string[] {
  const importedFunctions = WebAssembly.Module.imports(module).filter((i) => i.kind === 'function').length;
  const types: Signature[] = [];
  const functionTypes: number[] = [];
  const exported: [name: string, index: number][] = [];
  for (let offset = 8; offset < bytes.length;) {
    const id = bytes[offset]!;
    const [size, sizeLength] = readLeb(bytes, offset + 1, bytes.length);
    const start = offset + 1 + sizeLength;
    const end = start + size;
    if (id === 1) readTypes(bytes, start, end, types);
    else if (id === 3) readIndices(bytes, start, end, functionTypes);
    else if (id === 7) readFunctionExports(bytes, start, end, exported);
    offset = end;
  }
  const problems: string[] = [];
  for (const [name, index] of exported) {
    if (index < importedFunctions) {
      problems.push(`its "${name}" is an imported function, not one of its own`);
      continue;
    }
    const signature = types[functionTypes[index - importedFunctions]!];
    if (!signature) continue;
    const { params, results } = signature;
    if (params.length === 0 && results.length <= 1 && results.every((r) => r === I32 || r === I64)) continue;
    problems.push(`its "${name}" takes (${params.map(nameOf).join(', ')}) and returns (${results.map(nameOf).join(', ')}); ` +
      'an entry point takes no parameters and returns an i32 status, 0 once the SDK wrote the answer ' +
      '(AssemblyScript: `export function validate(): i32 { return handleValidate(check); }`)');
  }
  return problems;
}

function nameOf(type: number): string {
  return VALUE_NAMES[type] ?? 'a reference';
}

function readTypes(bytes: Uint8Array, start: number, end: number, into: Signature[]): void {
  const [count, countLength] = readLeb(bytes, start, end);
  let at = start + countLength;
  for (let i = 0; i < count; i++) {
    at++; // 0x60: only function types pass memory-cap.ts
    const vectors: number[][] = [];
    for (let v = 0; v < 2; v++) {
      const [n, length] = readLeb(bytes, at, end);
      at += length;
      const vector: number[] = [];
      for (let t = 0; t < n; t++) {
        const type = bytes[at++]!;
        vector.push(type);
        if (type === 0x63 || type === 0x64) at += readLeb(bytes, at, end)[1]; // a heap type follows
      }
      vectors.push(vector);
    }
    into.push({ params: vectors[0]!, results: vectors[1]! });
  }
}

function readIndices(bytes: Uint8Array, start: number, end: number, into: number[]): void {
  const [count, countLength] = readLeb(bytes, start, end);
  let at = start + countLength;
  for (let i = 0; i < count; i++) {
    const [index, length] = readLeb(bytes, at, end);
    at += length;
    into.push(index);
  }
}

function readFunctionExports(bytes: Uint8Array, start: number, end: number, into: [string, number][]): void {
  const [count, countLength] = readLeb(bytes, start, end);
  let at = start + countLength;
  for (let i = 0; i < count; i++) {
    const [nameLength, length] = readLeb(bytes, at, end);
    at += length;
    const name = Buffer.from(bytes.buffer, bytes.byteOffset + at, nameLength).toString('utf8');
    at += nameLength;
    const kind = bytes[at++];
    const [index, indexLength] = readLeb(bytes, at, end);
    at += indexLength;
    if (kind === 0 && ENTRY_POINTS.has(name)) into.push([name, index]);
  }
}
