// Hand-made hostile modules against the host's budget and parsing limits: each is refused or
// contained with a message naming the policy and the numbers, and the host keeps serving.
import { mkdtemp, readFile, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parse } from '@bytecodealliance/jco';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { evaluatePolicy, sharedInput } from '../../host/src/evaluate/evaluate.ts';
import { loadPolicy } from '../../host/src/policy/load.ts';
import { SandboxPool } from '../../host/src/sandbox/pool.ts';
import { checkComponentBuiltins, ComponentBuiltinError } from '../../host/src/sandbox/component-builtins.ts';
import { applyPlan, MAX_MEMORIES, planBudget, readLayout, writeLeb } from '../../host/src/sandbox/memory-cap.ts';
import { DEFAULT_LIMITS } from '../../host/src/config/limits.ts';
import { input, load, wasm } from '../helpers/policies.ts';
import { embedPolicyInfo } from '../../host/src/policy/metadata.ts';
import { answering, DROP, growMemory, module, RETURN_0 } from '../helpers/wasm.ts';

let pool: SandboxPool;
let dir: string;

beforeAll(async () => {
  pool = new SandboxPool(2);
  dir = await mkdtemp(join(tmpdir(), 'portcullis-hostile-'));
});
afterAll(() => pool.close());

async function loadBytes(name: string, bytes: Uint8Array) {
  const file = join(dir, `${name}.wasm`);
  await writeFile(file, bytes);
  return loadPolicy(pool, { name, module: file, settings: {}, limits: DEFAULT_LIMITS, failurePolicy: 'Fail', enforcement: 'enforce', isolation: 'reuse' });
}

/** The host is still well: a real policy loads and answers correctly. */
async function stillServes(): Promise<void> {
  const numbers = await load(pool, 'numbers');
  const outcome = await evaluatePolicy(pool, numbers, 'validate', input({ object: { spec: { numbers: [500] } } }));
  expect(outcome).toMatchObject({ status: 'denied', code: 499 });
}

const validate = { name: 'validate', kind: 'func' as const, index: 0 };

describe('parsing is bounded before it allocates', () => {
  it('refuses a valid header followed by 20 MB of zeros at once, without a section per two bytes', async () => {
    const bytes = new Uint8Array(20 * 2 ** 20);
    bytes.set([0x00, 0x61, 0x73, 0x6d, 1, 0, 0, 0]);
    const started = performance.now();
    await expect(loadBytes('zeros', bytes)).rejects.toThrow(/policy "zeros" could not be loaded: the module has more than 1000 sections; it is not a policy/);
    // Generous for a loaded 2-core machine; before the fix this took 4-36 s and 1.5 GiB.
    expect(performance.now() - started).toBeLessThan(5000);
    await stillServes();
  });

  it.each([
    ['a section longer than the file', [0x00, 0x61, 0x73, 0x6d, 1, 0, 0, 0, 1, 0xff, 0xff, 0x03], /section 1 at byte 8 claims 65535 bytes, past the end/],
    ['an unknown section id', [0x00, 0x61, 0x73, 0x6d, 1, 0, 0, 0, 0x42, 0], /unknown section id 66/],
    ['a truncated size', [0x00, 0x61, 0x73, 0x6d, 1, 0, 0, 0, 1, 0x80], /truncated LEB128/],
    ['a memory count larger than its section', [0x00, 0x61, 0x73, 0x6d, 1, 0, 0, 0, 5, 2, 0xff, 0x7f], /memory section claims 16383 entries in 2 bytes/],
    // A type section of 1 byte that claims 6: the next "section" starts on the memory section's last byte.
    ['a section claiming more bytes than it has', [0x00, 0x61, 0x73, 0x6d, 1, 0, 0, 0, 1, 6, 0, 5, 4, 1, 1, 0, 0x42], /^policy "garbage" could not be loaded: unknown section id 66 at byte 16 \(a section before it may claim the wrong size\)$/],
    // Two memory sections: V8 refuses them too, but only one would have had its memory planned.
    ['a section twice', [0x00, 0x61, 0x73, 0x6d, 1, 0, 0, 0, 5, 3, 1, 0, 1, 5, 5, 1, 0, 0xff, 0xff, 0x03], /the memory section appears twice \(again at byte 13\); a module has it at most once/],
  ])('refuses %s with a clear message', async (_name, bytes, message) => {
    await expect(loadBytes('garbage', new Uint8Array(bytes))).rejects.toThrow(message);
  });

  it('refuses a module larger than limits.maxModuleMiB before reading it', async () => {
    const file = join(dir, 'big.wasm');
    await writeFile(file, new Uint8Array(3 * 2 ** 20));
    await expect(loadPolicy(pool, {
      name: 'big', module: file, settings: {}, limits: { ...DEFAULT_LIMITS, maxModuleMiB: 2 }, failurePolicy: 'Fail', enforcement: 'enforce', isolation: 'reuse',
    })).rejects.toThrow(/policy "big" could not be loaded: .*big\.wasm is 3 MiB, above limits\.maxModuleMiB \(2 MiB\)/);
  });
});

