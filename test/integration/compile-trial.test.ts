// V8 compiles a policy's functions in the workers, later, and what its compilers take is bounded
// by nothing the sandbox caps (red team, 2026-11-27: 15 KB of locals and loops took the host to
// 2.9 GB in the baseline compiler; 3 KB of them take 600 MB). Every core module is compiled first in a child process bounded
// in memory and time, with each compiler, and refused when either runs away.
import type * as ChildProcess from 'node:child_process';
import { mkdir, mkdtemp, readdir, readFile, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, it, vi } from 'vitest';
import { loadPolicy } from '../../host/src/policy/load.ts';
import { SandboxPool } from '../../host/src/sandbox/pool.ts';
import { allowanceOf, trialCompile, trialCompileAll, TRIAL_BOUNDS } from '../../host/src/sandbox/compile-trial.ts';
import { DEFAULT_LIMITS } from '../../host/src/config/limits.ts';
import { sha256 } from '../../host/src/util/files.ts';
import { evaluatePolicy } from '../../host/src/evaluate/evaluate.ts';
import { input, load, wasm } from '../helpers/policies.ts';
import { emptyLoops, module, RETURN_0 } from '../helpers/wasm.ts';

// Counts the trial children started (spawn passes through).
const spawned = vi.hoisted(() => ({ count: 0 }));
vi.mock('node:child_process', async (original) => {
  const real = await original<typeof ChildProcess>();
  return { ...real, spawn: (...args: Parameters<typeof real.spawn>) => (spawned.count++, real.spawn(...args)) };
});

let pool: SandboxPool;
let dir: string;
const cacheBefore = process.env.PORTCULLIS_CACHE;

beforeAll(async () => {
  pool = new SandboxPool(1);
  dir = await mkdtemp(join(tmpdir(), 'portcullis-trial-'));
  // A cache of this file's own: passes recorded here are this test's, and none recorded before counts.
  process.env.PORTCULLIS_CACHE = join(dir, 'cache');
});
afterAll(async () => {
  if (cacheBefore === undefined) delete process.env.PORTCULLIS_CACHE;
  else process.env.PORTCULLIS_CACHE = cacheBefore;
  await pool.close();
});

/** A custom section named "p" of `mib` MiB of zeros: bytes a compiler only carries. */
function customSection(mib: number): Uint8Array {
  const payload = Math.round(mib * 2 ** 20);
  const size = [];
  for (let n = payload + 2; ; n >>>= 7) {
    if (n < 0x80) {
      size.push(n);
      break;
    }
    size.push((n & 0x7f) | 0x80);
  }
  const bytes = new Uint8Array(1 + size.length + 2 + payload);
  bytes.set([0, ...size, 1, 0x70]);
  return bytes;
}

/** One function of `locals` i32 locals and `loops` empty loops, exported as validate. */
const localsAndLoops = (locals: number, loops: number) => module({
  memories: [{ min: 1 }], locals, functions: [[...emptyLoops(loops), ...RETURN_0]],
  exports: [{ name: 'validate', kind: 'func', index: 0 }, { name: 'memory', kind: 'memory', index: 0 }],
});

it('refuses at load a 3 KB module whose baseline compile would take 600 MB, naming the compiler and the bound', async () => {
  const bytes = localsAndLoops(50_000, 1_000);
  expect(bytes.length).toBeLessThan(4_000);
  const file = join(dir, 'locals-loops.wasm');
  await writeFile(file, bytes);
  await expect(loadPolicy(pool, { name: 'locals-loops', module: file, settings: {}, limits: DEFAULT_LIMITS, failurePolicy: 'Fail', enforcement: 'enforce', isolation: 'reuse' }))
    .rejects.toThrow(`policy "locals-loops" could not be loaded: compiling it with V8's baseline (Liftoff) compiler took more than ${TRIAL_BOUNDS.growthMiB} MiB of memory (${TRIAL_BOUNDS.growthMiB} MiB, and 16 bytes per byte of its code and 1 per byte of its data and custom sections, at most 384 MiB, for what it keeps)`);
  // The host is well: a real policy loads and answers.
  const numbers = await load(pool, 'numbers');
  expect(await evaluatePolicy(pool, numbers, 'validate', input({ object: { spec: { numbers: [500] } } }))).toMatchObject({ status: 'denied', code: 499 });
}, 60_000);

