// The memory budget of a sandbox is written into the policy's modules themselves. One budget
// (limits.memoryMiB) covers everything a policy instance can make the host allocate up front
// or by growing: every linear memory of every core module together, every table (entries x
// TABLE_ENTRY_BYTES) and every global. A module whose declared minimums already exceed it is
// refused at load, with the numbers; otherwise each memory and table gets a declared maximum
// so that the maxima together fit the budget, and `memory.grow` / `table.grow` past it fail
// inside the guest instead of growing the host. This costs nothing per call and works the
// same for Extism plugins and for the core modules of a component.
//
// The walk over the module is bounded before it allocates: section sizes are checked against
// the file's length and the number of sections is capped, and only the table, memory, global
// and type sections (for the types a policy may not hold) are looked into, so a header
// followed by megabytes of zeros (millions of empty custom sections) is refused in
// microseconds without one object per section.
import { PortcullisError } from '../errors.ts';
import { mib } from '../util/text.ts';
import { concatBytes } from '../util/bytes.ts';

const PAGE = 65536;
const TYPE_SECTION = 1;
const IMPORT_SECTION = 2;
const TABLE_SECTION = 4;
const EXPORT_SECTION = 7;
const ELEMENT_SECTION = 9;
const MEMORY_SECTION = 5;
const GLOBAL_SECTION = 6;
const CODE_SECTION = 10;
const TAG_SECTION = 13;
const CUSTOM_SECTION = 0;
const DATA_SECTION = 11;
/**
 * What V8 spends per table entry: the table's own slot plus its entry in the instance's
 * indirect-call dispatch table (measured: ten million funcref entries cost about 305 MiB).
 */
export const TABLE_ENTRY_BYTES = 32;
/** What a global costs the host, rounded up generously (value, type, mutability, boxing). */
export const GLOBAL_BYTES = 16;
/** Real modules have a dozen standard sections and a handful of custom ones. */
export const MAX_SECTIONS = 1000;
/**
 * Linear memories per policy (all its core modules together). However small, each reserves
 * about 8 GiB of the process's address space for its guard regions, and the 128 TiB a process
 * has is shared by every worker: a module of thousands of empty memories (counted at 0 bytes)
 * could leave no room for any other policy's memory (red team). Toolchains make one or two.
 */
export const MAX_MEMORIES = 8;
/**
 * Types per module. V8 keeps every distinct function type of every module it ever compiled in one
 * table for the whole process, never emptied, and ends the process when it is full (red team: a
 * module of a million types killed the host at load; three of 400,000, each refused, on the
 * third reload). Toolchains make tens to a few hundred (QuickJS: 127).
 */
export const MAX_TYPES = 4096;
/**
 * Parameters and results of all of a module's function types together. V8 keeps each type's
 * value types too: 4,095 types of 1,000 parameters and 1,000 results (8 MB) left ~60 MB in the
 * host for each version of such a module loaded (red team), and decoding them held the main
 * thread for a second. Real modules have at most about a thousand (SpiderMonkey: 1,024;
 * QuickJS: 663; AssemblyScript policies: under 100).
 */
export const MAX_TYPE_VALUES = 65_536;
/**
 * Imports and exports per module. V8 makes a JavaScript object of each export per instance, and
 * listing them blocks the main thread (red team: a million exports, 1 s and 200 MB there, and
 * about 100 MB of a worker's heap per instance). Policies have tens.
 */
export const MAX_IMPORTS = 4096;
export const MAX_EXPORTS = 4096;
/**
 * Exception tags per module. V8 makes a heap object of each per instance, outside the memory cap
 * (red team: a million tags in a 2 MB module, 23 MiB of a worker's heap and 250 ms an instance).
 * Toolchains make none or one (C++'s and AssemblyScript's exceptions).
 */
export const MAX_TAGS = 256;
/**
 * Element segments of a policy, all its modules together, in bytes (at least one per entry). V8
 * keeps a passive segment as an array on the worker's JavaScript heap, 8 bytes an entry, outside
 * the memory cap, and a heap past its limit ends the whole process (red team: 33 million
 * entries killed the host). QuickJS's function table takes 1.4 KB.
 */
