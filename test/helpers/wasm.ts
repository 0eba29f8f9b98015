// Hand-made WebAssembly modules for hostile-module tests: a minimal binary encoder, so a test
// says exactly which tables, memories, start function and exports an attacker would write.
import { writeLeb as leb } from '../../host/src/sandbox/memory-cap.ts';

const HEADER = [0x00, 0x61, 0x73, 0x6d, 1, 0, 0, 0];
const FUNCREF = 0x70;

const name = (text: string) => { const b = [...new TextEncoder().encode(text)]; return [...leb(b.length), ...b]; };
const section = (id: number, payload: number[]) => [id, ...leb(payload.length), ...payload];
const vector = (items: number[][]) => [...leb(items.length), ...items.flat()];
const limits = (min: number, max?: number) => (max === undefined ? [0, ...leb(min)] : [1, ...leb(min), ...leb(max)]);

export interface ModuleSpec {
  memories?: { min: number; max?: number }[];
  tables?: { min: number; max?: number }[];
  /** Exports, by name, of a function (index), memory or table (index). */
  exports?: { name: string; kind: 'func' | 'memory' | 'table' | 'global'; index: number }[];
  /** Bodies of functions of type () -> i32, as raw instruction bytes (without the final `end`). */
  functions?: number[][];
  /** Index of a function to run as the start function (it must be of type () -> ()); see startLoop. */
  startLoop?: boolean;
  /** Like startLoop, with a start function that traps (`unreachable`) instead. */
  startTrap?: boolean;
  /** i32 locals every function declares (one declaration: 4 bytes, however many). */
  locals?: number;
}

/**
 * Function 0..n-1 are `() -> i32` with the given bodies; with startLoop, one more function
 * `() -> ()` that loops forever is added last and made the start function.
 */
export function module(spec: ModuleSpec): Uint8Array {
  const bodies = spec.functions ?? [];
  const types = [[0x60, 0, 1, 0x7f], [0x60, 0, 0]];
  const start = spec.startLoop ? [0x03, 0x40, 0x0c, 0x00, 0x0b, 0x0b] : spec.startTrap ? [0x00, 0x0b] : undefined;
  const funcTypes = [...bodies.map(() => 0), ...(start ? [1] : [])];
  const code = [...bodies.map((b) => [...b, 0x0b]), ...(start ? [start] : [])]
    .map((body) => { const full = [...(spec.locals ? [1, ...leb(spec.locals), 0x7f] : [0]), ...body]; return [...leb(full.length), ...full]; });
  const kinds = { func: 0, table: 1, memory: 2, global: 3 } as const;
  const bytes = [
    ...HEADER,
    ...section(1, vector(types)),
    ...(funcTypes.length ? section(3, vector(funcTypes.map((t) => [t]))) : []),
    ...(spec.tables?.length ? section(4, vector(spec.tables.map((t) => [FUNCREF, ...limits(t.min, t.max)]))) : []),
    ...(spec.memories?.length ? section(5, vector(spec.memories.map((m) => limits(m.min, m.max)))) : []),
    ...(spec.exports?.length ? section(7, vector(spec.exports.map((e) => [...name(e.name), kinds[e.kind], ...leb(e.index)]))) : []),
    ...(start ? section(8, leb(bodies.length)) : []),
    ...(code.length ? section(10, vector(code)) : []),
  ];
  return new Uint8Array(bytes);
}

/** `i32.const 0` : a body for a function that returns 0. */
export const RETURN_0 = [0x41, 0x00];
/** Signed LEB128, as `i32.const` wants it. */
function sleb(value: number): number[] {
  const out: number[] = [];
  for (;;) {
    const byte = value & 0x7f;
    value >>= 7;
    const done = (value === 0 && (byte & 0x40) === 0) || (value === -1 && (byte & 0x40) !== 0);
    out.push(done ? byte : byte | 0x80);
    if (done) return out;
  }
}

/** `count` empty loops one after another: 3 bytes each. */
export const emptyLoops = (count: number) => Array.from({ length: count }, () => [0x03, 0x40, 0x0b]).flat();

/** Grows memory `index` by `pages`, leaving the result (-1 when refused) on the stack. */
export const growMemory = (index: number, pages: number) => [0x41, ...sleb(pages), 0x40, ...leb(index)];
/** A body that loops forever, each turn one memory.fill of `bytes` bytes of memory 0, then (never reached) returns 0. */
export const fillForever = (bytes: number) => [0x03, 0x40, 0x41, 0x00, 0x41, 0x07, 0x41, ...sleb(bytes), 0xfc, 0x0b, 0x00, 0x0c, 0x00, 0x0b, ...RETURN_0];
/** `drop`: discards the value on top of the stack. */
export const DROP = [0x1a];

/** `text` as a WAT string literal: every UTF-8 byte escaped. */
const watBytes = (text: string) => [...new TextEncoder().encode(text)].map((b) => `\\${b.toString(16).padStart(2, '0')}`).join('');

interface AnsweringOptions {
  startMillions?: number;
  raw?: boolean;
  loopsAfter?: number;
  costlyStart?: number;
}

/**
 * A core module (Extism's ABI) whose `validate` and `mutate` both answer `output` as JSON; with
 * `startMillions`, its start function first spins that many million loop turns (a policy slow
 * only to instantiate); with `loopsAfter`, it loops forever from that many calls on (each
 * instance counts its own); with `costlyStart`, its start function burns that many million units
 * of the inline lane's fuel while running in microseconds (a loop whose large body is never
 * entered). Written as text (it needs imports and a data segment), assembled by jco.
 */