it('tries the optimising compiler too: a module within the bound for one and not the other is refused', async () => {
  // 3,000 locals × 2,000 loops: about 80 MiB in Liftoff and 135 MiB in TurboFan on Node 24.
  const bytes = localsAndLoops(3_000, 2_000);
  const verdict = await trialCompile(bytes, sha256(bytes), { ...TRIAL_BOUNDS, growthMiB: 100 });
  expect(verdict).toEqual({
    ok: false, lasting: true,
    reason: 'compiling it with V8\'s optimising (TurboFan) compiler took more than 100 MiB of memory (100 MiB, and 16 bytes per byte of its code and 1 per byte of its data and custom sections, at most 384 MiB, for what it keeps)',
  });
}, 60_000);

it('refuses a compile that takes longer than its bound', async () => {
  const bytes = await readFile(wasm('no-delete'));
  // 1 ms: the child is stopped before it has even started (by the host's timer or its own watcher).
  const verdict = await trialCompile(bytes, 'not-tried-before', { ...TRIAL_BOUNDS, liftoffMs: 1, msPerMiB: 0 });
  expect(verdict).toMatchObject({ ok: false, lasting: true, reason: 'compiling it with V8\'s baseline (Liftoff) compiler took longer than 1 ms' });
}, 60_000);

it('remembers a pass by content, on disk, for this V8: the next load does not try again', async () => {
  const bytes = await readFile(wasm('no-delete'));
  const hash = sha256(bytes);
  expect(await trialCompile(bytes, hash)).toEqual({ ok: true });
  const records = join(process.env.PORTCULLIS_CACHE!, 'compile-trials');
  const passed = (await readdir(records)).filter((name) => name.startsWith(`${hash}-v8-${process.versions.v8}-`));
  expect(passed).toHaveLength(1);
  expect(await readFile(join(records, passed[0]!), 'utf8')).toBe('passed');
  // What is read is the record, not the bytes: a record under a hostile module's hash lets it by.
  const hostile = localsAndLoops(50_000, 1_000);
  await writeFile(join(records, passed[0]!.replace(hash, sha256(hostile))), 'passed');
  expect(await trialCompile(hostile, sha256(hostile))).toEqual({ ok: true });
}, 60_000);

it('writes no pass for a module that is not valid WebAssembly: the host\'s compile refuses it, saying why', async () => {
  // (func (i32.const 0) (i32.add)): well formed, and i32.add lacks an operand.
  const bytes = Uint8Array.from([0, 0x61, 0x73, 0x6d, 1, 0, 0, 0, 1, 4, 1, 0x60, 0, 0, 3, 2, 1, 0, 10, 7, 1, 5, 0, 0x41, 0, 0x6a, 0x0b]);
  expect(await trialCompile(bytes, sha256(bytes))).toEqual({ ok: true, invalid: true });
  const records = await readdir(join(process.env.PORTCULLIS_CACHE!, 'compile-trials')).catch(() => []);
  expect(records.some((name) => name.startsWith(sha256(bytes)))).toBe(false);
  // Asked again (the load's compile() does), it is known invalid in this process: no second child.
  const before = spawned.count;
  expect(await trialCompile(bytes, sha256(bytes))).toEqual({ ok: true, invalid: true });
  expect(spawned.count).toBe(before);
  const file = join(dir, 'invalid.wasm');
  await writeFile(file, bytes);
  await expect(loadPolicy(pool, { name: 'invalid', module: file, settings: {}, limits: DEFAULT_LIMITS, failurePolicy: 'Fail', enforcement: 'enforce', isolation: 'reuse' }))
    .rejects.toThrow(/policy "invalid" could not be loaded: invalid WebAssembly: /);
}, 60_000);