describe('one memory budget per policy', () => {
  it('refuses 40 funcref tables of 10,000,000 entries at load, naming the numbers', async () => {
    const bytes = module({ tables: Array.from({ length: 40 }, () => ({ min: 10_000_000 })), functions: [RETURN_0], exports: [validate] });
    // Tables live on the worker's heap, which every policy there shares: capped in entries too.
    await expect(loadBytes('tables', bytes)).rejects.toThrow(
      /policy "tables" could not be loaded: its tables start with 400000000 entries; a policy may have at most 65536/);
    await stillServes();
  });

  it('refuses 8 memories of 1024 pages at load: all memories count together', async () => {
    const bytes = module({ memories: Array.from({ length: 8 }, () => ({ min: 1024 })), functions: [RETURN_0], exports: [validate] });
    await expect(loadBytes('memories', bytes)).rejects.toThrow(/it declares 512 MiB before running \(memories 512 MiB, tables 0 MiB\), above its 64 MiB memory budget/);
    await stillServes();
  });

  it(`refuses more than ${MAX_MEMORIES} memories however small: each takes 8 GiB of the host's address space`, async () => {
    // Red team: thousands of empty memories, counted at 0 bytes, filled the process's 128 TiB
    // until no policy could get a memory at all.
    const bytes = module({ memories: Array.from({ length: 4000 }, () => ({ min: 0 })), functions: [RETURN_0], exports: [validate] });
    await expect(loadBytes('empty-memories', bytes)).rejects.toThrow(
      /policy "empty-memories" could not be loaded: it declares 4000 linear memories; a policy may have at most 8 \(each reserves about 8 GiB/);
    await stillServes();
  });

  it('gives 8 small growable memories maxima that add up to the budget, so growing them all fails inside the guest', async () => {
    const bytes = module({ memories: Array.from({ length: 8 }, () => ({ min: 1 })), functions: [RETURN_0] });
    const layout = readLayout(bytes);
    const cap = 64 * 2 ** 20;
    const plan = planBudget([layout], cap);
    const maxima = plan.memoryMax[0]!;
    expect(maxima.reduce((a, b) => a + b, 0) * 65536).toBeLessThanOrEqual(cap);
    // Growing every memory to its maximum stays within the budget; one page more is refused.
    const grows = maxima.flatMap((max, i) => [...growMemory(i, max - 1), ...DROP]);
    const probe = module({ memories: Array.from({ length: 8 }, () => ({ min: 1 })), functions: [[...grows, ...growMemory(0, 1)]], exports: [validate] });
    const probeLayout = readLayout(probe);
    const capped = applyPlan(probe, probeLayout, planBudget([probeLayout], cap).memoryMax[0]!, []);
    const { validate: run } = new WebAssembly.Instance(await WebAssembly.compile(capped)).exports as { validate: () => number };
    expect(run()).toBe(-1);
  });

  it('does not let a table grow past its declared size', async () => {
    const bytes = module({ tables: [{ min: 10 }], functions: [RETURN_0] });
    const layout = readLayout(bytes);
    expect(planBudget([layout], 2 ** 20).tableMax).toEqual([[10]]);
  });
});

describe('memory the linear-memory cap does not see (red-team findings)', () => {
  const small = { ...DEFAULT_LIMITS, memoryMiB: 16 };
  const loadWat = async (name: string, text: string, limits = small) =>
    loadPolicy(pool, { name, module: `${name}.wasm`, settings: {}, limits, failurePolicy: 'Fail', enforcement: 'enforce', isolation: 'reuse' }, await parse(text));

  it('refuses WasmGC struct and array types at load: their memory is on the worker heap, and exhausting it aborted the host', async () => {
    const gc = `(module (type $a (array (mut i64))) (memory (export "memory") 1)
      (func (export "validate") (result i32) (drop (array.new_default $a (i32.const 60000000))) (i32.const 0)))`;
    await expect(loadWat('gc-array', gc)).rejects.toThrow(/policy "gc-array" could not be loaded: .*type 0 is not a function type .*WasmGC/);
    await stillServes();
  });

  it('refuses a typed-reference table with a reason instead of misreading it', async () => {
    const typed = `(module (type $f (func)) (table 10 (ref null $f)) (memory (export "memory") 1)
      (func (export "validate") (result i32) (i32.const 0)))`;
    await expect(loadWat('typed-table', typed)).rejects.toThrow(/table 0 has element type 0x63; a policy's tables hold funcref or externref/);
  });

  // The compiler's memory grows with nesting (~650 B a level, outside every heap limit): 2.3
  // million levels took 1.5 GB per call in the worker. Real toolchains nest a few hundred.
  const nested = (levels: number) => `(module (memory (export "memory") 1)
    (func (export "validate") (result i32) ${'block\n'.repeat(levels)}${'end\n'.repeat(levels)} (i32.const 0)))`;

  it('refuses a function body nested deeper than 10,000 blocks at load, before V8 compiles it', async () => {
    await expect(loadWat('deep-blocks', nested(20_000))).rejects.toThrow(
      /policy "deep-blocks" could not be loaded: function body 0 nests blocks more than 10000 deep; compiling it would take the host's memory/);
    await stillServes();
  });

  it('loads and runs a body nested 2,000 deep (it answers nothing, which is a crash like any empty answer)', async () => {
    const policy = await loadWat('fairly-deep', nested(2_000));
    expect(await evaluatePolicy(pool, policy, 'validate', input())).toMatchObject({ status: 'failed', failure: 'crash' });
  });

  // Extism's kernel hands out blocks outside linear memory; the host meters them per call.
  const kernel = (body: string) => `(module
    (import "extism:host/env" "alloc" (func $alloc (param i64) (result i64)))
    (import "extism:host/env" "store_u64" (func $store (param i64 i64)))
    (memory (export "memory") 1)
    (func (export "validate") (result i32) (local $b i64) (local $k i32) ${body} (i32.const 0)))`;

  it('a negative allocation does not lower the meter: the call fails at the cap', async () => {
    const policy = await loadWat('alloc-negative', kernel(`
      (block $done (try_table (catch_all $done) (drop (call $alloc (i64.const -1099511627776)))))
      (loop $more
        (local.set $b (call $alloc (i64.const 8388608)))
        (call $store (local.get $b) (i64.const 1))
        (local.set $k (i32.add (local.get $k) (i32.const 1)))
        (br_if $more (i32.lt_u (local.get $k) (i32.const 8))))`));
    const outcome = await evaluatePolicy(pool, policy, 'validate', input());
    expect(outcome).toMatchObject({ status: 'failed', failure: 'temporary' });
    expect(outcome.status === 'failed' && outcome.message).toMatch(/exceeded its 16 MiB memory cap \(Extism kernel allocations\)/);
    await stillServes();
  });

  it('a guest that logs a 15 MiB kernel block 64 times costs the host no more than what is kept of each line', async () => {
    // Extism decoded the whole block per log, and the kept 2 KiB was a slice holding all of it:
    // 20 logs of 60 MiB held 1.9 GB (red team). The outcome is a crash: it sets no output.
    const policy = await loadWat('log-bomb', `(module
      (import "extism:host/env" "alloc" (func $alloc (param i64) (result i64)))
      (import "extism:host/env" "log_info" (func $log (param i64)))
      (memory (export "memory") 1)
      (func (export "validate") (result i32) (local $b i64) (local $k i32)
        (local.set $b (call $alloc (i64.const 15728640)))
        (loop $more
          (call $log (local.get $b))
          (local.set $k (i32.add (local.get $k) (i32.const 1)))
          (br_if $more (i32.lt_u (local.get $k) (i32.const 64))))
        (i32.const 0)))`);
    const before = process.memoryUsage().rss;
    for (let i = 0; i < 3; i++) await evaluatePolicy(pool, policy, 'validate', input());
    // Unfixed: 3 × 64 × 15 MiB of decoded text, held. Fixed: a few MiB of churn.
    expect((process.memoryUsage().rss - before) / 2 ** 20).toBeLessThan(256);
    await stillServes();
  });

  it('a guest\'s 15 MiB error message is cut to 4096 characters before it reaches the outcome', async () => {
    // Extism's error_set made the whole block the crash message: one review answered 360 MB and
    // wrote it to every log line (red team).
    const policy = await loadWat('error-bomb', `(module
      (import "extism:host/env" "alloc" (func $alloc (param i64) (result i64)))
      (import "extism:host/env" "error_set" (func $error_set (param i64)))
      (memory (export "memory") 1)
      (func (export "validate") (result i32) (call $error_set (call $alloc (i64.const 15728640))) (i32.const 1)))`);
    const outcome = await evaluatePolicy(pool, policy, 'validate', input());
    expect(outcome).toMatchObject({ status: 'failed', failure: 'crash' });
    const message = outcome.status === 'failed' ? outcome.message : '';
    expect(message).toMatch(/^crashed: .*… \(\d+ more characters cut\)$/s);
    expect(message.length).toBeLessThan(4200);
    await stillServes();
  });

  it('empty kernel blocks count too: alloc(0) in a loop fails at the cap, not at the deadline', async () => {
    // Metered at nothing, each block still cost the worker ~500 bytes: one 2 s call grew the host
    // by a gigabyte, past the Deployment's memory limit (red team).
    // An 8 MiB cap: reached at about 16,000 blocks, before the 32,000 objects a call may make.
    const policy = await loadWat('alloc-zero', kernel('(loop $more (drop (call $alloc (i64.const 0))) (br $more))'), { ...small, memoryMiB: 8 });
    const outcome = await evaluatePolicy(pool, policy, 'validate', input());
    expect(outcome).toMatchObject({ status: 'failed', failure: 'temporary' });
    expect(outcome.status === 'failed' && outcome.message).toMatch(/exceeded its 8 MiB memory cap \(Extism kernel allocations\)/);
    await stillServes();
  });

  it('however large the cap, a call makes at most 32,000 kernel blocks: their objects live on the worker\'s own heap', async () => {
    // Under a 1.5 GiB cap, 8 million empty blocks ran the worker's 512 MiB heap out, and V8
    // aborted the whole host (red team).
    const policy = await loadWat('alloc-zero-big', kernel('(loop $more (drop (call $alloc (i64.const 0))) (br $more))'), { ...small, memoryMiB: 1536, timeoutMs: 15_000 });
    const outcome = await evaluatePolicy(pool, policy, 'validate', input());
    expect(outcome).toMatchObject({
      status: 'failed', failure: 'temporary',
      message: 'made more than 32000 Extism kernel blocks, variables and context answers in one call, the most a call may make (each takes some of the worker\'s own heap)',
    });
    await stillServes();
  });

  // Extism's variables: names live in a map of the kernel's that no reset cleared and no meter saw.
  const variables = (body: string) => `(module
    (import "extism:host/env" "alloc" (func $alloc (param i64) (result i64)))
    (import "extism:host/env" "store_u64" (func $store (param i64 i64)))
    (import "extism:host/env" "var_get" (func $var_get (param i64) (result i64)))
    (import "extism:host/env" "var_set" (func $var_set (param i64 i64)))
    (memory (export "memory") 1)
    (func (export "validate") (result i32) (local $b i64) (local $k i64)
      (local.set $b (call $alloc (i64.const 8))) ${body} (i32.const 0)))`;

  it('variables count against the cap: 200,000 names in one call fail it instead of growing the worker', async () => {
    // A guest that set 200,000 names a call piled them up across calls until V8 aborted the whole
    // host at the worker's heap limit (red team).
    const policy = await loadWat('var-flood', variables(`
      (loop $more
        ;; the name: k as three ASCII digits of base 64, so that every name is distinct text
        (call $store (local.get $b) (i64.or (i64.or
          (i64.add (i64.and (local.get $k) (i64.const 63)) (i64.const 48))
          (i64.shl (i64.add (i64.and (i64.shr_u (local.get $k) (i64.const 6)) (i64.const 63)) (i64.const 48)) (i64.const 8)))
          (i64.shl (i64.add (i64.and (i64.shr_u (local.get $k) (i64.const 12)) (i64.const 63)) (i64.const 48)) (i64.const 16))))
        (call $var_set (local.get $b) (local.get $b))
        (local.set $k (i64.add (local.get $k) (i64.const 1)))
        (br_if $more (i64.lt_u (local.get $k) (i64.const 200000))))`), { ...small, memoryMiB: 2 });
    const outcome = await evaluatePolicy(pool, policy, 'validate', input());
    expect(outcome).toMatchObject({ status: 'failed', failure: 'temporary' });
    // A 2 MiB cap: reached at about 15,000 names, before the 32,000 objects a call may make.
    expect(outcome.status === 'failed' && outcome.message).toMatch(/exceeded its 2 MiB memory cap \(Extism variables\)/);
    await stillServes();
  });

  it('a variable lives for one call, as the kernel block it names does', async () => {
    // The guest traps when the name it is about to set is already set: only a leftover from an
    // earlier call could be. Each call otherwise answers nothing, which is a crash of its own.
    const policy = await loadWat('var-lifetime', variables(`
      (call $store (local.get $b) (i64.const 120))
      (if (i64.ne (call $var_get (local.get $b)) (i64.const 0)) (then unreachable))
      (call $var_set (local.get $b) (local.get $b))`));
    for (let i = 0; i < 3; i++) {
      const outcome = await evaluatePolicy(pool, policy, 'validate', input());
      expect(outcome.status === 'failed' && outcome.message).toMatch(/not JSON/);
    }
  });

  it('every kernel import the host allows links: log_trace and get_log_level, which Extism 1.0 lacks, included', async () => {
    // They were on the allow-list but failed at link time with "function import requires a callable".
    const policy = await loadWat('trace-logger', `(module
      (import "extism:host/env" "alloc" (func $alloc (param i64) (result i64)))
      (import "extism:host/env" "log_trace" (func $trace (param i64)))
      (import "extism:host/env" "get_log_level" (func $level (result i32)))
      (memory (export "memory") 1)
      (func (export "validate") (result i32)
        (if (i32.le_s (call $level) (i32.const 0)) (then (call $trace (call $alloc (i64.const 4)))))
        (i32.const 0)))`);
    const outcome = await evaluatePolicy(pool, policy, 'validate', input());
    expect(outcome.status === 'failed' && outcome.message).toMatch(/not JSON/);
  });

  it('a guest that catches the cap\'s fault and carries on still fails the call', async () => {
    const policy = await loadWat('alloc-swallow', kernel(`
      (block $done (try_table (catch_all $done) (drop (call $alloc (i64.const 33554432)))))`));
    const outcome = await evaluatePolicy(pool, policy, 'validate', input());
    expect(outcome).toMatchObject({ status: 'failed', failure: 'temporary' });
    expect(outcome.status === 'failed' && outcome.message).toMatch(/memory cap/);
  });
});

describe('a component holds each core module once (red-team findings)', () => {
  it('refuses a component that instantiates a core module again: the cap budgets each once', async () => {
    // numbers (a real policy component) with a core module of one memory page appended (the
    // first at the top level: index 0), and two instances of it: each would hold its memory.
    const component = await readFile(wasm('numbers'));
    const core = [0x00, 0x61, 0x73, 0x6d, 1, 0, 0, 0, 5, 3, 1, 0, 1, 7, 10, 1, 6, ...new TextEncoder().encode('memory'), 2, 0];
    const again = [0x00, 0x00, 0x00]; // instantiate core module 0, with no arguments
    const section = [0x01, core.length, ...core, 0x02, 1 + again.length * 2, 2, ...again, ...again];
    await expect(loadBytes('twice', Uint8Array.from([...component, ...section])))
      .rejects.toThrow('the component instantiates one of its core modules more than once, which its memory cap does not allow');
    await stillServes();
  });
});

describe('function types are counted per policy, across a component\'s core modules (red-team findings)', () => {
  // numbers (a real component) with two more core modules that only declare types: each is under
  // the per-module bounds, and jco transpiles unused modules too, so V8 would keep their types.
  const withCores = async (cores: number[][]) => {
    const component = await readFile(wasm('numbers'));
    const sections = cores.flatMap((core) => [0x01, ...writeLeb(core.length), ...core]);
    return Uint8Array.from([...component, ...sections]);
  };
  const typesOnly = (types: number[][]) => {
    const body = [...writeLeb(types.length), ...types.flat()];
    return [0x00, 0x61, 0x73, 0x6d, 1, 0, 0, 0, 1, ...writeLeb(body.length), ...body];
  };
  /** `() -> ()`; and `count` i32 parameters, no result. */
  const empty = [0x60, 0, 0];
  const wide = (count: number) => [0x60, ...writeLeb(count), ...Array<number>(count).fill(0x7f), 0];

  it('refuses 2 × 2,100 types: a policy has at most 4,096, in all of its core modules', async () => {
    const bytes = await withCores([typesOnly(Array(2100).fill(empty)), typesOnly(Array(2100).fill(empty))]);
    await expect(loadBytes('many-types', bytes))
      .rejects.toThrow(/could not be loaded: its core modules declare 4\d{3} function types in all; a policy may have at most 4096 \(V8 keeps every type until the host process ends\)/);
    await stillServes();
  });

  it('refuses 2 × 40,000 parameters: a policy\'s types have at most 65,536 parameters and results in all', async () => {
    const bytes = await withCores([typesOnly(Array(40).fill(wide(1000))), typesOnly(Array(40).fill(wide(1000)))]);
    await expect(loadBytes('wide-types', bytes))
      .rejects.toThrow(/could not be loaded: its core modules' function types have 8\d{4} parameters and results in all; a policy may have at most 65536/);
    await stillServes();
  });
});

describe('names jco writes into its JavaScript glue (red-team findings)', () => {
  // A hand-made component whose core module exports validate under `name` too, and lifts that one.
  const component = (name: string) => parse(`(component
  (core module $m
    (memory (export "memory") 1)
    (global $bump (mut i32) (i32.const 4096))
    (data (i32.const 16) "{\\"outcome\\":\\"allow\\"}")
    (data (i32.const 64) "{\\"modes\\":[\\"validate\\"],\\"settings\\":false}")
    (data (i32.const 128) "{\\"valid\\":true}")
    (func (export "realloc") (param i32 i32 i32 i32) (result i32)
      (local $r i32)
      (local.set $r (global.get $bump))
      (global.set $bump (i32.add (global.get $bump) (i32.and (i32.add (local.get 3) (i32.const 7)) (i32.const -8))))
      (local.get $r))
    (func $ret (param $p i32) (param $l i32) (result i32)
      (i32.store (i32.const 1024) (local.get $p)) (i32.store (i32.const 1028) (local.get $l)) (i32.const 1024))
    (func (export "metadata") (result i32) (call $ret (i32.const 64) (i32.const 39)))
    (func (export "validate-settings") (param i32 i32) (result i32) (call $ret (i32.const 128) (i32.const 14)))
    (func (export "validate") (export ${JSON.stringify(name)}) (param i32 i32) (result i32) (call $ret (i32.const 16) (i32.const 19)))
    (func (export "mutate") (param i32 i32) (result i32) (call $ret (i32.const 16) (i32.const 19))))
  (core instance $i (instantiate $m))
  (alias core export $i "memory" (core memory $mem))
  (alias core export $i "realloc" (core func $realloc))
  (func $metadata (result string) (canon lift (core func $i "metadata") (memory $mem) (realloc $realloc)))
  (func $vs (param "input" string) (result string) (canon lift (core func $i "validate-settings") (memory $mem) (realloc $realloc)))
  (func $v (param "input" string) (result string) (canon lift (core func $i ${JSON.stringify(name)}) (memory $mem) (realloc $realloc)))
  (func $mu (param "input" string) (result string) (canon lift (core func $i "mutate") (memory $mem) (realloc $realloc)))
  (instance $pol (export "metadata" (func $metadata)) (export "validate-settings" (func $vs)) (export "validate" (func $v)) (export "mutate" (func $mu)))
  (export "portcullis:policy/policy@0.1.0" (instance $pol)))`);

  it('refuses a core export name that would be code in the glue, before any worker runs it; a plain name loads', async () => {
    // jco 1.35 writes `exports0['${name}']`: this name ran child_process in every worker at load.
    const marker = join(await mkdtemp(join(tmpdir(), 'portcullis-glue-')), 'ran');
    const payload = `validate-2']; process.getBuiltinModule('fs').writeFileSync(${JSON.stringify(marker)}, 'x'); void exports0['validate-2`;
    await expect(loadBytes('glue-code', await component(payload))).rejects.toThrow(
      /could not be loaded: its core module [\w.]+ names an import or export "validate-2'\]; process.*", which could run as code in the JavaScript jco generates for it/);
    await expect(readFile(marker)).rejects.toThrow(/ENOENT/);
    await expect(loadBytes('glue-plain', await component('validate-2'))).resolves.toMatchObject({ name: 'glue-plain' });
    await stillServes();
  });
});

describe('settings schemas embedded in modules stay their own (red-team findings)', () => {
  const withSchema = async (settingsSchema: Record<string, unknown>) =>
    embedPolicyInfo(await readFile(wasm('numbers')), { name: 'numbers', settingsSchema });
  const loadAs = (name: string, bytes: Uint8Array) =>
    loadPolicy(pool, { name, module: `${name}.wasm`, settings: {}, limits: DEFAULT_LIMITS, failurePolicy: 'Fail', enforcement: 'enforce', isolation: 'reuse' }, bytes);

  it('one policy\'s schema $id does not stop another, or its own reload, from loading', async () => {
    const bytes = await withSchema({ $id: 'urn:portcullis:taken', type: 'object' });
    await loadAs('schema-first', bytes);
    await expect(loadAs('schema-second', bytes)).resolves.toMatchObject({ name: 'schema-second' });
    await expect(loadAs('schema-first', bytes)).resolves.toMatchObject({ name: 'schema-first' });
  });

  it('a $ref does not reach another policy\'s schema', async () => {
    await loadAs('schema-target', await withSchema({ $id: 'urn:portcullis:target', type: 'object' }));
    // Written after embedding, whose own check would refuse it: the host must refuse it too.
    const bytes = Buffer.from(await withSchema({ $comment: 'urn:portcullis:target' }));
    const at = bytes.indexOf('"$comment"');
    bytes.write('"$ref"    ', at);
    await expect(loadAs('schema-borrower', bytes))
      .rejects.toThrow(/settingsSchema is not a usable JSON Schema: can't resolve reference urn:portcullis:target/);
  });
});

describe('entry points are checked at load', () => {
  it.each(['memory', 'table'] as const)('refuses a module exporting validate as a %s', async (kind) => {
    const bytes = module({ memories: [{ min: 1 }], tables: [{ min: 1 }], functions: [RETURN_0], exports: [{ name: 'validate', kind, index: 0 }] });
    await expect(loadBytes('exports', bytes)).rejects.toThrow(`policy "exports" could not be loaded: it exports "validate" as a ${kind}, not a function`);
  });

  it('refuses an entry point that takes parameters, saying its type and the one it must have', async () => {
    // Red team and a newcomer (AssemblyScript's `export function validate(ctx: Context)`): such a
    // module loaded, then failed every call with "Cannot convert undefined to a BigInt".
    const typed = (name: string, params: number[], results: number[]) => {
      const vector = (items: number[]) => [items.length, ...items];
      const section = (id: number, payload: number[]) => [id, payload.length, ...payload];
      const exportName = [...new TextEncoder().encode(name)];
      return Uint8Array.from([
        0x00, 0x61, 0x73, 0x6d, 1, 0, 0, 0,
        ...section(1, [1, 0x60, ...vector(params), ...vector(results)]),
        ...section(3, [1, 0]),
        ...section(7, [1, exportName.length, ...exportName, 0, 0]),
        ...section(10, [1, 4, 0, ...(results[0] === 0x7e ? [0x42, 0] : [0x41, 0]), 0x0b]),
      ]);
    };
    await expect(loadBytes('params', typed('validate', [0x7e, 0x7e], [0x7f]))).rejects.toThrow('policy "params" could not be loaded: ' +
      'its "validate" takes (i64, i64) and returns (i32); an entry point takes no parameters and returns an i32 status, 0 once the SDK wrote the answer ' +
      '(AssemblyScript: `export function validate(): i32 { return handleValidate(check); }`)');
    await expect(loadBytes('context', typed('mutate', [0x7f], [0x7f]))).rejects.toThrow(/its "mutate" takes \(i32\) and returns \(i32\)/);
    await expect(loadBytes('i64', typed('validate', [], [0x7e]))).resolves.toMatchObject({ name: 'i64' });
    await stillServes();
  });
});

describe('deadlines while loading', () => {
  it('says a trap while instantiating is the start function\'s', async () => {
    // Red team: it read "could not be loaded: wasm trap: unreachable", as if a call had trapped.
    const file = join(dir, 'start-trap.wasm');
    await writeFile(file, module({ functions: [RETURN_0], exports: [validate], startTrap: true }));
    const options = { settings: {}, limits: DEFAULT_LIMITS, failurePolicy: 'Fail' as const, enforcement: 'enforce' as const, isolation: 'reuse' as const };
    await expect(loadPolicy(pool, { name: 'start-trap', module: file, ...options }))
      .rejects.toThrow('policy "start-trap" could not be loaded: its start function trapped (wasm trap: unreachable)');
  });

  it('a start function that never returns fails that policy at load; the others load and answer', async () => {
    const quick = new SandboxPool(2, { loadTimeoutMs: 1500 });
    try {
      const file = join(dir, 'start-loop.wasm');
      await writeFile(file, module({ functions: [RETURN_0], exports: [validate], startLoop: true }));
      const options = { settings: {}, limits: DEFAULT_LIMITS, failurePolicy: 'Fail' as const, enforcement: 'enforce' as const, isolation: 'reuse' as const };
      const [looping, numbers] = await Promise.allSettled([
        loadPolicy(quick, { name: 'start-loop', module: file, ...options }),
        load(quick, 'numbers'),
      ]);
      expect(looping.status).toBe('rejected');
      expect(String((looping as PromiseRejectedResult).reason)).toMatch(
        /policy "start-loop" could not be loaded: did not finish instantiating \(its start function included\) within 1\.5s/);
      expect(numbers.status).toBe('fulfilled');
      const outcome = await evaluatePolicy(quick, (numbers as PromiseFulfilledResult<Awaited<ReturnType<typeof load>>>).value, 'validate',
        input({ object: { spec: { numbers: [1] } } }));
      expect(outcome.status).toBe('allowed');
    } finally {
      await quick.close();
    }
  });
  it('a worker stopped while its last answer is still unread: that call keeps its answer, and nobody is blamed for the worker', async () => {
    // The worker answers a ~600 ms call, then starts a module whose start function never returns.
    // The main thread is blocked meanwhile and resumes between two event-loop rounds, so the load
    // deadline's timer fires before the loop reads the answer: the pool replaces the worker with
    // the answer still on its channel. Unread, the answered call was blamed for the worker (no
    // call was running, so "the last one") and failed (review of pool.pump's channel).
    const quick = new SandboxPool(1, { loadTimeoutMs: 500 });
    try {
      const limits = { ...DEFAULT_LIMITS, timeoutMs: 2000 };
      const probe = await load(quick, 'spin', { name: 'spin-probe', settings: { iterations: 2_000_000 }, limits });
      await evaluatePolicy(quick, probe, 'mutate', input());
      const timed = await evaluatePolicy(quick, probe, 'mutate', input());
      const iterations = Math.round((600_000 / timed.guestMicros!) * 2_000_000);
      const slow = await load(quick, 'spin', { name: 'spin-600ms', settings: { iterations }, limits });
      const file = join(dir, 'start-loop-late.wasm');
      await writeFile(file, module({ functions: [RETURN_0], exports: [validate], startLoop: true }));

      const answered = evaluatePolicy(quick, slow, 'mutate', input());
      await Promise.resolve(); // the pool posts the call
      const options = { settings: {}, limits: DEFAULT_LIMITS, failurePolicy: 'Fail' as const, enforcement: 'enforce' as const, isolation: 'reuse' as const };
      const looping = loadPolicy(quick, { name: 'start-loop-late', module: file, ...options }).then(() => 'loaded', (error: unknown) => String(error));
      await new Promise((resolve) => setTimeout(resolve, 150)); // its load is posted while the call runs
      await new Promise((resolve) => setImmediate(resolve));
      // Its load deadline: 500 ms, plus twice the 2 s deadline of the call ahead of it.
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 5500);

      expect(await answered).toMatchObject({ status: 'allowed', warnings: [`spun ${iterations}`] });
      expect(await looping).toMatch(/did not finish instantiating/);
      expect(quick.stats.restarts).toBe(1);
      expect(await evaluatePolicy(quick, slow, 'mutate', input())).toMatchObject({ status: 'allowed' });
    } finally {
      await quick.close();
    }
  }, 30_000);
});

describe('what a policy reaches for and cannot have is named', () => {
  it.each([
    ['date', 'Date.now() is not available in a policy: the sandbox has no clock'],
    ['perf', 'performance.now() is not available in a policy: the sandbox has no clock'],
    ['timer', 'setTimeout() is not available in a policy: a policy runs to completion within one call'],
    ['recurse', 'crashed: wasm trap: out of bounds memory access (in a TypeScript policy, usually a stack overflow: unbounded recursion?)'],
  ])('%s', async (probe, message) => {
    const clock = await load(pool, 'clock');
    const outcome = await evaluatePolicy(pool, clock, 'validate', input({ object: { spec: { probe } } }));
    expect(outcome.status).toBe('failed');
    expect(outcome.status === 'failed' && outcome.message).toContain(message);
  });
});

describe('kernel imports are functions (red-team findings)', () => {
  // A module importing a kernel name as something else failed only at instantiation, in V8's words.
  const text = (value: string) => [...writeLeb(value.length), ...new TextEncoder().encode(value)];
  it.each([
    ['global', [0x03, 0x7f, 0x00]],
    ['memory', [0x02, 0x00, 0x01]],
    ['table', [0x01, 0x70, 0x00, 0x01]],
  ] as const)('refuses extism:host/env alloc imported as a %s, at load', async (kind, description) => {
    const plain = module({ functions: [RETURN_0], exports: [validate] });
    // After the header and the type section (its size fits one byte): the import section.
    const typeEnd = 10 + plain[9]!;
    const entry = [...text('extism:host/env'), ...text('alloc'), ...description];
    const imports = [0x02, ...writeLeb(entry.length + 1), 1, ...entry];
    const bytes = Uint8Array.from([...plain.subarray(0, typeEnd), ...imports, ...plain.subarray(typeEnd)]);
    await expect(loadBytes(`kernel-${kind}`, bytes)).rejects.toThrow(
      `could not be loaded: it imports extism:host/env.alloc as a ${kind}; everything the host gives in extism:host/env is a function (check the import's declaration)`,
    );
  });

  // V8 links a JavaScript host function to an import of any signature: these loaded, then failed
  // every call ("Cannot convert a BigInt value to a number", "output that is not JSON ()").
  const importing = (namespace: string, name: string, type: string) => parse(`(module
    (import "${namespace}" "${name}" (func ${type}))
    (memory (export "memory") 1)
    (func (export "validate") (result i32) (i32.const 0)))`);
  it.each([
    ['extism:host/env', 'alloc', '(param i32)', '(i32) -> ()', '(i64) -> (i64)'],
    ['extism:host/env', 'alloc', '(param i64) (result i32)', '(i64) -> (i32)', '(i64) -> (i64)'],
    ['extism:host/env', 'get_log_level', '(result i64)', '() -> (i64)', '() -> (i32)'],
    ['extism:host/env', 'output_set', '(param i64)', '(i64) -> ()', '(i64, i64) -> ()'],
    ['extism:host/user', 'portcullis_input_length', '(result i64)', '() -> (i64)', '() -> (i32)'],
    ['extism:host/user', 'portcullis_context_call', '(param f64 i32) (result i32)', '(f64, i32) -> (i32)', '(i32|i64, i32|i64) -> (i32)'],
  ])('refuses %s.%s declared %s, at load, naming both signatures', async (namespace, name, type, declared, given) => {
    await expect(loadBytes(`signature-${name}-${declared}`, await importing(namespace, name, type))).rejects.toThrow(
      `could not be loaded: it imports ${namespace}.${name} as ${declared}, but the host gives it as ${given}; declare the import with that signature`,
    );
  });
  it.each([
    ['extism:host/user', 'portcullis_input_read', '(param i64)'],
    ['extism:host/user', 'portcullis_input_read', '(param i32)'],
    ['extism:host/env', 'store_u8', '(param i64 i32)'],
  ])('loads %s.%s declared %s, as the SDK or an Extism PDK declares it', async (namespace, name, type) => {
    await expect(loadBytes(`signature-ok-${name}-${type}`, await importing(namespace, name, type))).resolves.toMatchObject({ kind: 'core', modes: ['validate'] });
  });
  it('reads the imports before a kernel import as V8 does: a tag whose attribute is a padded LEB', async () => {
    // Read as one byte, 80 00 put the reader a byte behind, and the load failed with "Cannot read properties of undefined" (red team 3).
    const section = (id: number, payload: number[]) => [id, ...writeLeb(payload.length), ...payload];
    const bytes = Uint8Array.from([
      0x00, 0x61, 0x73, 0x6d, 1, 0, 0, 0,
      ...section(1, [3, 0x60, 1, 0x7f, 1, 0x7f, 0x60, 0, 0, 0x60, 0, 1, 0x7f]), // (i32) -> (i32), () -> (), () -> (i32)
      ...section(2, [2, ...text('env'), ...text('t'), 0x04, 0x80, 0x00, 1, ...text('extism:host/env'), ...text('alloc'), 0x00, 0]),
      ...section(3, [1, 2]),
      ...section(5, [1, 0x00, 1]),
      ...section(7, [2, ...text('validate'), 0x00, 1, ...text('memory'), 0x02, 0]),
      ...section(10, [1, 4, 0, 0x41, 0x00, 0x0b]),
    ]);
    await expect(loadBytes('padded-tag', bytes)).rejects.toThrow(
      'could not be loaded: it imports extism:host/env.alloc as (i32) -> (i32), but the host gives it as (i64) -> (i64)',
    );
  });
  it('refuses a kernel name behind a byte-order mark, which V8 keeps as part of the name, at load and showing the mark', async () => {
    // Read without the mark, it passed as alloc and failed at instantiation naming nothing clear (reviewer).
    await expect(loadBytes('signature-bom', await importing('extism:host/env', '\ufeffalloc', '(param i64) (result i64)'))).rejects.toThrow(
      'could not be loaded: it imports extism:host/env.\\ufeffalloc, which Portcullis does not grant to policies',
    );
  });
});

describe('output_set answers the bytes it names, as Extism\'s own runtime does (red-team findings)', () => {
  // Extism's JavaScript kernel answered the whole block, whatever offset and length it was given.
  const json = '{"outcome":"allow","warnings":["part"]}';
  const setting = (blockBytes: number, offset: number, length: number, after = '') => parse(`(module
    (import "extism:host/env" "alloc" (func $alloc (param i64) (result i64)))
    (import "extism:host/env" "free" (func $free (param i64)))
    (import "extism:host/env" "store_u8" (func $store (param i64 i32)))
    (import "extism:host/env" "output_set" (func $output_set (param i64 i64)))
    (memory (export "memory") 1)
    (data (i32.const 0) ${JSON.stringify(json)})
    (func (export "validate") (result i32) (local $block i64) (local $i i32)
      (local.set $block (call $alloc (i64.const ${blockBytes})))
      (block $done (loop $next
        (br_if $done (i32.ge_u (local.get $i) (i32.const ${json.length})))
        (call $store (i64.add (local.get $block) (i64.extend_i32_u (i32.add (local.get $i) (i32.const ${offset})))) (i32.load8_u (local.get $i)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next)))
      (call $output_set (i64.add (local.get $block) (i64.const ${offset})) (i64.const ${length}))
      ${after}
      (i32.const 0)))`);
  it('the answer written 5 bytes into a larger block is read alone (before: "not JSON" for the bytes around it)', async () => {
    const policy = await loadBytes('output-offset', await setting(json.length + 20, 5, json.length));
    expect(await evaluatePolicy(pool, policy, 'validate', input())).toMatchObject({ status: 'allowed', warnings: ['part'] });
  });
  it('output set at address 0, Extism\'s own placeholder block, fails the call naming the address', async () => {
    const policy = await loadBytes('output-block0', await parse(`(module
      (import "extism:host/env" "output_set" (func $output_set (param i64 i64)))
      (memory (export "memory") 1)
      (func (export "validate") (result i32) (call $output_set (i64.const 0) (i64.const 1)) (i32.const 0)))`));
    expect(await evaluatePolicy(pool, policy, 'validate', input())).toMatchObject({
      status: 'failed', message: expect.stringContaining('set its output at address 0x0, which is not in a block it allocated'),
    });
  });
  it('the answer stays what was set when the guest frees its block before returning', async () => {
    const policy = await loadBytes('output-freed', await setting(json.length, 0, json.length, '(call $free (local.get $block))'));
    expect(await evaluatePolicy(pool, policy, 'validate', input())).toMatchObject({ status: 'allowed', warnings: ['part'] });
  });
  it.each([
    ['longer than its block', json.length + 1, `set its output to ${json.length + 1} bytes at offset 0 of a ${json.length}-byte block`],
    ['of a negative length', -1, `set its output to -1 bytes at offset 0 of a ${json.length}-byte block`],
  ])('an output %s fails the call, saying so', async (_, length, message) => {
    const policy = await loadBytes(`output-${length}`, await setting(json.length, 0, length));
    expect(await evaluatePolicy(pool, policy, 'validate', input())).toMatchObject({ status: 'failed', message: expect.stringContaining(message) });
  });
});

describe('what went wrong is said in words (red-team findings)', () => {
  it('the memory cap is QuickJS\'s own out-of-memory exception only: the words in a patch or in the policy\'s own error are its answer', async () => {
    // Text from the reviewed object can reach an answer unescaped as a patch's keys and values.
    const patch = [{ op: 'add', path: '/metadata/annotations', value: { outcome: 'error', message: 'InternalError: out of memory' } }];
    const patching = await loadBytes('quoting-patch', await answering({ outcome: 'allow', patch }));
    const patched = await evaluatePolicy(pool, patching, 'mutate', input({ object: { metadata: {} } }));
    expect(patched, JSON.stringify(patched)).toMatchObject({ status: 'allowed', patch });
    const erring = await loadBytes('quoting-error', await answering({ outcome: 'error', kind: 'permanent', message: 'InternalError: out of memory, says the quota' }));
    expect(await evaluatePolicy(pool, erring, 'validate', input())).toMatchObject({ status: 'failed', failure: 'permanent', message: 'InternalError: out of memory, says the quota' });
    // An exception (a plain Error's message is reported bare) whose text only starts with the words.
    const throwing = await loadBytes('quoting-exception', await answering({ outcome: 'error', kind: 'exception', message: 'InternalError: out of memory in the quota object' }));
    expect(await evaluatePolicy(pool, throwing, 'validate', input())).toMatchObject({ status: 'failed', failure: 'crash', message: 'InternalError: out of memory in the quota object' });
  });

  const loadWat = async (name: string, text: string) =>
    loadPolicy(pool, { name, module: `${name}.wasm`, settings: {}, limits: DEFAULT_LIMITS, failurePolicy: 'Fail', enforcement: 'enforce', isolation: 'reuse' }, await parse(text));

  it('a start function that sets output, before any call, is refused naming that', async () => {
    await expect(loadWat('start-output', `(module
      (import "extism:host/env" "alloc" (func $alloc (param i64) (result i64)))
      (import "extism:host/env" "output_set" (func $output (param i64 i64)))
      (memory (export "memory") 1)
      (func $start (call $output (call $alloc (i64.const 1)) (i64.const 1)))
      (start $start)
      (func (export "validate") (result i32) (i32.const 0)))`)).rejects.toThrow(
      /policy "start-output" could not be loaded: .*its start function called a host function that works only during a call/);
  });

  it('an exception the guest throws and never catches is a crash that says so', async () => {
    const policy = await loadWat('uncaught', `(module (tag $oops (param i32)) (memory (export "memory") 1)
      (func (export "validate") (result i32) (throw $oops (i32.const 7))))`);
    const outcome = await evaluatePolicy(pool, policy, 'validate', input());
    expect(outcome).toMatchObject({ status: 'failed', failure: 'crash', message: 'crashed: threw a WebAssembly exception that it did not catch' });
    await stillServes();
  });
});

describe('the component model\'s built-ins keep state in the worker, outside the memory cap (red team 6)', () => {
  /**
   * A policy component whose validate runs `body` with `$call` bound to a core function made by
   * `canon` (a canonical built-in of the component model), then allows.
   */
  const policyWith = (canon: string, callType: string, body: string, withDrop = false, namespace = 'x') => parse(`(component
    (core module $mem (memory (export "memory") 40))
    (core instance $mi (instantiate $mem))
    (alias core export $mi "memory" (core memory $memory))
    ${canon}
    (core module $m
      (import "${namespace}" "call" (func $call ${callType}))
      ${withDrop ? `(import "${namespace}" "drop" (func $drop (param i32)))` : ''}
      (import "${namespace}" "memory" (memory 1))
      (global $bump (mut i32) (i32.const 4096))
      (global $next (mut i32) (i32.const 0))
      (data (i32.const 0) "{\\"outcome\\":\\"allow\\"}")
      (data (i32.const 32) "{\\"modes\\":[\\"validate\\"],\\"settings\\":false}")
      (data (i32.const 128) "{\\"valid\\":true}")
      (func (export "realloc") (param i32 i32 i32 i32) (result i32) (local $p i32)
        (local.set $p (global.get $bump)) (global.set $bump (i32.add (global.get $bump) (local.get 3))) (local.get $p))
      (func $ret (param $ptr i32) (param $len i32) (result i32)
        (i32.store (i32.const 256) (local.get $ptr)) (i32.store (i32.const 260) (local.get $len)) (global.set $bump (i32.const 4096)) (i32.const 256))
      (func (export "metadata") (result i32) (call $ret (i32.const 32) (i32.const 39)))
      (func (export "validate-settings") (param i32 i32) (result i32) (call $ret (i32.const 128) (i32.const 14)))
      (func (export "validate") (param i32 i32) (result i32) (local $i i32) ${body} (call $ret (i32.const 0) (i32.const 19)))
      (func (export "mutate") (param i32 i32) (result i32) (call $ret (i32.const 0) (i32.const 19))))
    (core instance $x (export "call" (func $made)) ${withDrop ? '(export "drop" (func $dropped))' : ''} (export "memory" (memory $memory)))
    (core instance $i (instantiate $m (with "${namespace}" (instance $x))))
    (alias core export $i "realloc" (core func $realloc))
    (func $metadata (result string) (canon lift (core func $i "metadata") (memory $memory) (realloc $realloc)))
    (func $vs (param "input" string) (result string) (canon lift (core func $i "validate-settings") (memory $memory) (realloc $realloc)))
    (func $validate (param "input" string) (result string) (canon lift (core func $i "validate") (memory $memory) (realloc $realloc)))
    (func $mutate (param "input" string) (result string) (canon lift (core func $i "mutate") (memory $memory) (realloc $realloc)))
    (instance $pol (export "metadata" (func $metadata)) (export "validate-settings" (func $vs)) (export "validate" (func $validate)) (export "mutate" (func $mutate)))
    (export "portcullis:policy/policy@0.1.0" (instance $pol)))`);

  it('refuses error-context.new at load: each message was kept as a string for the life of the instance, 40 MiB of host a review', async () => {
    const bytes = await policyWith('(core func $made (canon error-context.new (memory $memory)))', '(param i32 i32) (result i32)',
      '(local.set $i (i32.const 20)) (loop $l (drop (call $call (i32.const 65536) (i32.const 2097152))) (br_if $l (local.tee $i (i32.sub (local.get $i) (i32.const 1)))))');
    await expect(loadBytes('error-contexts', bytes)).rejects.toThrow(/policy "error-contexts" could not be loaded: it uses the component model's built-in 0x[0-9a-f]+ at byte \d+ \(an async, stream, future, error-context or thread built-in\)/);
    await stillServes();
  });

  it('refuses a function lifted async with a callback, which ran in the worker after its call had answered', async () => {
    // The red team's shape: an inner component exports an async function whose callback loops;
    // the policy calls it through a plain lower.
    const bytes = await parse(`(component
      (component $inner
        (core module $m (func (export "run") (result i32) (i32.const 1)) (func (export "cb") (param i32 i32 i32) (result i32) (loop $forever (br $forever)) (i32.const 0)))
        (core instance $i (instantiate $m))
        (func $run async (canon lift (core func $i "run") async (callback (core func $i "cb"))))
        (export "run" (func $run)))
      (instance $in (instantiate $inner))
      (alias export $in "run" (func $run))
      (core func $low (canon lower (func $run)))
      (core module $p (import "x" "run" (func)) (memory (export "memory") 1))
      (core instance $x (export "run" (func $low)))
      (core instance $pi (instantiate $p (with "x" (instance $x)))))`);
    await expect(loadBytes('async-callback', bytes)).rejects.toThrow(/policy "async-callback" could not be loaded: it lifts a function with the `async` option \(byte \d+\): async functions run callbacks after their call has answered/);
    await stillServes();
  });

  it('lets a component make resources of its own (the toolchain\'s plumbing does), but a call holding more than 4096 of one type fails instead of growing the worker', async () => {
    const makeMany = (count: number) => policyWith('(type $r (resource (rep i32))) (core func $made (canon resource.new $r))', '(param i32) (result i32)',
      `(local.set $i (i32.const ${count})) (loop $l (drop (call $call (local.get $i))) (br_if $l (local.tee $i (i32.sub (local.get $i) (i32.const 1)))))`);
    const few = await loadBytes('few-resources', await makeMany(100));
    expect(await evaluatePolicy(pool, few, 'validate', input({ object: { metadata: { name: 'x' } } }))).toMatchObject({ status: 'allowed' });
    const many = await loadBytes('many-resources', await makeMany(1_000_000));
    const started = performance.now();
    const outcome = await evaluatePolicy(pool, many, 'validate', input({ object: { metadata: { name: 'x' } } }));
    expect(outcome).toMatchObject({ status: 'failed', failure: 'crash' });
    expect(outcome.status === 'failed' && outcome.message).toMatch(/the component holds more than 4096 resource handles of one type|made more than 4096 resources of one type/);
    // It stopped at the cap, long before a million handles (which took seconds and 900 MiB).
    expect(performance.now() - started).toBeLessThan(1500);
    await stillServes();
  });

  it('refuses a component whose instances of one resource type make more than 64 handle tables (review 9: 1,600 from one definition)', async () => {
    // One inner component defines a resource and lifts its resource.new; a middle one
    // instantiates it 9 times and the policy the middle one 9 times, and lowers every `make`:
    // jco gives each instance a handle table of its own.
    const [outer, inner] = [9, 9];
    let middle = `(component $mid (component $inner (type $r (resource (rep i32))) (export $re "r" (type $r))
      (core func $new (canon resource.new $r)) (func $make (param "rep" u32) (result (own $re)) (canon lift (core func $new))) (export "make" (func $make)))`;
    for (let b = 0; b < inner; b++) {
      middle += ` (instance $in${b} (instantiate $inner)) (alias export $in${b} "r" (type $r${b})) (export $er${b} "r${b}" (type $r${b}))
        (alias export $in${b} "make" (func $make${b})) (export "make${b}" (func $make${b}) (func (param "rep" u32) (result (own $er${b}))))`;
    }
    middle += ')';
    const lowered: string[] = [];
    for (let a = 0; a < outer; a++) {
      middle += ` (instance $m${a} (instantiate $mid))`;
      for (let b = 0; b < inner; b++) {
        middle += ` (alias export $m${a} "make${b}" (func $f${a}_${b})) (core func $l${a}_${b} (canon lower (func $f${a}_${b})))`;
        lowered.push(`(export "m${a}_${b}" (func $l${a}_${b}))`);
      }
    }
    // The policy's own core module reaches them all through one more instance it imports nothing from.
    const bytes = await policyWith(`${middle} (core module $hold ${lowered.map((_, i) => `(import "y" "m${i}" (func (param i32) (result i32)))`).join(' ')})
      (core instance $y ${lowered.map((e, i) => e.replace(/"m\d+_\d+"/, `"m${i}"`)).join(' ')}) (core instance $held (instantiate $hold (with "y" (instance $y))))
      (core func $made (canon lower (func $f0_0)))`, '(param i32) (result i32)', '');
    await expect(loadBytes('many-tables', bytes)).rejects.toThrow(/policy "many-tables" could not be loaded: it has \d+ resource handle tables \(a resource type in each instance of a component\); a policy may have at most 64/);
    await stillServes();
  });

  it('a component that makes and drops a resource on every call keeps working past 4096 calls: a dropped resource is not counted', async () => {
    // Each call makes one resource with a rep never used before, and drops it.
    const bytes = await policyWith('(type $r (resource (rep i32))) (core func $made (canon resource.new $r)) (core func $dropped (canon resource.drop $r))',
      '(param i32) (result i32)', '(global.set $next (i32.add (global.get $next) (i32.const 1))) (call $drop (call $call (global.get $next)))', true);
    const policy = await loadBytes('make-and-drop', bytes);
    for (let i = 0; i < 4200; i++) {
      const outcome = await evaluatePolicy(pool, policy, 'validate', input({ object: { metadata: { name: 'x' } } }));
      if (outcome.status !== 'allowed') expect.fail(`call ${i + 1}: ${JSON.stringify(outcome)}`);
    }
  }, 120_000);

  it('refuses a core module importing from a namespace named __proto__: in jco\'s glue that key sets a prototype, and the import reached the module unguarded (review)', async () => {
    const hostLog = `(import "portcullis:policy/host@0.1.0" (instance $host (type $lv (enum "debug" "info" "warn" "error"))
        (export "level" (type $l (eq $lv))) (export "log" (func (param "level" $l) (param "message" string)))))
      (alias export $host "log" (func $log)) (core func $made (canon lower (func $log) (memory $memory)))`;
    const logOnce = '(call $call (i32.const 1) (i32.const 0) (i32.const 4))';
    await expect(loadBytes('proto-namespace', await policyWith(hostLog, '(param i32 i32 i32)', logOnce, false, '__proto__')))
      .rejects.toThrow(/could not be loaded: its core module [\w.]+ names an import or export "__proto__", which could run as code/);
    const plain = await loadBytes('plain-namespace', await policyWith(hostLog, '(param i32 i32 i32)', logOnce));
    await expect(evaluatePolicy(pool, plain, 'validate', input({ object: { metadata: { name: 'x' } } }))).resolves.toMatchObject({ status: 'allowed' });
  });

  it('a call whose glue function threw fails, even when the guest caught it, and its instance goes (red team 7: each caught throw left ~1.1 KB of jco task state, 500 MiB in five calls that answered)', async () => {
    const hostLog = `(import "portcullis:policy/host@0.1.0" (instance $host (type $lv (enum "debug" "info" "warn" "error"))
        (export "level" (type $l (eq $lv))) (export "log" (func (param "level" $l) (param "message" string)))))
      (alias export $host "log" (func $log)) (core func $made (canon lower (func $log) (memory $memory)))`;
    // Level 7 is no level: jco's glue throws after opening a subtask; the guest catches it and goes on.
    const catching = (level: number) => `(local.set $i (i32.const 1000)) (loop $l (block $h (try_table (catch_all $h) (call $call (i32.const ${level}) (i32.const 0) (i32.const 4))))
      (br_if $l (local.tee $i (i32.sub (local.get $i) (i32.const 1)))))`;
    const hostile = await loadBytes('caught-throws', await policyWith(hostLog, '(param i32 i32 i32)', catching(7)));
    for (let call = 0; call < 3; call++) {
      const outcome = await evaluatePolicy(pool, hostile, 'validate', input({ object: { metadata: { name: 'x' } } }));
      expect(outcome).toMatchObject({ status: 'failed', failure: 'crash' });
      expect(outcome.status === 'failed' && outcome.message).toBe('crashed: a function its glue gave it threw (TypeError: invalid discriminant specified for Level); the instance is not used again');
    }
    // The same calls with a real level are a policy that logs: allowed.
    const logging = await loadBytes('logs-a-lot', await policyWith(hostLog, '(param i32 i32 i32)', catching(1)));
    expect(await evaluatePolicy(pool, logging, 'validate', input({ object: { metadata: { name: 'x' } } }))).toMatchObject({ status: 'allowed' });
    await stillServes();
  });

  it('refuses a component cut short anywhere with a reason, never a crash', async () => {
    const bytes = await readFile(wasm('numbers'));
    expect(checkComponentBuiltins(bytes)).toEqual({ makesResources: true });
    for (let cut = 9; cut < bytes.length; cut += Math.floor(bytes.length / 97)) {
      // Any prefix is refused with a ComponentBuiltinError (or passes if it holds whole sections only), never a crash.
      try {
        checkComponentBuiltins(bytes.subarray(0, cut));
      } catch (error) {
        expect(error).toBeInstanceOf(ComponentBuiltinError);
        expect((error as Error).message).toMatch(/^not a well-formed component: /);
      }
    }
  });
});

it('a core module whose memory is exported under another name is told so when it asks for its input (red team 6)', async () => {
  const bytes = await parse(`(module
    (import "extism:host/user" "portcullis_input_length" (func $length (result i32)))
    (import "extism:host/user" "portcullis_input_read" (func $read (param i32)))
    (memory (export "mem") 1)
    (func (export "validate") (result i32) (drop (call $length)) (call $read (i32.const 1024)) (i32.const 0)))`);
  const policy = await loadBytes('memory-elsewhere', bytes);
  const outcome = await evaluatePolicy(pool, policy, 'validate', input({ object: { metadata: { name: 'x' } } }));
  expect(outcome).toMatchObject({ status: 'failed', failure: 'crash', message: expect.stringContaining('gave room for its input, but it exports no memory named "memory", where the host reads and writes it') });
  await stillServes();
});

describe('what a guest answers is read off the main thread (red-team findings)', () => {
  it('an answer of 300 KB of tiny maps in a member the host never reads reaches the main thread as its contract members alone', async () => {
    // Red team 10: 1 MB of `{"0":0},{"1":0},...` took the main thread 130-240 ms to parse per
    // review; parsing costs by values, not bytes. The worker reads it now (compactOutput).
    const junk = Array.from({ length: 40_000 }, (_, i) => `{"${i}":0}`).join(',');
    const bytes = await answering(`{"outcome":"deny","code":418,"message":"no","x":[${junk}]}`, { raw: true });
    const policy = await loadBytes('tiny-maps', bytes);
    const { envelope } = sharedInput(input(), policy);
    const reply = await pool.call(policy.key, 'validate', { envelope, settings: '{}' }, 5000);
    expect(reply).toMatchObject({ ok: true, output: '{"outcome":"deny","code":418,"message":"no","warnings":[]}' });
    expect(await evaluatePolicy(pool, policy, 'validate', input())).toMatchObject({ status: 'denied', code: 418, message: 'no' });
    // The same in a patch: more members than a patch's values may hold is the policy's failure, said by the worker.
    const values = Array.from({ length: 70_000 }, () => '0').join(',');
    const patching = await loadBytes('patch-of-many-values', await answering(`{"outcome":"allow","patch":[{"op":"add","path":"/spec/x","value":[${values}]}]}`, { raw: true }));
    const patched = await pool.call(patching.key, 'mutate', { envelope: sharedInput(input(), patching).envelope, settings: '{}' }, 5000);
    expect(patched.ok && patched.output.length).toBeLessThan(300);
    expect(await evaluatePolicy(pool, patching, 'mutate', input())).toMatchObject({
      status: 'failed', failure: 'crash', message: expect.stringMatching(/^returned a patch whose values hold more than 4,096 members and elements/) as unknown,
    });
    await stillServes();
  }, 60_000);

  it('a large patch reaches the main thread as text, and the host\'s API (evaluatePolicy) still gives its operations', async () => {
    const value = Object.fromEntries(Array.from({ length: 2000 }, (_, i) => [`k${i}`, 'v']));
    const patch = [{ op: 'add', path: '/metadata/annotations', value }];
    const policy = await loadBytes('wide-patch', await answering({ outcome: 'allow', patch }));
    const reply = await pool.call(policy.key, 'mutate', { envelope: sharedInput(input(), policy).envelope, settings: '{}' }, 5000);
    expect(reply.ok && reply.compact && JSON.parse(reply.output)).toMatchObject({ outcome: 'allow', patchLength: 1, patchText: JSON.stringify(patch) });
    const outcome = await evaluatePolicy(pool, policy, 'mutate', input());
    expect(outcome).toMatchObject({ status: 'allowed', patch });
    expect(outcome.status === 'allowed' && Array.isArray(outcome.patch)).toBe(true);
  }, 60_000);
});