export async function answering(output: unknown, { startMillions, raw, loopsAfter, costlyStart }: AnsweringOptions = {}): Promise<Uint8Array> {
  const { parse } = await import('@bytecodealliance/jco');
  // raw: `output` is the answer's text as is (a value JSON.stringify cannot write, too deep).
  const text = raw ? String(output) : JSON.stringify(output);
  const bytes = new TextEncoder().encode(text);
  const data = watBytes(text);
  const counted = loopsAfter === undefined ? '' : `
    (global.set $calls (i32.add (global.get $calls) (i32.const 1)))
    (if (i32.gt_u (global.get $calls) (i32.const ${loopsAfter})) (then (loop $l (br $l))))`;
  const body = `(local $o i64) (local $i i32)${counted}
    (local.set $o (call $alloc (i64.const ${bytes.length})))
    (block $done (loop $next
      (br_if $done (i32.ge_u (local.get $i) (i32.const ${bytes.length})))
      (call $store (i64.add (local.get $o) (i64.extend_i32_u (local.get $i))) (i32.load8_u (local.get $i)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $next)))
    (call $output (local.get $o) (i64.const ${bytes.length}))
    (i32.const 0)`;
  const start = startMillions === undefined ? '' : `
    (func $turns (param $n i32) (local $i i32)
      (loop $l (local.set $i (i32.add (local.get $i) (i32.const 1))) (br_if $l (i32.lt_u (local.get $i) (local.get $n)))))
    (func $spin (local $j i32)
      (block $done (loop $l
        (br_if $done (i32.ge_u (local.get $j) (i32.const ${Math.round(startMillions)})))
        (call $turns (i32.const 1000000))
        (local.set $j (i32.add (local.get $j) (i32.const 1))) (br $l))))
    (start $spin)`;
  const costly = costlyStart === undefined ? '' : `
    (func $costly (local $i i32)
      (loop $l
        (if (i32.eq (local.get $i) (i32.const -1)) (then ${'nop '.repeat(10_000)}))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br_if $l (i32.lt_u (local.get $i) (i32.const ${costlyStart * 100})))))
    (start $costly)`;
  return parse(`(module
    (import "extism:host/env" "alloc" (func $alloc (param i64) (result i64)))
    (import "extism:host/env" "store_u8" (func $store (param i64 i32)))
    (import "extism:host/env" "output_set" (func $output (param i64 i64)))
    (memory (export "memory") ${Math.ceil((bytes.length + 1) / 65536)})
    (data (i32.const 0) "${data}")
    (global $calls (mut i32) (i32.const 0))${start}${costly}
    (func (export "validate") (result i32) ${body})
    (func (export "mutate") (result i32) ${body}))`);
}

/** A policy slow only to instantiate: its start function spins `millions` million loop turns, then it allows. */
export function slowStart(millions: number): Promise<Uint8Array> {
  return answering({ outcome: 'allow' }, { startMillions: millions });
}


/**
 * A core module whose `validate` makes context reads the way a hand-written module could.
 * `legacy`: the request copied into Extism kernel memory and read `times` times with
 * `portcullis_context_read`, the answers never freed. `oneCopy`: one `portcullis_context_call`
 * naming `length` bytes at `at` (the request sits at 0), then `portcullis_context_answer` into
 * `answerAt` (i64 parameters when `wide`). Neither writes an output.
 */
export async function contextReading(request: string, how:
  | { legacy: { times: number } }
  | { oneCopy: { at: number; length: number; answerAt: number; wide?: boolean } }): Promise<Uint8Array> {
  const { parse } = await import('@bytecodealliance/jco');
  const length = new TextEncoder().encode(request).length;
  // `wide`: the pair declared with i64 parameters, as a hand-written module could.
  const int = 'oneCopy' in how && how.oneCopy.wide ? 'i64' : 'i32';
  const body = 'legacy' in how
    ? `(local $o i64) (local $i i32)
      (local.set $o (call $alloc (i64.const ${length})))
      (block $done (loop $next
        (br_if $done (i32.ge_u (local.get $i) (i32.const ${length})))
        (call $store (i64.add (local.get $o) (i64.extend_i32_u (local.get $i))) (i32.load8_u (local.get $i)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next)))
      (local.set $i (i32.const 0))
      (block $done (loop $next
        (br_if $done (i32.ge_u (local.get $i) (i32.const ${how.legacy.times})))
        (drop (call $read (local.get $o)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next)))
      (i32.const 0)`
    : `(drop (call $call (${int}.const ${how.oneCopy.at}) (${int}.const ${how.oneCopy.length})))
      (call $answer (${int}.const ${how.oneCopy.answerAt}))
      (i32.const 0)`;
  return parse(`(module
    (import "extism:host/env" "alloc" (func $alloc (param i64) (result i64)))
    (import "extism:host/env" "store_u8" (func $store (param i64 i32)))
    (import "extism:host/user" "portcullis_context_read" (func $read (param i64) (result i64)))
    (import "extism:host/user" "portcullis_context_call" (func $call (param ${int} ${int}) (result i32)))
    (import "extism:host/user" "portcullis_context_answer" (func $answer (param ${int})))
    (memory (export "memory") 1)
    (data (i32.const 0) "${watBytes(request)}")
    (func (export "validate") (result i32) ${body}))`);
}
