// Bounds how large a policy's function bodies are, and how deeply they nest blocks. V8 compiles
// a function lazily, in the worker, on its first call, and its compilers' memory grows with the
// nesting depth (about 650 bytes a level, outside every heap limit) and with the body's size: a
// 26 MB module of four functions with 2.3 million nested `block`s each took 1.5 GB per call, and
// terminated workers released it only seconds later; one 7.6 MB body took 2 GB in TurboFan
// (red teams). Depth is not visible without decoding every instruction, so this walks the code
// section once, instruction by instruction, and refuses a body larger than MAX_BODY_BYTES,
// nested deeper than MAX_NESTING, or holding an instruction it cannot decode (it knows the MVP
// and the standard extensions V8 ships: bulk memory, reference types, SIMD, threads, exceptions,
// tail calls). What else makes a compiler run away is left to the compile trial.
import { PortcullisError } from '../errors.ts';
import { readLeb } from './memory-cap.ts';

/** Toolchains nest a few hundred levels at most; this leaves room and caps the compiler's memory. */
export const MAX_NESTING = 10_000;

/**
 * The largest function body a policy may have. V8's optimising compiler takes memory in step
 * with a function's size (red team: 2 GB for a 7.6 MB body, on a background thread after the
 * call), and the compile trial allows a large module's code room to grow with its size, so one
 * large function must not hide there. Real toolchains stay far below: 53 KiB in QuickJS, 168 KiB
 * in SpiderMonkey (componentize-js).
 */
export const MAX_BODY_BYTES = 512 * 1024;

class CodeWalkError extends PortcullisError {
  constructor(message: string) {
    super('MODULE_REFUSED', message);
  }
}

/** A cursor over a span of a module (one function body, one section); every read is bounded by `end`. */
export class Reader {
  at: number;
  readonly bytes: Uint8Array;
  readonly end: number;
  constructor(bytes: Uint8Array, start: number, end: number) {
    this.bytes = bytes;
    this.at = start;
    this.end = end;
  }

  byte(): number {
    if (this.at >= this.end) throw new CodeWalkError('a function body or section ends in the middle of an entry');
    return this.bytes[this.at++]!;
  }

  leb(): number {
    const [value, length] = readLeb(this.bytes, this.at, this.end);
    this.at += length;
    return value;
  }

  skip(count: number): void {
    if (this.at + count > this.end) throw new CodeWalkError('a function body ends in the middle of an instruction');
    this.at += count;
  }

  /** A value type, with the heap type of `(ref ...)`/`(ref null ...)`. */
  valueType(): void {
    const type = this.byte();
    if (type === 0x63 || type === 0x64) this.leb();
  }

  /** A block type: empty (0x40), one value type, or a type index (a positive s33). */
  blockType(): void {
    const first = this.bytes[this.at];
    if (first === 0x40) this.at++;
    else if (first === 0x63 || first === 0x64 || (first !== undefined && first >= 0x6a && first <= 0x7f)) this.valueType();
    else this.leb();
  }

  memarg(): void {
    const align = this.leb();
    if (align & 0x40) this.leb(); // multi-memory: a memory index follows
    this.leb();
  }
}

/**
 * What metering.ts needs to give a module a deadline of its own, noted by the same walk: per
 * function body, where its code starts, what each stretch of straight-line code can cost, and
 * where the instructions whose cost depends on an operand are.
 */
export interface CodeMeter {
  /** Functions the module imports (host functions): a `call` below this index leaves the guest. */
  importedFunctions: number;
  bodies: BodyPlan[];
  /** It uses an atomic instruction (`memory.atomic.wait` can block its thread). */
  atomics: boolean;
}

