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

/**
 * Raised whenever the walk refuses more than before: a pass recorded on disk under an older
 * revision is not trusted (prepare.ts walkRecord).
 */
export const CODE_WALK_REVISION = 1;

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
  /**
   * Functions the host calls (exports, the start function), by function index: they keep the
   * charge at their entry (foldCalls), so that nothing runs before the host sets the counter.
   */
  entries: ReadonlySet<number>;
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
   * `loop`'s block type. Only `loop` branches backwards, so nothing runs twice without passing
   * one. Each charge is the most one pass can run of the code it covers (the function, or the
   * loop's body, outside the loops nested in it): its longest path, a host call counting
   * HOST_CALL_COST and a few RUNTIME_COST, an exception handler entered at the most its `try`
   * body can have cost; a function's entry also counts its locals, which V8 zeroes on every call.
   * It was the sum of all that code: an interpreter's dispatch loop (QuickJS) was charged every
   * opcode's handler on each opcode, 10.7 million units for a 60 µs call.
   */
  charges: Charge[];
  /** Bulk instructions (their first byte), charged by their count operand shifted left by `shift`. */
  bulk: { at: number; shift: number; cap?: number }[];
  /** The functions this body calls directly (`call`, `return_call`), by body index, one entry per call site: the module's own, not imports. */
  calls: number[];
  /** For each of `calls`, the index of the charge whose code holds it. */
  callCharges: number[];
  /** Charged by its callers instead of at its entry (foldCalls): it has no charge of its own. */
  folded: boolean;
}

export interface Charge {
  at: number;
  cost: number;
  /** What the folded functions its code calls cost, summed over the call sites (foldCalls). */
  foldedCost: number;
  /** Indirect calls in its code (call_indirect, call_ref), each of which may land on a folded function. */
  indirect: number;
}

/**
 * The most a function may cost, with the functions it calls (folded themselves), to be charged
 * by its callers instead of at its own entry (foldCalls). Small: a folded call on a path rarely
 * taken is charged on every pass all the same (the charge is the longest path), and the
 * AssemblyScript example gained as much from folding functions up to 50 as up to 1,000.
 * IT MUST STAY BELOW HOST_CALL_COST: an indirect call (or a host call, which may call back into
 * the guest) then costs more than a folded function may, so no folded function makes one, and
 * none can reach itself again but through a direct call, which foldCalls sees (review: at 2,000,
 * a folded function calling itself through its table recursed with no charge). A test holds it.
 */
export const FOLD_MAX_COST = 100;
/**
 * The most folded work one charge may pay for in advance: its folded calls' costs summed over
 * their call sites, and FOLD_MAX_COST for each indirect call. The host looks at the clock only
 * when a charge runs the counter dry, and the work a charge pays for runs unlooked-at: red team
 * (fold 1): one body of 125,000 calls of a folded pointer chase held the main thread 3.9 s on one
 * charge. Unfolded, the unlooked-at work of a charge is its own code's, about a unit a byte.
 */
export const FOLD_REGION_MAX = 100_000;

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
/**
 * A table operation's count is charged shifted left by this: 64 units an entry. V8 runs them in
 * its runtime, and funcref entries are dear: red team (session 50), table.fill of 65,536 refs to
 * an imported host function took ~17 ms (~260 ns an entry), so at 8 units an entry two ran on a
 * slice of fuel: ~34 ms between two looks at the clock, as long as the worst code the lane's
 * bounds are set by (a pointer chase). At 64, a slice pays for ~4 ms of them; one operation runs
 * whole between looks (the refill grants it its slices at once), which the size of a metered
 * module's tables bounds (metering.ts MAX_METERED_TABLE_ENTRIES).
 */
export const TABLE_ENTRY_SHIFT = 6;
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
    const plan = checkBody(new Reader(bytes, bodyStart, bodyEnd), i, meter);
    if (plan) meter!.bodies.push(plan);
    at = bodyEnd;
  }
  if (meter) foldCalls(bytes, meter);
}

