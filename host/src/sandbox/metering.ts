// Gives a core module a deadline of its own: a fuel counter it cannot see, charged at the start
// of every function and loop turn and by the size of every bulk operation, that makes the guest
// trap (`unreachable`, which no `catch_all` catches) when it falls below zero.
//
// Why: a sandbox worker enforces a policy's CPU deadline by being terminated from outside, which
// only a thread of its own allows. A guest metered this way can be stopped where it runs, so the
// host may call a cheap policy in the thread that took the request, with no hop to a worker
// (sandbox/inline-lane.ts, issue 14), and hand the call to a worker when the fuel runs out.
//
// The counter is a new mutable i64 global, appended after the module's own (no index moves) and
// exported as FUEL_EXPORT, so the host sets it before each call. Instructions are charged one
// each, a host call HOST_CALL_COST, bulk memory and table operations by their count (bytes, or
// entries), memory.grow by the pages it adds. Only `loop` branches backwards, so the charge at
// a function's start or a loop's head, the longest path from there (code-walk.ts BodyPlan),
// covers everything that can run before the next charge. A small function without loops is
// charged on its callers' paths instead of at its start (code-walk.ts foldCalls).
//
// The module was checked by code-walk.ts, which also found the places to charge; this file
// reads only the few sections it needs, already bounded by readLayout.
import { checkCodeSection, MAX_BODY_BYTES, Reader, type BodyPlan, type CodeMeter } from './code-walk.ts';
import { readLayout, readLeb, writeLeb } from './memory-cap.ts';
import { concatBytes as concat } from '../util/bytes.ts';

/** The exported counter. The host writes it before each call and reads it after a trap. */
export const FUEL_EXPORT = 'portcullis_fuel';
/**
 * The module's start function, exported under this name instead of run by instantiation: the
 * counter starts at zero (a guest run before the host sets it traps at once), and the host
 * sets it before calling this (inline-lane.ts: INLINE_START_FUEL).
 */
export const START_EXPORT = 'portcullis_start';
/** What a worker gives each call: more than any deadline allows to burn. The deadline stops it there. */
export const UNLIMITED_FUEL = 2n ** 62n;
/**
 * A one-slot table the host fills with its refill function (setRefill). When the counter falls
 * below zero the guest calls it, and traps unless it was given more: the host grants fuel in
 * slices and looks at the clock at each, so a call is bounded by time as well as by fuel. Fuel
 * is not time (longest-path charges make QuickJS's dispatch loop cost ~200 units a nanosecond,
 * a pointer chase ~0.03), so a budget large enough for a TypeScript policy would, on its own,
 * let a hostile module hold the thread for seconds. An empty slot traps (call_indirect on null).
 */
export const REFILL_EXPORT = 'portcullis_refill';

const TYPE_SECTION = 1;
const TABLE_SECTION = 4;
const GLOBAL_SECTION = 6;
const EXPORT_SECTION = 7;
const START_SECTION = 8;
const CODE_SECTION = 10;
/** Where each section id goes in a module (the spec's order; tags, 13, sit between memory and global). */
const ORDER: Record<number, number> = { 1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 13: 6, 6: 7, 7: 8, 8: 9, 9: 10, 12: 11, 10: 12, 11: 13 };
const I32 = 0x7f;
const I64 = 0x7e;
/** V8's limit on a function's locals, parameters included. */
const MAX_LOCALS = 50_000;
/**
 * The most parameters and results a type of a metered module may have. A call, `return` or
 * branch is charged a unit or a few, but V8 copies every value it carries: red team (session 48),
 * a function returning 1,000 values up 50 levels of recursion ran 59 ms a slice of fuel, against
 * 0.44 for straight-line code and the pointer chase's 35 the lane's bounds are set by. The
 * repository's modules have at most 14; a wider one runs in the workers, stopped from outside.
 */
const MAX_TYPE_VALUES = 32;