export interface BodyPlan {
  /** Where its local declarations start (just past the body's size). */
  start: number;
  /** Where its instructions start. */
  codeStart: number;
  end: number;
  /** Locals it declares (not counting parameters). */
  declaredLocals: number;
  /**
   * Charges to insert: at the body's first instruction (the first entry) and just past each
   * `loop`'s block type. Each is the most that can run before control passes the next charge: the
   * instructions of the function (or loop) outside any loop nested in it, a host call counting
   * HOST_CALL_COST and a few RUNTIME_COST; a function's entry also counts its locals, which V8
   * zeroes on every call. Only `loop` branches backwards, so nothing runs twice without passing one.
   */
  charges: { at: number; cost: number }[];
  /** Bulk instructions (their first byte), charged by their count operand shifted left by `shift`. */
  bulk: { at: number; shift: number; cap?: number }[];
}

/**
 * What a call to a host function is charged: about what one costs, in instructions. An indirect
 * call (call_indirect, call_ref) is charged the same, since it may land on a host function
 * placed in a table or taken with ref.func (red team: 1 unit a call_ref to var_get held the main
 * thread 11.5 s).
 */
export const HOST_CALL_COST = 1000;
/**
 * Instructions V8 runs in its runtime rather than in compiled code, charged as a few hundred:
 * memory.grow, table.get/set, throw, data.drop and the table operations (red team: memory.grow
 * by 0 pages, charged as one instruction, took 0.6 s of 10 million units).
 */
export const RUNTIME_COST = 200;
/** The most pages a memory.grow is charged for (16 MiB; the inline lane caps memory at 8 MiB), and 256 times that many table entries. */
export const GROW_CAP = 256;
/** Extra charge per opcode (RUNTIME_COST, HOST_CALL_COST); 0xfc operations are charged in miscInstruction. */
const OPCODE_COST = new Uint16Array(256);
for (const op of [0x08, 0x09, 0x0a]) OPCODE_COST[op] = RUNTIME_COST; // throw, rethrow, throw_ref
OPCODE_COST[0x25] = OPCODE_COST[0x26] = OPCODE_COST[0xd2] = 2 * RUNTIME_COST; // table.get, table.set, ref.func (0.3-0.5 µs each)
// call_indirect, return_call_indirect, call_ref, return_call_ref, and memory.grow (0.9 µs even by 0 pages)
for (const op of [0x11, 0x13, 0x14, 0x15, 0x40]) OPCODE_COST[op] = HOST_CALL_COST;

/** Walks the code section (id 10) between `start` and `end`; with `meter`, notes where to charge (see CodeMeter). */
export function checkCodeSection(bytes: Uint8Array, start: number, end: number, meter?: CodeMeter): void {
  const [count, countLength] = readLeb(bytes, start, end);
  if (count > end - start) throw new CodeWalkError(`the code section claims ${count} bodies in ${end - start} bytes`);
  let at = start + countLength;
  for (let i = 0; i < count; i++) {
    const [size, sizeLength] = readLeb(bytes, at, end);
    const bodyStart = at + sizeLength;
    const bodyEnd = bodyStart + size;
    if (bodyEnd > end) throw new CodeWalkError(`function body ${i} runs past the code section`);
    if (size > MAX_BODY_BYTES) {
      throw new CodeWalkError(`function body ${i} is ${size} bytes; a policy's functions may be at most ${MAX_BODY_BYTES / 1024} KiB (${MAX_BODY_BYTES} bytes) each, ` +
        'since compiling one takes memory in step with its size (toolchains make them far smaller)');
    }
    checkBody(new Reader(bytes, bodyStart, bodyEnd), i, meter);
    at = bodyEnd;
  }
}

/** Which open blocks are loops, by depth (metering only). One walk runs at a time. */
const loopAt = new Uint8Array(MAX_NESTING + 2);
/** For each open loop, by depth, the charge that was current when it opened (it is again when the loop ends). */
const outerCharge = new Uint32Array(MAX_NESTING + 2);