/**
 * Charges small functions without loops at their callers, as part of the caller's path, instead
 * of at their own entry: a charge is a load, a store and a test, and compiled AssemblyScript and
 * QuickJS call many such helpers (measured: the entry charges of loop-free functions were about
 * 10 of the 26 µs metering added to an AssemblyScript call, issue 14). A folded function runs a
 * bounded path (no loop; what it calls directly is folded too, or charges itself), so the charge
 * of the code that calls it, raised by its cost, still covers everything that runs before the
 * next charge. Recursion is what an entry charge stops without a loop: among loop-free functions
 * that call each other in a cycle, one of each cycle keeps its charge (a depth-first search's
 * back edges point at them; without them no cycle is left; a folded function makes no indirect or
 * host call, see FOLD_MAX_COST). A function that costs more than FOLD_MAX_COST keeps its own too
 * (an indirect call elsewhere, charged HOST_CALL_COST, covers whichever folded function it lands
 * on), and so do the functions the host calls (CodeMeter.entries), and those called where a
 * charge would pay for more than FOLD_REGION_MAX. Each body whose costs change is walked again,
 * callees first, with the folded costs known.
 */
function foldCalls(bytes: Uint8Array, meter: CodeMeter): void {
  const unfolded = meter.bodies.slice();
  // An indirect call may land on any folded function: a charge with many of them (before any
  // folding, the only thing paysTooMuch counts) would pay for more unlooked-at work than
  // FOLD_REGION_MAX. Which functions a table holds is not read here, so such a module folds nothing.
  if (unfolded.some((plan) => plan.charges.some(paysTooMuch))) return;
  const keeps = new Uint8Array(unfolded.length);
  for (let f = 0; f < unfolded.length; f++) if (meter.entries.has(meter.importedFunctions + f)) keeps[f] = 1;
  // Folding fewer functions only lowers what each charge pays for, and a charge that paid too
  // much has all its folded callees kept, paying nothing for folded calls in the next round: one
  // more round settles it. The bound is for safety's sake (then nothing is folded).
  for (let round = 0; round < 4; round++) {
    meter.bodies = unfolded.slice();
    const cost = foldOnce(bytes, meter, keeps);
    let over = false;
    for (const plan of meter.bodies) {
      // A folded body has no charge; what it calls is in its own cost, at most FOLD_MAX_COST.
      if (plan.folded) continue;
      plan.calls.forEach((g, site) => {
        if (cost[g]! > 0 && paysTooMuch(plan.charges[plan.callCharges[site]!]!)) {
          keeps[g] = 1;
          over = true;
        }
      });
    }
    if (!over) return;
  }
  meter.bodies = unfolded;
}

/**
 * One folding of the module's functions but `keeps`: replaces meter.bodies' plans (folded ones
 * by copies, walked-again ones by new plans) and returns what a direct call of each costs its
 * caller's charge (0: it charges itself).
 */