export const MAX_ELEMENT_BYTES = 64 * 1024;
/**
 * Table entries of a policy, all its tables together, whatever the memory cap allows: a table
 * lives on the worker's JavaScript heap too, which every policy in the worker shares (QuickJS:
 * 739 entries).
 */
export const MAX_TABLE_ENTRIES = 65_536;
/** Memories other than a module's largest share at most this fraction of the room to grow. */
const SIDE_MEMORY_SHARE = 1 / 16;

export class MemoryCapError extends PortcullisError {
  constructor(message: string) {
    super('MODULE_OVER_BUDGET', message);
  }
}

interface Limits {
  flags: number;
  min: number;
  max: number | undefined;
}

interface Span {
  /** Where the section's id byte is. */
  header: number;
  start: number;
  end: number;
}

/** What a core module declares, and where, read without copying it. */
export interface ModuleLayout {
  memories: Limits[];
  /** Each table's element type byte followed by its limits. */
  tables: (Limits & { type: number })[];
  globals: number;
  /** Bytes of its element section. */
  elementBytes: number;
  /** Bytes of its data and custom sections: carried by V8, not compiled (compile-trial.ts allowanceOf). */
  carriedBytes: number;
  /** Function types it declares. */
  types: number;
  /** Parameters and results of those types, in all. */
  typeValues: number;
  typeSection?: Span;
  importSection?: Span;
  memorySection?: Span;
  tableSection?: Span;
  codeSection?: Span;
}

const SECTION_NAMES = ['custom', 'type', 'import', 'function', 'table', 'memory', 'global', 'export', 'start', 'element', 'code', 'data', 'data count', 'tag'];

export function readLayout(bytes: Uint8Array): ModuleLayout {
  if (bytes.length < 8) throw new MemoryCapError('the module is shorter than a WebAssembly header');
  const layout: ModuleLayout = { memories: [], tables: [], globals: 0, elementBytes: 0, carriedBytes: 0, types: 0, typeValues: 0 };
  let offset = 8;
  let sections = 0;
  const seen = new Set<number>();
  while (offset < bytes.length) {
    if (++sections > MAX_SECTIONS) throw new MemoryCapError(`the module has more than ${MAX_SECTIONS} sections; it is not a policy`);
    const id = bytes[offset]!;
    // A section that claims the wrong size puts the next one where its own bytes are.
    if (id > 13) throw new MemoryCapError(`unknown section id ${id} at byte ${offset}${sections > 1 ? ' (a section before it may claim the wrong size)' : ''}`);
    if (id !== CUSTOM_SECTION) {
      // V8 refuses a second one too, but after this walk has read (and planned) only one of them.
      if (seen.has(id)) throw new MemoryCapError(`the ${SECTION_NAMES[id]} section appears twice (again at byte ${offset}); a module has it at most once`);
      seen.add(id);
    }
    const [size, sizeLength] = readLeb(bytes, offset + 1, bytes.length);
    const start = offset + 1 + sizeLength;
    const end = start + size;
    if (end > bytes.length) throw new MemoryCapError(`section ${id} at byte ${offset} claims ${size} bytes, past the end of the module`);
    if (id === TYPE_SECTION) {
      layout.typeSection = { header: offset, start, end };
      [layout.types, layout.typeValues] = checkFunctionTypes(bytes, start, end);
    } else if (id === MEMORY_SECTION) {
      layout.memorySection = { header: offset, start, end };
      layout.memories = readLimitsVector(bytes, start, end, false);
    } else if (id === TABLE_SECTION) {
      layout.tableSection = { header: offset, start, end };
      layout.tables = readLimitsVector(bytes, start, end, true) as ModuleLayout['tables'];
    } else if (id === CODE_SECTION) {
      layout.codeSection = { header: offset, start, end };
    } else if (id === GLOBAL_SECTION) {
      layout.globals = readLeb(bytes, start, end)[0];
    } else if (id === IMPORT_SECTION || id === EXPORT_SECTION) {
      if (id === IMPORT_SECTION) layout.importSection = { header: offset, start, end };
      const [count] = readLeb(bytes, start, end);
      const [what, max] = id === IMPORT_SECTION ? ['imports', MAX_IMPORTS] : ['exports', MAX_EXPORTS];
      if (count > max) throw new MemoryCapError(`the module has ${count} ${what}; a policy may have at most ${max}`);
    } else if (id === ELEMENT_SECTION) {
      layout.elementBytes += size;
    } else if (id === DATA_SECTION || id === CUSTOM_SECTION) {
      layout.carriedBytes += size;
    } else if (id === TAG_SECTION) {
      const [count] = readLeb(bytes, start, end);
      if (count > MAX_TAGS) throw new MemoryCapError(`the module declares ${count} exception tags; a policy may have at most ${MAX_TAGS}`);
    }
    offset = end;
  }
  return layout;
}