it('tries several modules in one child per compiler, each within its own bounds: a runaway among them is refused alone, and the others pass', async () => {
  // A component's core modules are tried together (a dozen for a TypeScript policy).
  const small = await readFile(wasm('no-delete'));
  const hostile = localsAndLoops(50_000, 1_000);
  const other = localsAndLoops(10, 10);
  const verdicts = await trialCompileAll([
    { bytes: small, hash: 'together-small' }, { bytes: hostile, hash: 'together-hostile' }, { bytes: other, hash: 'together-other' },
  ]);
  expect(verdicts).toEqual([
    { ok: true },
    { ok: false, lasting: true, reason: expect.stringMatching(/^compiling it with V8's baseline \(Liftoff\) compiler took more than 128 MiB of memory/) as string },
    { ok: true },
  ]);
  const records = await readdir(join(process.env.PORTCULLIS_CACHE!, 'compile-trials'));
  expect(records.filter((name) => name.startsWith('together-')).map((name) => name.split('-v8-')[0]).sort()).toEqual(['together-other', 'together-small']);
  // Policies loading at once share modules: one under trial is waited for, not tried again after.
  const shared = localsAndLoops(20, 20);
  const [a, b] = await Promise.all([trialCompileAll([{ bytes: shared, hash: 'shared' }]), trialCompileAll([{ bytes: shared, hash: 'shared' }])]);
  expect(a[0]).toEqual({ ok: true });
  expect(a[0]).toBe(b[0]);
  // A load needs only the first refusal: the modules after it are left untried.
  expect(await trialCompileAll([{ bytes: hostile, hash: 'first-hostile' }, { bytes: other, hash: 'first-other' }], undefined, { firstRefusal: true }))
    .toMatchObject([{ ok: false, lasting: true }, { ok: false, untried: true, lasting: false }]);
  // One module's time bound is its own, from when its compile starts: not shared with the others.
  const late = await trialCompileAll([{ bytes: other, hash: 'late-a' }, { bytes: small, hash: 'late-b' }], { ...TRIAL_BOUNDS, liftoffMs: 1, msPerMiB: 0 });
  expect(late[0]).toMatchObject({ ok: false, lasting: true, reason: 'compiling it with V8\'s baseline (Liftoff) compiler took longer than 1 ms' });
  expect(late[1]).toMatchObject({ ok: false, lasting: true, reason: 'compiling it with V8\'s baseline (Liftoff) compiler took longer than 1 ms' });
}, 60_000);

it('lends a module nothing of what the modules before it were allowed: padding modules do not let a runaway through', async () => {
  // Reviewer: each module's allowance added the code the ones before it might keep (16 bytes per
  // byte), and two modules of 15.9 MiB of custom section, which keep nothing, lent a runaway 508 MiB.
  const pad = (mib: number) => new Uint8Array([0, 0x61, 0x73, 0x6d, 1, 0, 0, 0, ...customSection(mib)]);
  const hostile = localsAndLoops(50_000, 700); // ~200 MiB in Liftoff, alone
  const verdicts = await trialCompileAll([{ bytes: pad(15.9), hash: 'pad-a' }, { bytes: pad(15.9), hash: 'pad-b' }, { bytes: hostile, hash: 'pad-hostile' }]);
  expect(verdicts).toMatchObject([{ ok: true }, { ok: true }, { ok: false, lasting: true }]);
  expect((verdicts[2] as { reason: string }).reason).toMatch(/^compiling it with V8's baseline \(Liftoff\) compiler took more than 128 MiB of memory/);
}, 60_000);

it('counts a module\'s custom sections at one byte per byte: a runaway padded with its own does not earn room for them as code', async () => {
  // Reviewer: every byte counted as code (16 bytes of allowance each), so 32 MiB of custom section
  // carried by the runaway itself let it grow the child to 512 MiB before it was refused.
  const runaway = localsAndLoops(50_000, 700); // ~200 MiB in Liftoff, alone
  const padding = customSection(15.9);
  const bytes = new Uint8Array(runaway.length + padding.length);
  bytes.set(runaway);
  bytes.set(padding, runaway.length);
  const allowed = Math.round(allowanceOf(bytes, TRIAL_BOUNDS) / 2 ** 20);
  expect(allowed).toBe(144); // 128 + 15.9 + 16 × 3 KB (was 128 + 384)
  const [verdict] = await trialCompileAll([{ bytes, hash: 'self-padded' }]);
  expect(verdict).toMatchObject({ ok: false, lasting: true });
  expect((verdict as { reason: string }).reason).toMatch(new RegExp(`^compiling it with V8's baseline \\(Liftoff\\) compiler took more than ${allowed} MiB of memory`));
}, 60_000);

it('trusts no pass recorded before the allowance was made stricter (its record names the judgement, not only the bounds)', async () => {
  // Reviewer: passes are kept across upgrades (a cache folder on a volume); one recorded while
  // custom sections earned 16 bytes of allowance each would let that padded runaway by for good.
  const hostile = localsAndLoops(50_000, 900); // not the module another test forged a record for
  const hash = sha256(hostile);
  const records = join(process.env.PORTCULLIS_CACHE!, 'compile-trials');
  const before = `${hash}-v8-${process.versions.v8}-${sha256(Buffer.from(JSON.stringify(TRIAL_BOUNDS))).slice(0, 12)}`;
  await mkdir(records, { recursive: true });
  await writeFile(join(records, before), 'passed');
  expect(await trialCompile(hostile, hash)).toMatchObject({ ok: false, lasting: true });
}, 60_000);