/**
 * The most table entries a metered module may hold (tables do not grow: memory-cap.ts). One
 * table operation runs whole between two looks at the clock, however it is charged: red team
 * (session 50), a table.fill of 65,536 refs to a host function took ~17 ms of the main thread.
 * At this size ~1 ms. The toolchains' tables are far smaller (StarlingMonkey's 739, AssemblyScript's
 * a few); a module with larger ones runs in the workers, stopped from outside.
 */
export const MAX_METERED_TABLE_ENTRIES = 4096;

export type Metering = { bytes: Uint8Array<ArrayBuffer> } | { unmetered: string };

/**
 * The module with a fuel counter, or why it stays as it is (then it runs only in workers,
 * which the deadline stops from outside).
 */
export function meterModule(bytes: Uint8Array): Metering {
  const layout = readLayout(bytes);
  if (!layout.codeSection) return { unmetered: 'it has no code' };
  // 64-bit memories and tables count in i64, and a memory.copy between the two kinds in i32:
  // not worth the cases for what no policy toolchain emits.
  if (layout.memories.some((m) => m.flags & 0x04) || layout.tables.some((t) => t.flags & 0x04)) return { unmetered: 'it has a 64-bit memory or table' };
  const tableEntries = layout.tables.reduce((n, t) => n + t.min, 0);
  if (tableEntries > MAX_METERED_TABLE_ENTRIES) return { unmetered: `its tables hold ${tableEntries} entries (at most ${MAX_METERED_TABLE_ENTRIES} are metered)` };
  const sections = readSections(bytes);
  const imports = sections.get(2) ? readImports(bytes, sections.get(2)!) : { functions: 0, globals: 0, tables: 0, memory64: false };
  if (!imports) return { unmetered: 'it imports something of a kind the host does not know' };
  if (imports.memory64) return { unmetered: 'it imports a 64-bit memory or table' };
  // A module may export nothing (a component's table fixup, run by its start function): it gets
  // an export section for the counter.
  const exported = sections.get(EXPORT_SECTION);
  const startSection = sections.get(START_SECTION);
  const start = startSection ? readLeb(bytes, startSection.start, startSection.end)[0] : undefined;
  const { names, functions: entries } = readExports(bytes, exported);
  if (start !== undefined) entries.add(start);
  const meter: CodeMeter = { importedFunctions: imports.functions, bodies: [], atomics: false, entries };
  checkCodeSection(bytes, layout.codeSection.start, layout.codeSection.end, meter);
  // memory.atomic.wait blocks its thread until another writes: the thread must be a worker.
  if (meter.atomics) return { unmetered: 'it uses atomic instructions' };
  for (const taken of [FUEL_EXPORT, START_EXPORT, REFILL_EXPORT]) if (names.has(taken)) return { unmetered: `it exports a name of its own called ${taken}` };
  // Extism calls hs_init as it instantiates, before the host could set the counter.
  if (names.has('hs_init')) return { unmetered: 'it exports hs_init, which Extism runs while instantiating' };
  const fuel = imports.globals + layout.globals;
  const { params, widest } = paramCounts(bytes, sections.get(1), sections.get(3));
  if (params.length !== meter.bodies.length) return { unmetered: 'its function and code sections disagree' };
  if (widest > MAX_TYPE_VALUES) return { unmetered: `a function or block type of its has ${widest} parameters and results (at most ${MAX_TYPE_VALUES} are metered)` };
  // A bulk charge needs one more local, and V8 refuses a function with more than MAX_LOCALS.
  if (meter.bodies.some((plan, i) => plan.bulk.length > 0 && params[i]! + plan.declaredLocals >= MAX_LOCALS)) return { unmetered: 'a function has as many locals as V8 allows' };

  // Appended, as the counter is: a type [] -> [] for the refill, and its table. Nothing the
  // module had moves, and its own code cannot name either (it was valid without them).
  const refill = { type: entryCount(bytes, sections.get(TYPE_SECTION)), table: imports.tables + layout.tables.length };
  const replaced = new Map<number, number[]>();
  replaced.set(TYPE_SECTION, appendEntries(bytes, sections.get(TYPE_SECTION), [[0x60, 0x00, 0x00]]));
  replaced.set(TABLE_SECTION, appendEntries(bytes, sections.get(TABLE_SECTION), [[0x70, 0x01, 0x01, 0x01]]));
  replaced.set(GLOBAL_SECTION, appendEntries(bytes, sections.get(GLOBAL_SECTION), [[I64, 0x01, 0x42, 0x00, 0x0b]]));
  const startExport = start === undefined ? [] : [[...name(START_EXPORT), 0x00, ...writeLeb(start)]];
  replaced.set(EXPORT_SECTION, appendEntries(bytes, exported, [
    [...name(FUEL_EXPORT), 0x03, ...writeLeb(fuel)], [...name(REFILL_EXPORT), 0x01, ...writeLeb(refill.table)], ...startExport,
  ]));
  const bodies = meter.bodies.map((plan, i) => meterBody(bytes, plan, fuel, params[i]!, refill));
  if (bodies.some((body) => body.length > MAX_BODY_BYTES)) return { unmetered: `charging it would take a function past ${MAX_BODY_BYTES} bytes` };
  const codeSize = writeLeb(bodies.length).length + bodies.reduce((n, b) => n + b.length, 0);

  const out: (Uint8Array | number[])[] = [bytes.subarray(0, 8)];
  // The sections every metered module has, written once, where the spec's order puts them (a
  // module without one gets it there).
  const written = new Set<number>();
  const write = (id: number) => {
    if (!written.has(id)) out.push(sectionOf(id, replaced.get(id)!));
    written.add(id);
  };
  const added = [TYPE_SECTION, TABLE_SECTION, GLOBAL_SECTION, EXPORT_SECTION];
  for (const [id, span] of sections.all) {
    for (const other of added) if (id !== 0 && ORDER[id]! > ORDER[other]!) write(other);
    if (id === 0 && isCodeMetadata(bytes, span)) continue; // offsets into the code, which moved
    if (id === START_SECTION) continue; // exported instead (START_EXPORT)
    if (added.includes(id)) write(id);
    else if (id === CODE_SECTION) out.push([CODE_SECTION, ...writeLeb(codeSize), ...writeLeb(bodies.length)], ...bodies);
    else out.push(bytes.subarray(span.header, span.end));
  }
  for (const other of added) write(other);
  return { bytes: concat(out) };
}