function readLimitsVector(bytes: Uint8Array, start: number, end: number, tables: boolean): (Limits & { type?: number })[] {
  const [count, countLength] = readLeb(bytes, start, end);
  // Each entry takes at least two bytes: a count larger than that is a lie about the section.
  if (count > (end - start) / 2) throw new MemoryCapError(`the ${tables ? 'table' : 'memory'} section claims ${count} entries in ${end - start} bytes`);
  const out: (Limits & { type?: number })[] = [];
  let at = start + countLength;
  for (let i = 0; i < count; i++) {
    const type = tables ? bytes[at++] : undefined;
    // Typed-reference tables carry a heap type (and may carry an initializer) this walk does not
    // rewrite: refused with a reason rather than misread.
    if (type !== undefined && type !== 0x70 && type !== 0x6f) throw new MemoryCapError(`table ${i} has element type 0x${type.toString(16)}; a policy's tables hold funcref or externref`);
    const flags = bytes[at++];
    if (flags === undefined || at > end) throw new MemoryCapError('truncated limits in module');
    if (flags > 0x07) throw new MemoryCapError(`unknown ${tables ? 'table' : 'memory'} limits flags 0x${flags.toString(16)}`);
    const [min, minLength] = readLeb(bytes, at, end);
    at += minLength;
    let max: number | undefined;
    if (flags & 0x01) {
      const [declared, maxLength] = readLeb(bytes, at, end);
      at += maxLength;
      max = declared;
    }
    out.push({ flags, min, max, ...(type !== undefined ? { type } : {}) });
  }
  return out;
}

/** Declared maxima that make one policy's modules fit one budget. */
export interface BudgetPlan {
  /** Per module, per memory, the maximum in pages. */
  memoryMax: number[][];
  /** Per module, per table, the maximum in entries. */
  tableMax: number[][];
}

/**
 * Splits one budget across every module of a policy. Minimums are paid first; what is left
 * goes to growth: tables do not grow (no toolchain we build with grows them), the largest
 * memory gets the rest after the others' small shares.
 */