function foldOnce(bytes: Uint8Array, meter: CodeMeter, keeps: Uint8Array): Float64Array {
  const bodies = meter.bodies;
  const count = bodies.length;
  // An index past the bodies is the compiler's to refuse; here it is a function that is not folded.
  const loopFree = (f: number) => bodies[f]?.charges.length === 1;
  const onCycle = new Uint8Array(count);
  // Post-order over the loop-free functions: every callee that is not on the search's stack
  // finishes before its caller. A callee found on the stack closes a cycle: it keeps its charge.
  const state = new Uint8Array(count); // 0: not seen, 1: on the stack, 2: finished
  const order: number[] = [];
  for (let root = 0; root < count; root++) {
    if (state[root] !== 0 || !loopFree(root)) continue;
    state[root] = 1;
    const stack: number[] = [root];
    const next: number[] = [0];
    while (stack.length > 0) {
      const top = stack.length - 1;
      const f = stack[top]!;
      const calls = bodies[f]!.calls;
      if (next[top]! < calls.length) {
        const g = calls[next[top]!++]!;
        if (!loopFree(g)) continue;
        if (state[g] === 1) onCycle[g] = 1;
        else if (state[g] === 0) {
          state[g] = 1;
          stack.push(g);
          next.push(0);
        }
      } else {
        stack.pop();
        next.pop();
        state[f] = 2;
        order.push(f);
      }
    }
  }
  const cost = new Float64Array(count);
  const walked = new Uint8Array(count);
  const rewalk = (f: number): void => {
    const plan = bodies[f]!;
    bodies[f] = checkBody(new Reader(bytes, plan.start, plan.end), f, meter, cost)!;
    walked[f] = 1;
  };
  for (const f of order) {
    if (keeps[f] || onCycle[f]) continue;
    if (bodies[f]!.calls.some((g) => cost[g]! > 0)) rewalk(f);
    const plan = bodies[f]!;
    const entry = plan.charges[0]!.cost;
    if (entry > FOLD_MAX_COST) continue;
    cost[f] = entry;
    // A copy: the plan of the first walk is kept for a round that folds less.
    bodies[f] = { ...plan, charges: [], folded: true };
  }
  for (let f = 0; f < count; f++) {
    if (!walked[f] && !bodies[f]!.folded && bodies[f]!.calls.some((g) => cost[g]! > 0)) rewalk(f);
  }
  return cost;
}

/** Whether a charge pays in advance for more folded work than FOLD_REGION_MAX (its indirect calls counted at the most a folded function costs). */
function paysTooMuch(charge: Charge): boolean {
  return charge.foldedCost + charge.indirect * FOLD_MAX_COST > FOLD_REGION_MAX;
}

/** A charge at `at`, of `cost` so far. */
function newCharge(at: number, cost: number): Charge {
  return { at, cost, foldedCost: 0, indirect: 0 };
}

// Metering's walk state, by block depth (the body itself is depth 1). One walk runs at a time.
const BLOCK = 0;
const LOOP = 1;
const IF = 2;
const TRY = 3;
const TRY_TABLE = 4;
const BODY = 5;
/** No path reaches this point (after `br`, `return`, `throw`...), or no branch targets this label. */
const NONE = -1;
const kindAt = new Uint8Array(MAX_NESTING + 2);
/** How many loops were open when the block opened: whose charge covers the code after its `end`. */
const levelAt = new Uint32Array(MAX_NESTING + 2);
/** The most any branch to the block's end had cost (NONE: no branch). */
const labelCost = new Float64Array(MAX_NESTING + 2);
/** `if`: the cost at the `if` (its false path). Legacy `try`: the most its body and handlers cost at their ends. */
const savedCost = new Float64Array(MAX_NESTING + 2);
/** `if`: the cost at the end of its `then` arm once `else` is seen, else NONE - 1. */
const thenCost = new Float64Array(MAX_NESTING + 2);
/** `try`, `try_table`: the most anything in its body cost (where an exception leaves it), and the try open around it. */
const tryCost = new Float64Array(MAX_NESTING + 2);
const outerTry = new Int32Array(MAX_NESTING + 2);
/** `loop`: the charge that was current when it opened (it is again when the loop ends), and the innermost try then. */
const outerCharge = new Uint32Array(MAX_NESTING + 2);
/** By loop level: what the enclosing level's path had cost when this level's loop was entered. */
const entryCost = new Float64Array(MAX_NESTING + 2);
/** `try_table`: the depths of the blocks its catch clauses branch to. */
const catchTargets: number[][] = [];

/**
 * Walks one body; with `meter`, returns where to charge it. `callCost`: by body index, what a
 * direct call of each costs on the caller's path besides the call itself (foldCalls; 0 for a
 * function that charges itself).
 */