interface SectionSpan {
  header: number;
  start: number;
  end: number;
}

function readSections(bytes: Uint8Array): { all: [number, SectionSpan][]; get(id: number): SectionSpan | undefined } {
  const all: [number, SectionSpan][] = [];
  let offset = 8;
  while (offset < bytes.length) {
    const id = bytes[offset]!;
    const [size, sizeLength] = readLeb(bytes, offset + 1, bytes.length);
    const start = offset + 1 + sizeLength;
    all.push([id, { header: offset, start, end: start + size }]);
    offset = start + size;
  }
  const byId = new Map(all.filter(([id]) => id !== 0));
  return { all, get: (id) => byId.get(id) };
}

/** Limits (flags, minimum, maximum if flagged); says whether they are 64-bit. */
function limits(r: Reader): boolean {
  const flags = r.byte();
  r.leb();
  if (flags & 0x01) r.leb();
  return (flags & 0x04) !== 0;
}

/** Skips a name (a length, then that many bytes). */
function skipName(r: Reader): void {
  r.skip(r.leb());
}

/** What the module imports, or undefined for an import of a kind this does not know. */
function readImports(bytes: Uint8Array, span: SectionSpan): { functions: number; globals: number; tables: number; memory64: boolean } | undefined {
  const c = new Reader(bytes, span.start, span.end);
  const count = c.leb();
  let functions = 0;
  let globals = 0;
  let tables = 0;
  let memory64 = false;
  for (let i = 0; i < count; i++) {
    skipName(c);
    skipName(c);
    const kind = c.byte();
    if (kind === 0x00) {
      c.leb();
      functions++;
    } else if (kind === 0x01) {
      c.valueType();
      memory64 = limits(c) || memory64;
      tables++;
    } else if (kind === 0x02) memory64 = limits(c) || memory64;
    else if (kind === 0x03) {
      c.valueType();
      c.byte();
      globals++;
    } else if (kind === 0x04) {
      c.byte();
      c.leb();
    } else return undefined;
  }
  return { functions, globals, tables, memory64 };
}

