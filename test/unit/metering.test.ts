// The fuel counter metering.ts writes into core modules: what it charges, that a guest cannot
// escape it, that it changes nothing else a module does, and which modules it leaves alone.
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { checkCodeSection, FOLD_MAX_COST, FOLD_REGION_MAX, HOST_CALL_COST, RUNTIME_COST, type CodeMeter } from '../../host/src/sandbox/code-walk.ts';
import { readLayout, readLeb } from '../../host/src/sandbox/memory-cap.ts';
import { FUEL_EXPORT, meterModule, setRefill, START_EXPORT } from '../../host/src/sandbox/metering.ts';
import { moduleKind } from '../../host/src/sandbox/module-kind.ts';
import { root, wasm } from '../helpers/policies.ts';

async function wat(text: string): Promise<Uint8Array<ArrayBuffer>> {
  const { parse } = await import('@bytecodealliance/jco');
  return new Uint8Array(await parse(text));
}

function metered(bytes: Uint8Array): Uint8Array<ArrayBuffer> {
  const result = meterModule(bytes);
  if (!('bytes' in result)) throw new Error(`not metered: ${result.unmetered}`);
  return result.bytes;
}

/** Instantiates a metered module, returning its exports and its counter. */
async function instance(bytes: Uint8Array, imports: WebAssembly.Imports = {}) {
  const made = await WebAssembly.instantiate(new WebAssembly.Module(metered(bytes)), imports);
  // A refill that grants nothing: the counter running dry traps, as a budget spent does in the lane.
  setRefill(made.exports, () => {});
  const fuel = made.exports[FUEL_EXPORT] as WebAssembly.Global;
  return { exports: made.exports as Record<string, (...args: number[]) => number>, fuel };
}