function checkBody(r: Reader, index: number, meter?: CodeMeter): void {
  const start = r.at;
  const groups = r.leb();
  if (groups > r.end - r.at) throw new CodeWalkError(`function body ${index} claims ${groups} local groups`);
  let declaredLocals = 0;
  for (let g = 0; g < groups; g++) {
    declaredLocals += r.leb();
    r.valueType();
  }
  // The entry's charge counts the locals too: V8 zeroes them on every call.
  const plan: BodyPlan | undefined = meter
    ? { start, codeStart: r.at, end: r.end, declaredLocals, charges: [{ at: r.at, cost: declaredLocals }], bulk: [] }
    : undefined;
  // The charge the instruction being read counts towards: the innermost open loop's, or the entry's.
  let charge = 0;
  // The body is itself a block: its final `end` brings the depth to zero.
  let depth = 1;
  if (plan) loopAt[1] = 0;
  while (r.at < r.end) {
    const opAt = r.at;
    const op = r.byte();
    if (plan) plan.charges[charge]!.cost += 1 + OPCODE_COST[op]!;
    switch (op) {
      case 0x02: case 0x03: case 0x04: case 0x06: case 0x1f: // block, loop, if, try, try_table
        r.blockType();
        if (op === 0x1f) skipCatchClauses(r);
        if (++depth > MAX_NESTING) {
          throw new CodeWalkError(`function body ${index} nests blocks more than ${MAX_NESTING} deep; compiling it would take the host's memory`);
        }
        if (plan) {
          loopAt[depth] = op === 0x03 ? 1 : 0;
          if (op === 0x03) {
            outerCharge[depth] = charge;
            charge = plan.charges.length;
            plan.charges.push({ at: r.at, cost: 0 });
          }
        }
        break;
      case 0x0b: // end
        if (plan && loopAt[depth] === 1) charge = outerCharge[depth]!;
        depth--;
        break;
      case 0x18: // delegate: ends a try
        r.leb();
        depth--;
        break;
      case 0x00: case 0x01: case 0x05: case 0x0a: case 0x0f: case 0x19: case 0x1a: case 0x1b:
      case 0xd1: case 0xd3: case 0xd4:
        break;
      case 0x10: case 0x12: { // call, return_call
        const callee = r.leb();
        if (plan && callee < meter!.importedFunctions) plan.charges[charge]!.cost += HOST_CALL_COST;
        break;
      }
      case 0x40: // memory.grow: by pages, which the kernel zeroes as they are first touched (~4 µs each)
        r.leb();
        // A grow past the memory's maximum fails (-1) at once, whatever it asked: charged as at most
        // GROW_CAP pages, so that it fails as in the module as it came instead of trapping.
        plan?.bulk.push({ at: opAt, shift: 12, cap: GROW_CAP });
        break;
      case 0x07: case 0x08: case 0x09: case 0x0c: case 0x0d: case 0x14: case 0x15:
      case 0x20: case 0x21: case 0x22: case 0x23: case 0x24: case 0x25: case 0x26:
      case 0x3f: case 0x41: case 0x42: case 0xd2: case 0xd5: case 0xd6:
        r.leb();
        break;
      case 0x0e: { // br_table
        const labels = r.leb();
        for (let l = 0; l <= labels; l++) r.leb();
        break;
      }
      case 0x11: case 0x13: // call_indirect, return_call_indirect
        r.leb();
        r.leb();
        break;
      case 0x1c: { // select with types
        const types = r.leb();
        for (let t = 0; t < types; t++) r.valueType();
        break;
      }
      case 0x43:
        r.skip(4);
        break;
      case 0x44:
        r.skip(8);
        break;
      case 0xd0: // ref.null heaptype
        r.leb();
        break;
      case 0xfb:
        gcInstruction(r, index);
        break;
      case 0xfc: {
        const { shift, cost } = miscInstruction(r, index);
        if (plan) {
          plan.charges[charge]!.cost += cost;
          if (shift !== undefined) plan.bulk.push(shift === 3 ? { at: opAt, shift, cap: GROW_CAP * 256 } : { at: opAt, shift });
        }
        break;
      }
      case 0xfd:
        simdInstruction(r);
        break;
      case 0xfe:
        atomicInstruction(r);
        if (meter) meter.atomics = true;
        break;
      default:
        if (op >= 0x28 && op <= 0x3e) r.memarg();
        else if (op >= 0x45 && op <= 0xc4) break;
        else throw unknown(index, op, r.at - 1);
    }
  }
  if (depth !== 0) throw new CodeWalkError(`function body ${index} does not end where its size says`);
  if (plan) meter!.bodies.push(plan);
}