export function planBudget(layouts: ModuleLayout[], capBytes: number): BudgetPlan {
  // Types are counted per policy, not only per module: a component of a hundred core modules
  // of 4,095 types each (jco transpiles every one) took 409,500 of the host's 500,000 for one
  // policy, and the next policies' modules were refused until a restart (red team).
  const types = sum(layouts.map((l) => l.types));
  if (types > MAX_TYPES) {
    throw new MemoryCapError(`its core modules declare ${types} function types in all; a policy may have at most ${MAX_TYPES} ` +
      '(V8 keeps every type until the host process ends)');
  }
  const typeValues = sum(layouts.map((l) => l.typeValues));
  if (typeValues > MAX_TYPE_VALUES) {
    throw new MemoryCapError(`its core modules' function types have ${typeValues} parameters and results in all; a policy may have at most ${MAX_TYPE_VALUES} ` +
      '(real policies have about a thousand)');
  }
  const count = sum(layouts.map((l) => l.memories.length));
  if (count > MAX_MEMORIES) {
    throw new MemoryCapError(`it declares ${count} linear memories; a policy may have at most ${MAX_MEMORIES} ` +
      '(each reserves about 8 GiB of the host\'s address space, whatever its size)');
  }
  const elementBytes = sum(layouts.map((l) => l.elementBytes));
  if (elementBytes > MAX_ELEMENT_BYTES) {
    throw new MemoryCapError(`its element segments take ${elementBytes} bytes; a policy may have at most ${MAX_ELEMENT_BYTES} ` +
      '(the host keeps their entries outside the memory cap)');
  }
  const tableEntries = sum(layouts.flatMap((l) => l.tables.map((t) => t.min)));
  if (tableEntries > MAX_TABLE_ENTRIES) {
    throw new MemoryCapError(`its tables start with ${tableEntries} entries; a policy may have at most ${MAX_TABLE_ENTRIES}`);
  }
  const memoryMin = sum(layouts.flatMap((l) => l.memories.map((m) => m.min))) * PAGE;
  const tableMin = sum(layouts.flatMap((l) => l.tables.map((t) => t.min))) * TABLE_ENTRY_BYTES;
  const globals = sum(layouts.map((l) => l.globals)) * GLOBAL_BYTES;
  const fixed = memoryMin + tableMin + globals;
  if (fixed > capBytes) {
    const parts = [`memories ${mib(memoryMin)} MiB`, `tables ${mib(tableMin)} MiB`, ...(globals >= PAGE ? [`globals ${mib(globals)} MiB`] : [])];
    throw new MemoryCapError(`it declares ${mib(fixed)} MiB before running (${parts.join(', ')}), above its ${mib(capBytes)} MiB memory budget; ` +
      'raise limits.memoryMiB or shrink the module');
  }
  let room = Math.floor((capBytes - fixed) / PAGE);
  const memories = layouts.flatMap((l, module) => l.memories.map((m, index) => ({ module, index, ...m })));
  const main = memories.reduce<(typeof memories)[number] | undefined>((best, m) => (!best || m.min > best.min ? m : best), undefined);
  const memoryMax = layouts.map((l) => l.memories.map((m) => m.min));
  const others = memories.filter((m) => m !== main);
  const share = others.length > 0 ? Math.floor((room * SIDE_MEMORY_SHARE) / others.length) : 0;
  for (const m of others) {
    const grow = Math.min(share, (m.max ?? Infinity) - m.min);
    memoryMax[m.module]![m.index] = m.min + grow;
    room -= grow;
  }
  if (main) memoryMax[main.module]![main.index] = main.min + Math.min(room, (main.max ?? Infinity) - main.min);
  return { memoryMax, tableMax: layouts.map((l) => l.tables.map((t) => t.min)) };
}

/** The module with the plan's maxima written in; everything else is spliced in unchanged. */
export function applyPlan(bytes: Uint8Array, layout: ModuleLayout, memoryMax: number[], tableMax: number[]): Uint8Array<ArrayBuffer> {
  const edits: { span: Span; id: number; payload: number[] }[] = [];
  if (layout.memorySection) {
    edits.push({ span: layout.memorySection, id: MEMORY_SECTION, payload: writeLimitsVector(layout.memories, memoryMax) });
  }
  if (layout.tableSection) {
    edits.push({ span: layout.tableSection, id: TABLE_SECTION, payload: writeLimitsVector(layout.tables, tableMax) });
  }
  edits.sort((a, b) => a.span.start - b.span.start);
  const parts: Uint8Array[] = [];
  let at = 0;
  for (const { span, id, payload } of edits) {
    parts.push(bytes.subarray(at, span.header), Uint8Array.from([id, ...writeLeb(payload.length), ...payload]));
    at = span.end;
  }
  parts.push(bytes.subarray(at));
  return concatBytes(parts);
}

/** One module, one budget: plan and apply in one step. */
export function capMemory(bytes: Uint8Array, capBytes: number): Uint8Array<ArrayBuffer> {
  const layout = readLayout(bytes);
  const plan = planBudget([layout], capBytes);
  return applyPlan(bytes, layout, plan.memoryMax[0]!, plan.tableMax[0]!);
}

function writeLimitsVector(entries: (Limits & { type?: number })[], maxima: number[]): number[] {
  const out = writeLeb(entries.length);
  entries.forEach((entry, i) => {
    if (entry.type !== undefined) out.push(entry.type);
    out.push(entry.flags | 0x01, ...writeLeb(entry.min), ...writeLeb(maxima[i]!));
  });
  return out;
}