describe('metering', () => {
  it('stops a loop that never ends, where it runs, with the fuel it was given', async () => {
    const { exports, fuel } = await instance(await wat('(module (func (export "spin") (result i32) (loop $l (br $l)) (i32.const 0)))'));
    fuel.value = 100_000n;
    expect(() => exports.spin!()).toThrow(/unreachable/);
    expect(fuel.value).toBeLessThan(0n);
  });

  it('asks the host for more through the refill slot as the counter runs dry, and traps once it declines', async () => {
    const text = `(module (func (export "sum") (param $n i32) (result i32) (local $i i32) (local $s i32)
      (block $done (loop $l (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $s (i32.add (local.get $s) (local.get $i)))
        (local.set $i (i32.add (local.get $i) (i32.const 1))) (br $l)))
      (local.get $s)))`;
    const made = await WebAssembly.instantiate(new WebAssembly.Module(metered(await wat(text))));
    const fuel = made.exports[FUEL_EXPORT] as WebAssembly.Global;
    let grants = 0;
    let allowed = Infinity;
    setRefill(made.exports, () => {
      if (grants >= allowed) return;
      grants++;
      fuel.value = (fuel.value as bigint) + 1_000n;
    });
    const sum = made.exports.sum as (n: number) => number;
    fuel.value = 0n;
    expect(sum(10_000)).toBe(49_995_000);
    // About 20 units a turn, 1,000 a grant.
    expect(grants).toBeGreaterThan(100);
    expect(grants).toBeLessThan(400);
    grants = 0;
    allowed = 5;
    fuel.value = 0n;
    expect(() => sum(10_000)).toThrow(/unreachable/);
    expect(grants).toBe(5);
  });

  it('meters a module that exports nothing (a component\'s fixup, run by its start function)', async () => {
    const { exports, fuel } = await instance(await wat('(module (func $s (loop $l (br $l))) (start $s))'));
    fuel.value = 10_000n;
    expect(() => exports[START_EXPORT]!()).toThrow(/unreachable/);
  });

  it('changes no answer: a computation gives the same result, and costs about its instructions', async () => {
    const text = `(module (func (export "sum") (param $n i32) (result i32) (local $i i32) (local $s i32)
      (block $done (loop $l (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $s (i32.add (local.get $s) (i32.mul (local.get $i) (local.get $i))))
        (local.set $i (i32.add (local.get $i) (i32.const 1))) (br $l)))
      (local.get $s)))`;
    const plain = (await WebAssembly.instantiate(new WebAssembly.Module(await wat(text)))).exports as { sum: (n: number) => number };
    const { exports, fuel } = await instance(await wat(text));
    fuel.value = 10_000_000n;
    expect(exports.sum!(1000)).toBe(plain.sum(1000));
    // 1,000 turns of a loop of about 20 instructions.
    const spent = 10_000_000n - (fuel.value as bigint);
    expect(spent).toBeGreaterThan(10_000n);
    expect(spent).toBeLessThan(40_000n);
  });

  it('charges a bulk operation by its size, so one instruction cannot run for long on little fuel', async () => {
    const { exports, fuel } = await instance(await wat(`(module (memory 16)
      (func (export "fill") (param $n i32) (result i32) (memory.fill (i32.const 0) (i32.const 7) (local.get $n)) (i32.const 0)))`));
    fuel.value = 500_000n;
    expect(exports.fill!(400_000)).toBe(0);
    fuel.value = 500_000n;
    expect(() => exports.fill!(600_000)).toThrow(/unreachable/);
  });

  it('charges a table operation 64 units an entry: V8 fills funcref entries in its runtime, ~260 ns each (red team, session 50)', async () => {
    const { exports, fuel } = await instance(await wat(`(module (table $t 4096 funcref) (func $f)
      (func (export "fill") (param $n i32) (result i32) (table.fill $t (i32.const 0) (ref.func $f) (local.get $n)) (i32.const 0))
      (func (export "copy") (param $n i32) (result i32) (table.copy $t $t (i32.const 1) (i32.const 0) (local.get $n)) (i32.const 0))
      (elem declare func $f))`));
    for (const op of ['fill', 'copy'] as const) {
      fuel.value = 200_000n;
      expect(exports[op]!(3_000)).toBe(0); // 192,000 units and the instruction's own
      fuel.value = 200_000n;
      expect(() => exports[op]!(3_200)).toThrow(/unreachable/); // 204,800
    }
  });

  it('lets a grow past the maximum fail as it would unmetered, charging it as a bounded one', async () => {
    const { exports, fuel } = await instance(await wat(`(module (memory 1 4) (table $t 1 1 funcref)
      (func (export "grow") (param $n i32) (result i32) (memory.grow (local.get $n)))
      (func (export "tgrow") (param $n i32) (result i32) (table.grow $t (ref.null func) (local.get $n))))`));
    fuel.value = 10_000_000n; // 2^32 - 1 of each would be charged far more
    expect(exports.grow!(-1)).toBe(-1); // 2^32 - 1 pages: refused, not a trap
    expect(exports.tgrow!(-1)).toBe(-1);
    expect(exports.grow!(2)).toBe(1);
    expect(fuel.value).toBeGreaterThan(0n);
  });

  it('charges a host call more than an instruction', async () => {
    let calls = 0;
    const { exports, fuel } = await instance(await wat(`(module (import "env" "f" (func $f))
      (func (export "call") (param $n i32) (result i32)
        (loop $l (call $f) (local.set $n (i32.sub (local.get $n) (i32.const 1))) (br_if $l (local.get $n))) (i32.const 0)))`), { env: { f: () => { calls++; } } });
    fuel.value = BigInt(HOST_CALL_COST * 50);
    expect(() => exports.call!(1000)).toThrow(/unreachable/);
    expect(calls).toBeLessThan(50);
  });

  it('charges what V8 runs outside compiled code: an indirect call as a host call, memory.grow and table.set by hundreds, locals at entry', async () => {
    const { exports, fuel } = await instance(await wat(`(module (memory 1) (table $t 2 funcref) (type $v (func))
      (func $nop) (elem declare func $nop)
      (func $many (local i64 i64 i64 i64 i64 i64 i64 i64 i64 i64))
      (func (export "grow") (param $n i32) (result i32)
        (loop $l (drop (memory.grow (i32.const 0))) (local.set $n (i32.sub (local.get $n) (i32.const 1))) (br_if $l (local.get $n))) (i32.const 0))
      (func (export "set") (param $n i32) (result i32)
        (loop $l (table.set $t (i32.const 1) (ref.func $nop)) (local.set $n (i32.sub (local.get $n) (i32.const 1))) (br_if $l (local.get $n))) (i32.const 0))
      (func (export "indirect") (param $n i32) (result i32)
        (table.set $t (i32.const 0) (ref.func $nop))
        (loop $l (call_indirect (type $v) (i32.const 0)) (local.set $n (i32.sub (local.get $n) (i32.const 1))) (br_if $l (local.get $n))) (i32.const 0))
      (func (export "locals") (param $n i32) (result i32)
        (loop $l (call $many) (local.set $n (i32.sub (local.get $n) (i32.const 1))) (br_if $l (local.get $n))) (i32.const 0)))`));
    const spent = (name: string, turns: number) => {
      fuel.value = 10n ** 12n;
      exports[name]!(turns);
      return Number(10n ** 12n - (fuel.value as bigint)) / turns;
    };
    expect(spent('grow', 100)).toBeGreaterThanOrEqual(HOST_CALL_COST);
    expect(spent('set', 100)).toBeGreaterThanOrEqual(2 * RUNTIME_COST);
    expect(spent('indirect', 100)).toBeGreaterThanOrEqual(HOST_CALL_COST);
    expect(spent('locals', 100)).toBeGreaterThanOrEqual(10);
  });

  it('cannot be caught by the guest: catch_all does not catch the trap', async () => {
    const { exports, fuel } = await instance(await wat(`(module (tag $e)
      (func (export "hide") (result i32)
        (loop $again (block $h (try_table (catch_all $h) (loop $l (br $l)))) (br $again)) (i32.const 0)))`));
    fuel.value = 100_000n;
    expect(() => exports.hide!()).toThrow(/unreachable/);
  });

  it('stops recursion and tail calls that never return, at each function entry', async () => {
    const { exports, fuel } = await instance(await wat(`(module
      (func $tail (export "tail") (result i32) (return_call $tail))
      (func $deep (export "deep") (result i32) (call $deep)))`));
    fuel.value = 100_000n;
    expect(() => exports.tail!()).toThrow(/unreachable/);
    fuel.value = 100n;
    expect(() => exports.deep!()).toThrow(/unreachable/);
  });

  it('runs no guest code before the host sets the counter: the start function is exported, not run', async () => {
    const text = `(module (memory (export "memory") 1)
      (func $start (i32.store (i32.const 0) (i32.const 42)))
      (start $start)
      (func (export "read") (result i32) (i32.load (i32.const 0))))`;
    const { exports, fuel } = await instance(await wat(text));
    expect(fuel.value).toBe(0n);
    fuel.value = 1000n;
    expect(exports.read!()).toBe(0);
    exports[START_EXPORT]!();
    expect(exports.read!()).toBe(42);
    fuel.value = 0n;
    expect(() => exports[START_EXPORT]!()).toThrow(/unreachable/);
  });

  it('leaves alone what it cannot meter, and says why', async () => {
    const reason = async (text: string) => {
      const result = meterModule(await wat(text));
      return 'unmetered' in result ? result.unmetered : 'metered';
    };
    expect(await reason(`(module (global (export "${FUEL_EXPORT}") i32 (i32.const 0)) (func (export "f")))`)).toMatch(/exports a name of its own/);
    // One operation on a larger table would run too long between two looks at the clock (red team, session 50).
    expect(await reason('(module (table 4000 funcref) (table 97 externref) (func (export "f")))')).toBe('its tables hold 4097 entries (at most 4096 are metered)');
    expect(await reason('(module (table 4096 funcref) (func (export "f")))')).toBe('metered');
    expect(await reason('(module (func (export "hs_init")))')).toMatch(/hs_init/);
    expect(await reason('(module (memory 1 1 shared) (func (export "f") (drop (memory.atomic.notify (i32.const 0) (i32.const 1)))))')).toMatch(/atomic/);
    expect(await reason('(module (memory i64 1) (func (export "f")))')).toMatch(/64-bit/);
    // V8 copies every value a call, return or branch carries, which a charge per instruction
    // does not count (red team: 1,000 results up 50 frames, 59 ms a slice of fuel).
    const wide = (n: number) => `(module (type (func (result ${'i64 '.repeat(n)}))) (func (export "f") (block (type 0) ${'(i64.const 0) '.repeat(n)}) ${'(drop) '.repeat(n)}))`;
    expect(await reason(wide(33))).toMatch(/has 33 parameters and results \(at most 32/);
    expect(await reason(wide(32))).toBe('metered');
    expect(await reason('(module (func (export "f") (param i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32 i32)))')).toMatch(/has 33 parameters/);
  });

  it('keeps every real module valid: the examples and every core fixture', () => {
    const fixtures = join(root, 'test/fixtures/policies');
    const files = [wasm('no-delete'), wasm('added-by'), ...readdirSync(fixtures).flatMap((dir) =>
      readdirSync(join(fixtures, dir)).filter((f) => f.endsWith('.wasm')).map((f) => join(fixtures, dir, f)))];
    let checked = 0;
    for (const file of files) {
      const bytes = readFileSync(file);
      if (moduleKind(bytes) !== 'core') continue;
      const result = meterModule(bytes);
      if ('bytes' in result) {
        expect(WebAssembly.validate(result.bytes), file).toBe(true);
        checked++;
      }
    }
    expect(checked).toBeGreaterThanOrEqual(4);
  });
});

/** `n` instructions that do nothing but count (each charged one unit). */
const nops = (n: number) => Array(n).fill('(nop)').join(' ');

/**
 * Runs an exported `run` that loops until fuel stops it, each turn bumping the exported global
 * `turns` and running at least `perTurn` instructions; returns the turns made on `fuel` units.
 * A charge that missed part of a turn's code would let more turns through than the fuel pays for.
 */
async function turnsOn(text: string, fuel: number, imports: WebAssembly.Imports = {}): Promise<number> {
  const { exports, fuel: counter } = await instance(await wat(text), imports);
  counter.value = BigInt(fuel);
  expect(() => exports.run!()).toThrow(/unreachable/);
  return (exports.turns as unknown as WebAssembly.Global).value as number;
}

describe('metering charges the longest path, and every path', () => {
  const turns = '(global $turns (export "turns") (mut i32) (i32.const 0))';
  const bump = '(global.set $turns (i32.add (global.get $turns) (i32.const 1)))';

  it('charges one arm of an if per turn, not both', async () => {
    const made = await turnsOn(`(module ${turns} (func (export "run")
      (loop $l ${bump} (if (i32.const 1) (then ${nops(3000)}) (else ${nops(3000)})) (br $l))))`, 1_000_000);
    // Charged as one arm, 3,000 and a few: about 330 turns; as both arms, about 166.
    expect(made).toBeGreaterThan(300);
    expect(made).toBeLessThanOrEqual(1_000_000 / 3000);
  });

  it('charges one case of a br_table dispatch per turn, not every case', async () => {
    const cases = 40;
    let body = '(br_table ' + Array.from({ length: cases }, (_, i) => `$c${i}`).join(' ') + ' $c0 (i32.rem_u (global.get $turns) (i32.const ' + cases + ')))';
    for (let i = 0; i < cases; i++) body = `(block $c${i} ${body}) ${nops(200)} (br $l)`;
    const made = await turnsOn(`(module ${turns} (func (export "run") (loop $l ${bump} ${body})))`, 1_000_000);
    // About 210 units a turn; the sum of all cases would be 8,000 (125 turns).
    expect(made).toBeGreaterThan(3000);
    expect(made).toBeLessThanOrEqual(1_000_000 / 200);
  });

  it('charges the code before and after an inner loop to the outer loop, on every outer turn', async () => {
    const made = await turnsOn(`(module ${turns} (func (export "run") (local $i i32)
      (loop $outer ${bump} (local.set $i (i32.const 0)) ${nops(2000)}
        (loop $inner (local.set $i (i32.add (local.get $i) (i32.const 1))) (br_if $inner (i32.lt_u (local.get $i) (i32.const 1))))
        ${nops(2000)} (br $outer))))`, 600_000);
    expect(made).toBeLessThanOrEqual(600_000 / 4000);
  });

  it('charges code a branch out of an inner loop reaches, to the outer loop', async () => {
    const made = await turnsOn(`(module ${turns} (func (export "run")
      (loop $outer ${bump} ${nops(2000)} (block $out (loop $inner (br $out)) (unreachable)) ${nops(2000)} (br $outer))))`, 600_000);
    expect(made).toBeLessThanOrEqual(600_000 / 4000);
  });

  it('charges code reached by a branch to the end of an if from inside it', async () => {
    const made = await turnsOn(`(module ${turns} (func (export "run")
      (loop $l ${bump} (if (i32.const 1) (then ${nops(2000)} (br 0)) (else)) ${nops(2000)} (br $l))))`, 600_000);
    expect(made).toBeLessThanOrEqual(600_000 / 4000);
  });

  it('refuses the legacy try/catch and try/catch_all: a handler holds its exception outside the memory cap', async () => {
    await expect(turnsOn(`(module ${turns} (tag $e) (func $throw (throw $e))
      (func (export "run") (loop $l ${bump} try call $throw catch $e ${nops(3000)} end (br $l))))`, 600_000)).rejects.toThrow(/legacy try\/catch,/);
    await expect(turnsOn(`(module ${turns} (tag $e)
      (func (export "run") (loop $l ${bump} try ${nops(2000)} (throw $e) catch_all ${nops(2000)} end (br $l))))`, 600_000)).rejects.toThrow(/legacy try\/catch_all/);
  });

  it('charges the code a try_table catch clause lands on, on every turn', async () => {
    const made = await turnsOn(`(module ${turns} (tag $e) (func $throw (throw $e))
      (func (export "run") (loop $l ${bump} (block $caught (try_table (catch $e $caught) ${nops(2000)} (call $throw)) (unreachable)) ${nops(2000)} (br $l))))`, 600_000);
    expect(made).toBeLessThanOrEqual(600_000 / 4000);
  });

  it('charges a handler entered after work in its try_table body at that work too', async () => {
    const made = await turnsOn(`(module ${turns} (tag $e)
      (func (export "run") (loop $l ${bump} (block $h (try_table (catch_all $h) ${nops(2000)} (throw $e))) ${nops(2000)} (br $l))))`, 600_000);
    expect(made).toBeLessThanOrEqual(600_000 / 4000);
  });

  it('charges code past a try_table whose body ended normally, whatever its handlers do', async () => {
    const made = await turnsOn(`(module ${turns} (tag $e)
      (func (export "run") (loop $l ${bump} (block $past (block $h (try_table (catch_all $h) ${nops(2000)}) (br $past)) (unreachable)) ${nops(2000)} (br $l))))`, 600_000);
    expect(made).toBeLessThanOrEqual(600_000 / 4000);
  });

  it('charges code past an if without else whose then arm branches away', async () => {
    const made = await turnsOn(`(module ${turns} (func (export "run")
      (loop $l ${bump} (block $b (if (i32.const 0) (then (br $b))) ${nops(3000)}) (br $l))))`, 600_000);
    expect(made).toBeLessThanOrEqual(600_000 / 3000);
  });
});

describe('metering folds small loop-free functions into their callers\' charges', () => {
  const turns = '(global $turns (export "turns") (mut i32) (i32.const 0))';
  const bump = '(global.set $turns (i32.add (global.get $turns) (i32.const 1)))';

  /** Where metering would charge each body of `text` (code-walk.ts BodyPlan), as meterModule plans it. */
  async function plans(text: string) {
    const bytes = await wat(text);
    const { codeSection } = readLayout(bytes);
    const compiled = new WebAssembly.Module(bytes);
    const imported = WebAssembly.Module.imports(compiled).filter((i) => i.kind === 'function').length;
    // The host's entries, as metering.ts reads them: these modules export one function, $run, their last.
    const last = imported + countBodies(bytes, codeSection!) - 1;
    const entries = new Set(WebAssembly.Module.exports(compiled).length > 0 ? [last] : []);
    const meter: CodeMeter = { importedFunctions: imported, bodies: [], atomics: false, entries };
    checkCodeSection(bytes, codeSection!.start, codeSection!.end, meter);
    return meter.bodies;
  }

  it('gives a small helper without loops no charge of its own, and charges its cost in the loop that calls it', async () => {
    const bodies = await plans(`(module (func $helper ${nops(60)}) (func $run (export "run") (loop $l (call $helper) (br $l))))`);
    expect(bodies[0]!.folded).toBe(true);
    expect(bodies[0]!.charges).toEqual([]);
    // The loop's charge: the call, the branch, and the helper's 60 and its end.
    expect(bodies[1]!.charges[1]!.cost).toBeGreaterThanOrEqual(62);
    expect(bodies[1]!.folded).toBe(false);
  });

  it('charges a chain of folded helpers whole, on every turn', async () => {
    // $a costs 40 and calls $b, which costs 40: a turn must pay 80 and more, not the 40 of $a alone.
    const text = `(module ${turns} (func $b ${nops(40)}) (func $a ${nops(40)} (call $b))
      (func $run (export "run") (loop $l ${bump} (call $a) (br $l))))`;
    expect((await plans(text)).map((b) => b.folded)).toEqual([true, true, false]);
    const made = await turnsOn(text, 800_000);
    expect(made).toBeLessThanOrEqual(800_000 / 80);
    expect(made).toBeGreaterThan(800_000 / 100);
  });

  it('charges a helper reached by a tail call, and an exported helper keeps its own charge', async () => {
    const text = `(module ${turns} (func $b ${nops(80)}) (func $a (return_call $b))
      (func $run (export "run") (loop $l ${bump} (call $a) (br $l))))`;
    expect((await plans(text)).map((b) => b.folded)).toEqual([true, true, false]);
    const made = await turnsOn(text, 600_000);
    expect(made).toBeLessThanOrEqual(600_000 / 80);
    const { exports, fuel } = await instance(await wat(`(module (func (export "f") ${nops(10)}))`));
    fuel.value = 0n;
    expect(() => exports.f!()).toThrow(/unreachable/);
  });

  it('still stops recursion through loop-free functions that are not exported: one of each cycle keeps its charge', async () => {
    for (const text of [
      '(module (func $d (call $d)) (func (export "run") (call $d)))',
      '(module (func $a (call $b)) (func $b (call $c)) (func $c (call $a)) (func (export "run") (call $a)))',
      '(module (func $a (call $b)) (func $b (return_call $a)) (func (export "run") (call $b)))',
    ]) {
      const { exports, fuel } = await instance(await wat(text));
      // Little enough that the fuel, not the stack, ends it: a frame costs a few units.
      fuel.value = 1000n;
      expect(() => exports.run!(), text).toThrow(/unreachable/);
    }
    const bodies = await plans('(module (func $a (call $b)) (func $b (call $c)) (func $c (call $a)) (func $run (export "run") (call $a)))');
    expect(bodies.slice(0, 3).filter((b) => !b.folded)).toHaveLength(1);
  });

  it('keeps the charge of a helper that costs more than FOLD_MAX_COST; through a table, the indirect call\'s charge pays for a folded one', async () => {
    const bodies = await plans(`(module (func $big ${nops(FOLD_MAX_COST + 10)}) (func $small ${nops(10)}) (func $run (export "run") (call $big) (call $small)))`);
    expect(bodies.map((b) => b.folded)).toEqual([false, true, false]);
    const text = `(module ${turns} (type $v (func)) (table 1 funcref) (elem (i32.const 0) $small) (func $small ${nops(FOLD_MAX_COST - 10)})
      (func $run (export "run") (loop $l ${bump} (call_indirect (type $v) (i32.const 0)) (br $l))))`;
    expect((await plans(text))[0]!.folded).toBe(true);
    const made = await turnsOn(text, 1_000_000);
    expect(made).toBeLessThanOrEqual(1_000_000 / HOST_CALL_COST);
  });

  it('folds no function that could reach itself again through a table: an indirect call costs more than a folded function may (review)', async () => {
    expect(FOLD_MAX_COST).toBeLessThan(HOST_CALL_COST);
    const text = `(module (type $v (func)) (table 1 funcref) (elem (i32.const 0) $f)
      (func $f (call_indirect (type $v) (i32.const 0))) (func $run (export "run") (call $f)))`;
    expect((await plans(text))[0]!.folded).toBe(false);
    const { exports, fuel } = await instance(await wat(text));
    fuel.value = 100_000n;
    expect(() => exports.run!()).toThrow(/unreachable/);
  });

  it('tells a function\'s index from its body\'s when the module imports functions (review)', async () => {
    const imported = '(import "h" "f" (func $imported))';
    const imports = { h: { f: () => {} } };
    // The exported function and the start function keep their charge: at zero fuel they trap.
    const exported = await instance(await wat(`(module ${imported} (func $x ${nops(5)}) (func (export "f") ${nops(10)}))`), imports);
    exported.fuel.value = 0n;
    expect(() => exported.exports.f!()).toThrow(/unreachable/);
    const started = await instance(await wat(`(module ${imported} (func $x ${nops(5)}) (func $s ${nops(10)}) (start $s) (func (export "g") (call $x)))`), imports);
    started.fuel.value = 0n;
    expect(() => started.exports[START_EXPORT]!()).toThrow(/unreachable/);
    // A folded chain is paid in full on every turn; a stretch over the bound pays per call.
    const chain = await turnsOn(`(module ${imported} ${turns} (func $b ${nops(40)}) (func $a ${nops(40)} (call $b))
      (func (export "run") (loop $l ${bump} (call $a) (br $l))))`, 800_000, imports);
    expect(chain).toBeLessThanOrEqual(800_000 / 80);
    expect(chain).toBeGreaterThan(800_000 / 100);
    const calls = Array(1200).fill('(call $mid)').join(' ');
    const over = await turnsOn(`(module ${imported} ${turns} (func $leaf ${nops(40)}) (func $mid ${nops(40)} (call $leaf))
      (func (export "run") (loop $l ${bump} ${calls} (br $l))))`, 10_000_000, imports);
    expect(over).toBeLessThanOrEqual(10_000_000 / (1200 * 80));
    // Recursion through loop-free functions, past an import.
    for (const text of [
      `(module ${imported} (func $a (call $b)) (func $b (return_call $a)) (func (export "run") (call $b)))`,
      `(module ${imported} (func $a (call $b) (call $b)) (func $b (call $c)) (func $c (call $a)) (func (export "run") (call $a)))`,
    ]) {
      const { exports, fuel } = await instance(await wat(text), imports);
      fuel.value = 1000n;
      expect(() => exports.run!(), text).toThrow(/unreachable/);
    }
  });

  it('pays for at most FOLD_REGION_MAX of folded work in one charge: a helper called too often in one stretch keeps its charge (red team, fold 1)', async () => {
    // 3.9 s of the main thread on one charge: 125,000 calls of a folded pointer chase in one body.
    const helper = `(func $chase ${nops(FOLD_MAX_COST - 10)})`;
    const calls = (n: number) => Array(n).fill('(call $chase)').join(' ');
    const perCall = FOLD_MAX_COST - 10 + 1;
    const under = Math.floor(FOLD_REGION_MAX / perCall) - 5;
    expect((await plans(`(module ${helper} (func $run (export "run") ${calls(under)}))`))[0]!.folded).toBe(true);
    const over = await plans(`(module ${helper} (func $run (export "run") ${calls(under + 20)}))`);
    expect(over[0]!.folded).toBe(false);
    expect(over[1]!.charges[0]!.foldedCost).toBe(0);
    // Indirect calls may land on any folded function: a stretch with too many of them folds nothing in the module.
    const indirect = Array(FOLD_REGION_MAX / FOLD_MAX_COST + 1).fill('(call_indirect (type $v) (i32.const 0))').join(' ');
    const table = await plans(`(module (type $v (func)) (table 1 funcref) (func $small ${nops(10)}) (func $other (call $small)) (func $run (export "run") ${indirect}))`);
    expect(table.map((b) => b.folded)).toEqual([false, false, false]);
  });
});

/** How many function bodies the code section holds. */
function countBodies(bytes: Uint8Array, codeSection: { start: number; end: number }): number {
  return readLeb(bytes, codeSection.start, codeSection.end)[0];
}