/** The export section's names, and the function indices among what it exports (none when there is no section). */
function readExports(bytes: Uint8Array, span: SectionSpan | undefined): { names: Set<string>; functions: Set<number> } {
  const names = new Set<string>();
  const functions = new Set<number>();
  if (!span) return { names, functions };
  const c = new Reader(bytes, span.start, span.end);
  const decoder = new TextDecoder();
  for (let i = c.leb(); i > 0; i--) {
    const length = c.leb();
    names.add(decoder.decode(bytes.subarray(c.at, c.at + length)));
    c.skip(length);
    const kind = c.byte();
    const index = c.leb();
    if (kind === 0x00) functions.add(index);
  }
  return { names, functions };
}

/** Parameters of each function the module defines, in order, and the most values (parameters and results) any of its types has. */
function paramCounts(bytes: Uint8Array, types?: SectionSpan, functions?: SectionSpan): { params: number[]; widest: number } {
  const perType: number[] = [];
  let widest = 0;
  if (types) {
    const c = new Reader(bytes, types.start, types.end);
    for (let i = c.leb(); i > 0; i--) {
      c.byte(); // 0x60: readLayout refused every other form
      const params = c.leb();
      for (let p = 0; p < params; p++) c.valueType();
      const results = c.leb();
      for (let r = 0; r < results; r++) c.valueType();
      perType.push(params);
      widest = Math.max(widest, params + results);
    }
  }
  if (!functions) return { params: [], widest };
  const c = new Reader(bytes, functions.start, functions.end);
  const params: number[] = [];
  for (let i = c.leb(); i > 0; i--) params.push(perType[c.leb()] ?? 0);
  return { params, widest };
}

/** How many entries a vector section holds (0 when there is none). */
function entryCount(bytes: Uint8Array, span: SectionSpan | undefined): number {
  return span ? readLeb(bytes, span.start, span.end)[0] : 0;
}

/** A vector section's payload with more entries (a new section's when there is none). */
function appendEntries(bytes: Uint8Array, span: SectionSpan | undefined, entries: number[][]): number[] {
  if (!span) return [...writeLeb(entries.length), ...entries.flat()];
  const [count, countLength] = readLeb(bytes, span.start, span.end);
  return [...writeLeb(count + entries.length), ...bytes.subarray(span.start + countLength, span.end), ...entries.flat()];
}

/**
 * One body with its charges. A static charge subtracts its cost; a bulk charge takes the count
 * off the stack into a scratch local, subtracts it (shifted), and puts it back. When the counter
 * is then below zero the guest calls the refill (REFILL_EXPORT), and traps if it still is.
 */