function sum(values: number[]): number {
  return values.reduce((a, b) => a + b, 0);
}

const FUNC_TYPE = 0x60;
/** Value types of the MVP, SIMD and reference types (no GC heap types). */
const PLAIN_VALUE_TYPES = new Set([0x7f, 0x7e, 0x7d, 0x7c, 0x7b, 0x70, 0x6f]);
/** `(ref ht)` and `(ref null ht)`: a heap type follows, as a signed LEB128. */
const TYPED_REFERENCES = new Set([0x63, 0x64]);
/** The heap types exn and noexn (signed LEB128 -0x17, -0x0c). */
const EXCEPTION_HEAP_TYPES = new Set([0x69, 0x74]);

/**
 * Only function types: struct and array types (WasmGC) allocate on the worker's JavaScript heap,
 * which no memory cap reaches, and running out of it aborts the whole host process (red-team:
 * one `array.new` of 60 million i64 killed the host). No policy toolchain we build emits them.
 */
function checkFunctionTypes(bytes: Uint8Array, start: number, end: number): [types: number, values: number] {
  const [count, countLength] = readLeb(bytes, start, end);
  if (count > (end - start) / 3) throw new MemoryCapError(`the type section claims ${count} types in ${end - start} bytes`);
  if (count > MAX_TYPES) throw new MemoryCapError(`the module declares ${count} types; a policy may have at most ${MAX_TYPES}`);
  let at = start + countLength;
  let values = 0;
  for (let i = 0; i < count; i++) {
    const form = bytes[at++];
    if (form !== FUNC_TYPE) {
      throw new MemoryCapError(`type ${i} is not a function type (form 0x${(form ?? 0).toString(16)}): garbage-collected structs and arrays ` +
        '(WasmGC) are not allowed in a policy, because their memory is outside the sandbox\'s cap');
    }
    for (let vector = 0; vector < 2; vector++) {
      const [types, length] = readLeb(bytes, at, end);
      at += length;
      values += types;
      if (values > MAX_TYPE_VALUES) {
        throw new MemoryCapError(`the module's function types have more than ${MAX_TYPE_VALUES} parameters and results in all (${MAX_TYPE_VALUES} at most; real modules have about a thousand)`);
      }
      for (let t = 0; t < types; t++) {
        const type = bytes[at++];
        if (type !== undefined && TYPED_REFERENCES.has(type)) {
          // (ref null exn): a caught exception as a value, kept outside the memory cap (code-walk.ts, catch_ref).
          if (EXCEPTION_HEAP_TYPES.has(bytes[at]!)) throw new MemoryCapError(`type ${i} takes or returns an exception reference (exnref), which a policy may not use`);
          at += readLeb(bytes, at, end)[1];
        }
        else if (type === undefined || !PLAIN_VALUE_TYPES.has(type)) throw new MemoryCapError(`type ${i} has a value type 0x${(type ?? 0).toString(16)} a policy may not use`);
      }
    }
    if (at > end) throw new MemoryCapError('the type section runs past its end');
  }
  return [count, values];
}

/** An unsigned LEB128 at `offset`, read no further than `limit`: [value, bytes it took]. */
export function readLeb(bytes: Uint8Array, offset: number, limit: number): [number, number] {
  let result = 0;
  let shift = 0;
  let length = 0;
  for (;;) {
    if (offset + length >= limit) throw new MemoryCapError('truncated LEB128 in module');
    const byte = bytes[offset + length]!;
    result += (byte & 0x7f) * 2 ** shift;
    length++;
    if ((byte & 0x80) === 0) return [result, length];
    shift += 7;
    if (shift > 63) throw new MemoryCapError('LEB128 too long in module');
  }
}

export function writeLeb(value: number): number[] {
  const out: number[] = [];
  do {
    let byte = value % 128;
    value = Math.floor(value / 128);
    if (value > 0) byte |= 0x80;
    out.push(byte);
  } while (value > 0);
  return out;
}