/** try_table's catch clauses: a kind, a tag for `catch` and `catch_ref`, then a label. */
function skipCatchClauses(r: Reader): void {
  const catches = r.leb();
  for (let c = 0; c < catches; c++) {
    const kind = r.byte();
    if (kind === 0x00 || kind === 0x01) r.leb();
    r.leb();
  }
}

function unknown(index: number, op: number, at: number, sub?: number): CodeWalkError {
  const code = sub === undefined ? `0x${op.toString(16)}` : `0x${op.toString(16)} ${sub}`;
  return new CodeWalkError(`function body ${index} uses instruction ${code} (byte ${at}), which the host does not accept in a policy`);
}

/** Only the GC instructions valid without struct or array types (those types are refused). */
function gcInstruction(r: Reader, index: number): void {
  const sub = r.leb();
  if (sub >= 0x14 && sub <= 0x17) r.leb(); // ref.test, ref.cast: a heap type
  else if (sub === 0x18 || sub === 0x19) { // br_on_cast(_fail): flags, label, two heap types
    r.byte();
    r.leb();
    r.leb();
    r.leb();
  } else if (sub < 0x1a || sub > 0x1e) throw unknown(index, 0xfb, r.at, sub); // i31 and extern/any conversions have no immediates
}

/**
 * Reads one 0xfc instruction: its extra charge, and for a bulk one by how many bits to shift its
 * count (bytes, or entries of 8 bytes) into a charge of its own.
 */
function miscInstruction(r: Reader, index: number): { shift?: number; cost: number } {
  const sub = r.leb();
  if (sub <= 7) return { cost: 0 }; // saturating truncations
  switch (sub) {
    case 8: case 10: case 12: case 14: // memory.init, memory.copy, table.init, table.copy
      r.leb();
      r.leb();
      return sub === 10 ? { shift: 0, cost: 20 } : sub === 8 ? { shift: 0, cost: 50 } : { shift: 3, cost: RUNTIME_COST };
    case 11: case 15: case 17: // memory.fill, table.grow, table.fill
      r.leb();
      return sub === 11 ? { shift: 0, cost: 20 } : { shift: 3, cost: sub === 15 ? HOST_CALL_COST : RUNTIME_COST };
    case 9: case 13: // data.drop, elem.drop
      r.leb();
      return { cost: RUNTIME_COST };
    case 16: // table.size
      r.leb();
      return { cost: 0 };
    default:
      throw unknown(index, 0xfc, r.at, sub);
  }
}

function simdInstruction(r: Reader): void {
  const sub = r.leb();
  if (sub <= 11 || sub === 92 || sub === 93) r.memarg(); // loads, stores, load_zero
  else if (sub === 12 || sub === 13) r.skip(16); // v128.const, i8x16.shuffle
  else if (sub >= 21 && sub <= 34) r.skip(1); // extract/replace lane
  else if (sub >= 84 && sub <= 91) { // load/store lane
    r.memarg();
    r.skip(1);
  }
  // Every other SIMD and relaxed-SIMD instruction has no immediate.
}

function atomicInstruction(r: Reader): void {
  const sub = r.leb();
  if (sub === 0x03) r.skip(1); // atomic.fence
  else r.memarg();
}