function checkBody(r: Reader, index: number, meter?: CodeMeter, callCost?: Float64Array): BodyPlan | undefined {
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
    ? { start, codeStart: r.at, end: r.end, declaredLocals, charges: [newCharge(r.at, declaredLocals)], bulk: [], calls: [], callCharges: [], folded: false }
    : undefined;
  // The charge the code being read counts towards: the innermost open loop's, or the entry's.
  let charge = 0;
  // The body is itself a block: its final `end` brings the depth to zero.
  let depth = 1;
  // Metering: open loops, what the path to here has cost since the current charge (NONE when
  // nothing reaches here), and the innermost open try of this loop level (0: none).
  let level = 0;
  let cost = declaredLocals;
  let activeTry = 0;
  if (plan) {
    kindAt[1] = BODY;
    levelAt[1] = 0;
  }
  /** A branch from here to the block at `target`: the code after that block's end is reached having cost this much. */
  const branch = (target: number, value = cost): void => {
    if (target < 1) throw new CodeWalkError(`function body ${index} branches out of its own body`);
    if (value === NONE || kindAt[target] === LOOP || kindAt[target] === BODY) return; // a loop's head, a return: a path's end
    // The target's code counts towards an outer loop's charge, whose path got no further than
    // where it entered the loop holding this branch.
    const at = levelAt[target] === level ? value : entryCost[levelAt[target]! + 1]!;
    if (at > labelCost[target]!) labelCost[target] = at;
  };
  /** `units` more on the path; the charge covers the most any path reaches. */
  const add = (units: number): void => {
    if (cost === NONE) return;
    cost += units;
    if (cost > plan!.charges[charge]!.cost) plan!.charges[charge]!.cost = cost;
    if (activeTry !== 0 && cost > tryCost[activeTry]!) tryCost[activeTry] = cost;
  };
  while (r.at < r.end) {
    const opAt = r.at;
    const op = r.byte();
    if (plan) add(1 + OPCODE_COST[op]!);
    switch (op) {
      case 0x02: case 0x03: case 0x04: case 0x06: case 0x1f: { // block, loop, if, try, try_table
        r.blockType();
        const catches = op === 0x1f ? readCatchClauses(r, depth, index) : undefined;
        if (++depth > MAX_NESTING) {
          throw new CodeWalkError(`function body ${index} nests blocks more than ${MAX_NESTING} deep; compiling it would take the host's memory`);
        }
        if (plan) {
          kindAt[depth] = op === 0x02 ? BLOCK : op === 0x03 ? LOOP : op === 0x04 ? IF : op === 0x06 ? TRY : TRY_TABLE;
          levelAt[depth] = level;
          labelCost[depth] = NONE;
          if (op === 0x03) {
            entryCost[level + 1] = cost;
            outerCharge[depth] = charge;
            outerTry[depth] = activeTry;
            charge = plan.charges.length;
            plan.charges.push(newCharge(r.at, 0));
            level++;
            activeTry = 0;
            cost = 0;
          } else if (op === 0x04) {
            savedCost[depth] = cost;
            thenCost[depth] = NONE - 1;
          } else if (op === 0x06 || op === 0x1f) {
            savedCost[depth] = NONE;
            tryCost[depth] = cost;
            outerTry[depth] = activeTry;
            activeTry = depth;
            if (catches) catchTargets[depth] = catches;
          }
        }
        break;
      }
      case 0x0b: // end
        if (plan) endBlock(depth);
        depth--;
        break;
      case 0x18: // delegate: ends a try, its exceptions handled further out
        r.leb();
        if (plan) endBlock(depth);
        depth--;
        break;
      case 0x05: // else
        if (plan) {
          if (kindAt[depth] !== IF) throw new CodeWalkError(`function body ${index} has an \`else\` outside an \`if\``);
          thenCost[depth] = cost;
          cost = savedCost[depth]!;
        }
        break;
      case 0x07: case 0x19: // catch tag, catch_all: the legacy form of exception handling
        // Its handler holds the caught exception (for `rethrow`) on the worker's JavaScript heap,
        // outside every cap, and a handler that calls its function again holds one per frame
        // (red team: 14,000 frames of 64 KiB exceptions, 1.28 GB of host RSS from a 3 KB module).
        // try_table's catch and catch_all hold nothing; toolchains we build with emit neither.
        throw new CodeWalkError(`function body ${index} catches exceptions with the legacy try/${op === 0x07 ? 'catch' : 'catch_all'}, ` +
          'which the host does not accept in a policy (a caught exception is kept outside the memory cap); build with try_table');
      case 0x00: case 0x0f: case 0x08: case 0x09: case 0x0a: // unreachable, return, throw, rethrow, throw_ref
        if (op === 0x08 || op === 0x09) r.leb();
        if (plan) cost = NONE;
        break;
      case 0x01: case 0x1a: case 0x1b: case 0xd1: case 0xd3: case 0xd4:
        break;
      case 0x10: case 0x12: { // call, return_call
        const callee = r.leb();
        if (plan) {
          const own = callee - meter!.importedFunctions;
          if (own < 0) add(HOST_CALL_COST);
          else {
            if (callCost && callCost[own]! > 0) {
              add(callCost[own]!);
              plan.charges[charge]!.foldedCost += callCost[own]!;
            }
            plan.calls.push(own);
            plan.callCharges.push(charge);
          }
          if (op === 0x12) cost = NONE;
        }
        break;
      }
      case 0x40: // memory.grow: by pages, which the kernel zeroes as they are first touched (~4 µs each)
        r.leb();
        // A grow past the memory's maximum fails (-1) at once, whatever it asked: charged as at most
        // GROW_CAP pages, so that it fails as in the module as it came instead of trapping.
        plan?.bulk.push({ at: opAt, shift: 12, cap: GROW_CAP });
        break;
      case 0x0c: case 0x0d: case 0xd5: case 0xd6: { // br, br_if, br_on_null, br_on_non_null
        const label = r.leb();
        if (plan) {
          branch(depth - label);
          if (op === 0x0c) cost = NONE;
        }
        break;
      }
      case 0x14: case 0x15: // call_ref, return_call_ref
        r.leb();
        if (plan) plan.charges[charge]!.indirect++;
        if (plan && op === 0x15) cost = NONE;
        break;
      case 0x20: case 0x21: case 0x22: case 0x23: case 0x24: case 0x25: case 0x26:
      case 0x3f: case 0x41: case 0x42: case 0xd2:
        r.leb();
        break;
      case 0x0e: { // br_table
        const labels = r.leb();
        for (let l = 0; l <= labels; l++) {
          const label = r.leb();
          if (plan) branch(depth - label);
        }
        if (plan) cost = NONE;
        break;
      }
      case 0x11: case 0x13: // call_indirect, return_call_indirect
        r.leb();
        r.leb();
        if (plan) plan.charges[charge]!.indirect++;
        if (plan && op === 0x13) cost = NONE;
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
      case 0xfb: {
        const label = gcInstruction(r, index);
        if (plan && label !== undefined) branch(depth - label);
        break;
      }
      case 0xfc: {
        const { shift, cost: extra } = miscInstruction(r, index);
        if (plan) {
          add(extra);
          if (shift !== undefined) plan.bulk.push(shift === TABLE_ENTRY_SHIFT ? { at: opAt, shift, cap: GROW_CAP * 256 } : { at: opAt, shift });
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
  return plan;

  /** The block at `at` ends (`end`, or `delegate` for a try): where the code after it is reached from. */
  function endBlock(at: number): void {
    const kind = kindAt[at]!;
    const joined = Math.max(cost, labelCost[at]!);
    if (kind === LOOP) {
      // Past a loop, its level's path goes on from where it entered the loop.
      cost = entryCost[level]!;
      level--;
      charge = outerCharge[at]!;
      activeTry = outerTry[at]!;
    } else if (kind === IF) {
      cost = Math.max(joined, thenCost[at] === NONE - 1 ? savedCost[at]! : thenCost[at]!);
    } else if (kind === TRY || kind === TRY_TABLE) {
      const thrown = tryCost[at]!;
      activeTry = outerTry[at]!;
      if (activeTry !== 0 && thrown > tryCost[activeTry]!) tryCost[activeTry] = thrown;
      if (kind === TRY_TABLE) for (const target of catchTargets[at]!) branch(target, thrown);
      cost = Math.max(joined, savedCost[at]!);
    } else {
      cost = joined;
    }
  }
}

/**
 * try_table's catch clauses: a kind, a tag for `catch` and `catch_ref`, then a label, counted
 * from the blocks around the try_table (open to `depth`). Returns the depths they branch to.
 */
function readCatchClauses(r: Reader, depth: number, index: number): number[] {
  const catches = r.leb();
  const targets: number[] = [];
  for (let c = 0; c < catches; c++) {
    const kind = r.byte();
    // catch_ref and catch_all_ref are the only makers of an exnref: a caught exception held as a
    // value lives on the worker's (or, inline, the main thread's) JavaScript heap, outside every
    // cap, and a tag whose parameter is an exnref chains them (red team: 2.5 GB of host RSS from
    // a 5 KB module, one exception per call kept in a global). Toolchains we build with do not
    // emit them: `catch` and `catch_all` (payload values only) are enough.
    if (kind === 0x01 || kind === 0x03) {
      throw new CodeWalkError(`function body ${index} catches an exception as a value (try_table ${kind === 0x01 ? 'catch_ref' : 'catch_all_ref'}), ` +
        'which the host does not accept in a policy: exception values live outside the memory cap');
    }
    if (kind === 0x00) r.leb();
    targets.push(depth - r.leb());
  }
  return targets;
}

function unknown(index: number, op: number, at: number, sub?: number): CodeWalkError {
  const code = sub === undefined ? `0x${op.toString(16)}` : `0x${op.toString(16)} ${sub}`;
  return new CodeWalkError(`function body ${index} uses instruction ${code} (byte ${at}), which the host does not accept in a policy`);
}

/** Only the GC instructions valid without struct or array types (those types are refused). Returns the label of a branch. */
function gcInstruction(r: Reader, index: number): number | undefined {
  const sub = r.leb();
  if (sub >= 0x14 && sub <= 0x17) r.leb(); // ref.test, ref.cast: a heap type
  else if (sub === 0x18 || sub === 0x19) { // br_on_cast(_fail): flags, label, two heap types
    r.byte();
    const label = r.leb();
    r.leb();
    r.leb();
    return label;
  } else if (sub < 0x1a || sub > 0x1e) throw unknown(index, 0xfb, r.at, sub); // i31 and extern/any conversions have no immediates
  return undefined;
}

/**
 * Reads one 0xfc instruction: its extra charge, and for a bulk one by how many bits to shift its
 * count (bytes, or table entries: TABLE_ENTRY_SHIFT) into a charge of its own.
 */
function miscInstruction(r: Reader, index: number): { shift?: number; cost: number } {
  const sub = r.leb();
  if (sub <= 7) return { cost: 0 }; // saturating truncations
  switch (sub) {
    case 8: case 10: case 12: case 14: // memory.init, memory.copy, table.init, table.copy
      r.leb();
      r.leb();
      return sub === 10 ? { shift: 0, cost: 20 } : sub === 8 ? { shift: 0, cost: 50 } : { shift: TABLE_ENTRY_SHIFT, cost: RUNTIME_COST };
    case 11: case 15: case 17: // memory.fill, table.grow, table.fill
      r.leb();
      return sub === 11 ? { shift: 0, cost: 20 } : { shift: TABLE_ENTRY_SHIFT, cost: sub === 15 ? HOST_CALL_COST : RUNTIME_COST };
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