function meterBody(bytes: Uint8Array, plan: BodyPlan, fuel: number, params: number, refill: { type: number; table: number }): Uint8Array {
  const scratch = params + plan.declaredLocals;
  const spent = [0x23, ...writeLeb(fuel), 0x42, 0x00, 0x53];
  // if (fuel < 0) { refill(); if (fuel < 0) unreachable }
  const trapIfSpent = [...spent, 0x04, 0x40, 0x41, 0x00, 0x11, ...writeLeb(refill.type), ...writeLeb(refill.table), ...spent, 0x04, 0x40, 0x00, 0x0b, 0x0b];
  const subtract = (cost: number[]) => [0x23, ...writeLeb(fuel), ...cost, 0x7d, 0x24, ...writeLeb(fuel), ...trapIfSpent];
  const inserts: { at: number; code: number[] }[] = [
    ...plan.charges.map(({ at, cost }) => ({ at, code: subtract([0x42, ...sleb(BigInt(cost))]) })),
    ...plan.bulk.map(({ at, shift, cap }) => {
      const count = [0x20, ...writeLeb(scratch)];
      // min(count, cap), unsigned: select(count, cap, count < cap).
      const charged = cap === undefined ? count : [...count, 0x41, ...sleb(BigInt(cap)), ...count, 0x41, ...sleb(BigInt(cap)), 0x49, 0x1b];
      return { at, code: [0x21, ...writeLeb(scratch), ...subtract([...charged, 0xad, ...(shift ? [0x42, shift, 0x86] : [])]), ...count] };
    }),
  ].sort((a, b) => a.at - b.at);
  const parts: (Uint8Array | number[])[] = [];
  // Local declarations: one more group, a single i32, when a bulk charge needs the scratch local.
  const [groups, groupsLength] = readLeb(bytes, plan.start, plan.end);
  if (plan.bulk.length > 0) parts.push(writeLeb(groups + 1), bytes.subarray(plan.start + groupsLength, plan.codeStart), [1, I32]);
  else parts.push(bytes.subarray(plan.start, plan.codeStart));
  let at = plan.codeStart;
  for (const insert of inserts) {
    parts.push(bytes.subarray(at, insert.at), insert.code);
    at = insert.at;
  }
  parts.push(bytes.subarray(at, plan.end));
  const body = concat(parts);
  return concat([writeLeb(body.length), body]);
}

/** Custom sections that point into the code by offset (branch hints and other code metadata). */
function isCodeMetadata(bytes: Uint8Array, span: SectionSpan): boolean {
  const [length, lengthSize] = readLeb(bytes, span.start, span.end);
  const prefix = 'metadata.code.';
  if (length < prefix.length) return false;
  const text = new TextDecoder().decode(bytes.subarray(span.start + lengthSize, span.start + lengthSize + prefix.length));
  return text === prefix;
}

function sectionOf(id: number, payload: number[]): number[] {
  return [id, ...writeLeb(payload.length), ...payload];
}

function name(text: string): number[] {
  const encoded = [...new TextEncoder().encode(text)];
  return [...writeLeb(encoded.length), ...encoded];
}

/** Signed LEB128 of an i64. */
function sleb(value: bigint): number[] {
  const out: number[] = [];
  for (;;) {
    const byte = Number(value & 0x7fn);
    value >>= 7n;
    const done = (value === 0n && (byte & 0x40) === 0) || (value === -1n && (byte & 0x40) !== 0);
    out.push(done ? byte : byte | 0x80);
    if (done) return out;
  }
}

/**
 * Puts `refill` in a metered instance's refill slot (REFILL_EXPORT). A table holds only
 * WebAssembly functions: a two-import module makes one of the host function.
 */
export function setRefill(exports: WebAssembly.Exports, refill: () => void): void {
  const table = exports[REFILL_EXPORT];
  if (!(table instanceof WebAssembly.Table)) throw new Error(`a metered module exports ${REFILL_EXPORT}`);
  const made = new WebAssembly.Instance(REFILL_WRAPPER, { host: { refill } });
  table.set(0, made.exports.refill);
}

// (module (type (func)) (import "host" "refill" (func (type 0))) (export "refill" (func 0)))
const REFILL_WRAPPER = new WebAssembly.Module(new Uint8Array([
  0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00,
  0x01, 0x04, 0x01, 0x60, 0x00, 0x00,
  0x02, 0x0f, 0x01, 0x04, ...[...'host'].map((c) => c.charCodeAt(0)), 0x06, ...[...'refill'].map((c) => c.charCodeAt(0)), 0x00, 0x00,
  0x07, 0x0a, 0x01, 0x06, ...[...'refill'].map((c) => c.charCodeAt(0)), 0x00, 0x00,
]));
