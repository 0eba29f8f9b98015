// Compiles every function of a core module once, with each of V8's two compilers, in a child
// process bounded in memory and time, before the host compiles it for real. V8 compiles a
// policy's functions later, in the workers: the baseline compiler (Liftoff) on a function's first
// call, the optimising one (TurboFan) on background threads once it is hot. What either takes is
// not bounded by the module's size or by any cap of the sandbox, and neither stops when the
// worker is terminated (red team: a 15 KB module of 50,000 locals and 5,000 loops took 2.9 GB in
// Liftoff; one 7.6 MB function took 2 GB in TurboFan on a background thread, seconds after its
// call had returned). The trial makes the same compiles where a runaway costs a child process,
// and refuses the module; a module that passes is remembered by content, on disk, so a restart
// or another policy with the same bytes (every TypeScript policy's QuickJS) does not pay again.
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { existsSync } from 'node:fs';
import { readFile, writeFile } from 'node:fs/promises';
import { setPriority } from 'node:os';
import { join } from 'node:path';
import { atomicWrite, cacheDir, sha256, touch, touchedAt } from '../util/files.ts';
import { readLayout } from './memory-cap.ts';

export interface TrialBounds {
  /** What one function's compile may take, MiB: how much the child may grow beyond the code it keeps. */
  growthMiB: number;
  /** The code a compiler keeps, per byte of code (data and custom sections: one byte per byte; see allowanceOf), up to keptMaxMiB. */
  keptPerByte: number;
  keptMaxMiB: number;
  /** Per compiler: a fixed part and a part per MiB of module, ms, at most maxMs in all. */
  liftoffMs: number;
  turbofanMs: number;
  msPerMiB: number;
  maxMs: number;
}

/**
 * One function at a time (one compile task), as a worker compiles. Measured on Node 24: QuickJS
 * (1.3 MB, every TypeScript policy's runtime) grows the child by 9 MiB in 0.1 s with Liftoff and
 * 36 MiB in 2 s with TurboFan; SpiderMonkey (10 MB) by 58 MiB in 0.4 s and 146 MiB in 14 s.
 * What TurboFan keeps is about 15 bytes per byte of module: 16 leaves room, up to 384 MiB (a
 * 24 MiB module), so that a trial beside the host stays well inside a 1 GiB Pod. At run time V8 may
 * compile a few functions at once (each worker's Liftoff, and TurboFan on Node's four background
 * threads), so the host's worst case is several times growthMiB, not one.
 */
export const TRIAL_BOUNDS: TrialBounds = {
  growthMiB: 128, keptPerByte: 16, keptMaxMiB: 384, liftoffMs: 10_000, turbofanMs: 30_000, msPerMiB: 3_000, maxMs: 60_000,
};

const COMPILERS = [
  { name: 'baseline (Liftoff)', flag: '--liftoff-only', ms: (b: TrialBounds) => b.liftoffMs },
  { name: 'optimising (TurboFan)', flag: '--no-liftoff', ms: (b: TrialBounds) => b.turbofanMs },
] as const;

/**
 * A module passes its trial when both compilers stay in bounds. WebAssembly the child finds
 * invalid passes as `invalid`: the host's own compile says why, and must refuse it too.
 */
export type TrialVerdict = { ok: true; invalid?: true } | { ok: false; reason: string; lasting: boolean; untried?: true };

/**
 * The child: JavaScript, not a file of this package, so that Node compiles no WebAssembly of its
 * own under the trial's flags (a .ts file would make it compile its type stripper, 3 s with
 * TurboFan). It compiles a component's core modules one after another: one child per compiler,
 * not one per module (each child is ~0.3 s of Node starting, which made a TypeScript policy's
 * first load 12 s). On stdin: a 4-byte length, a JSON header (each module's bounds), then
 * each module as a 4-byte length and its bytes.
 *
 * Each module is measured from the child's start against its own allowance (with a collection
 * between modules): what the modules before it used and let go is no room for it (reviewer: 32
 * MiB of padding modules lent a runaway 508 MiB), and memory they left behind counts against
 * it, which is why the host has a module refused after others tried again in a child of its
 * own (trial()). A thread of its own watches the
 * size every 2 ms, since V8 may compile on the main thread, and kills the process past a bound,
 * saying `over <i>` first; the host's event loop, busy with other policies' checks, is no
 * watchman (red team: a child watched from there reached 1.3 GB). The peak is checked again
 * after each compile (Linux's VmHWM, reset per module). Each module ends with a line
 * `compiled <i>`, `invalid <i>` or `over <i>`.
 */
const CHILD = `
const { Worker } = require('node:worker_threads');
const { readFileSync, writeFileSync } = require('node:fs');
// The host's pid, passed in: a child whose host died before it started must not take init for it.
const parent = Number(process.argv[1]);
const size = () => { try { return process.memoryUsage.rss(); } catch { return process.resourceUsage().maxRSS * 1024; } };
// The peak since the last reset where Linux lets a process reset it; else the peak since the start.
const resetPeak = () => { try { writeFileSync('/proc/self/clear_refs', '5'); return true; } catch { return false; } };
const peak = (reset) => {
  if (reset) try { const m = /VmHWM:\\s+(\\d+) kB/.exec(readFileSync('/proc/self/status', 'utf8')); if (m) return Number(m[1]) * 1024; } catch {}
  return process.resourceUsage().maxRSS * 1024;
};
const chunks = [];
process.stdin.on('data', (chunk) => chunks.push(chunk));
process.stdin.on('end', () => {
  const input = Buffer.concat(chunks);
  const headerEnd = 4 + input.readUInt32LE(0);
  const { limits } = JSON.parse(input.subarray(4, headerEnd).toString('utf8'));
  const modules = [];
  for (let at = headerEnd; at + 4 <= input.length; at += 4 + input.readUInt32LE(at)) modules.push(input.subarray(at + 4, at + 4 + input.readUInt32LE(at)));
  // The module being compiled (-1 between modules), the child's base and the module's allowance
  // in KiB, its deadline in ms from the start. Shared memory, so that the watch never reads one
  // module's bounds while the next compiles.
  const limit = new Int32Array(new SharedArrayBuffer(16));
  limit[0] = -1;
  const start = Date.now();
  const watch = new Worker(\`
    const { workerData } = require('node:worker_threads');
    const { writeSync } = require('node:fs');
    const { limit, parent, start } = workerData;
    // Written if the host still reads it: to a host that is gone the write fails, and the kill must not wait on it.
    const end = (why) => { try { writeSync(1, why + '\\\\n'); } catch {} process.kill(process.pid, 'SIGKILL'); };
    setInterval(() => {
      // The host's timer and the host itself may be gone (killed mid-trial): time is watched here too.
      if (process.ppid !== parent) end('orphan');
      const index = Atomics.load(limit, 0);
      if (index < 0) return;
      const base = Atomics.load(limit, 1), allowance = Atomics.load(limit, 2), deadline = Atomics.load(limit, 3);
      let rss;
      try { rss = process.memoryUsage.rss() / 1024; } catch { rss = undefined; }
      const now = Date.now();
      // Read between two looks at the index: a module that ended meanwhile is not judged by the next one's size.
      if (Atomics.load(limit, 0) !== index) return;
      if (now - start > deadline) end('late ' + index);
      if (rss !== undefined && rss - base > allowance) end('over ' + index);
    }, 2);
  \`, { eval: true, workerData: { limit, parent, start } });
  watch.once('online', async () => {
    // Measured with the watching thread running: its own memory is not the modules'.
    const base = Math.max(size(), peak(false));
    Atomics.store(limit, 1, Math.floor(base / 1024));
    for (const [index, bytes] of modules.entries()) {
      const reset = resetPeak();
      const peakBefore = peak(reset);
      Atomics.store(limit, 2, Math.floor(limits[index].allowance / 1024));
      Atomics.store(limit, 3, Date.now() - start + limits[index].ms);
      Atomics.store(limit, 0, index);
      let how;
      try {
        await WebAssembly.compile(bytes);
        how = 'compiled';
      } catch {
        how = 'invalid';
      }
      Atomics.store(limit, 0, -1);
      const after = peak(reset);
      if ((reset || after > peakBefore) && after - base > limits[index].allowance) how = 'over';
      await new Promise((resolve) => process.stdout.write(how + ' ' + index + '\\n', resolve));
      if (how === 'over') process.exit(0);
      // What was compiled is of no more use: its code goes before the next module's compile.
      globalThis.gc();
    }
    process.exit(0);
  });
});
`;

let queue: Promise<unknown> = Promise.resolve();

/**
 * How a trial judges a module, beyond its bounds: raised when that changes, so that a pass
 * recorded under a looser judgement is not trusted (2: data and custom sections earn one byte of
 * allowance per byte, see allowanceOf; a module padded with them passed with more before).
 */
const TRIAL_REVISION = 2;

/**
 * Where a passed trial is recorded: per V8 version, bounds and revision (in the name), since
 * another V8 compiles differently, and other bounds or another judgement must try again.
 */
function passRecord(hash: string, bounds: TrialBounds): string {
  const judged = JSON.stringify({ ...bounds, revision: TRIAL_REVISION });
  const version = `v8-${process.versions.v8}-${sha256(Buffer.from(judged)).slice(0, 12)}`;
  return join(cacheDir(), 'compile-trials', `${hash}-${version}`);
}

/** A module compiled before in this process is used again: its pass record counts as used (cache/prune.ts). */
export function markTrialUsed(hash: string, bounds: TrialBounds = TRIAL_BOUNDS): void {
  used(passRecord(hash, bounds));
}

/** Marks a pass record used, at most once a minute: loads touch the same records many times over. */
function used(record: string): void {
  if ((touchedAt(record) ?? 0) < Date.now() - 60_000) void touch(record);
}

/**
 * Pass records read or written by this process, which are not read again: every TypeScript
 * policy's load asks for the same dozen, twice (prepare.ts tries a component's modules
 * together, then compiles them one by one).
 */
const passedHere = new Set<string>();
const MAX_PASSED_HERE = 10_000;

function passedNow(record: string): void {
  if (passedHere.size >= MAX_PASSED_HERE) passedHere.clear();
  passedHere.add(record);
}

/**
 * Modules V8 found invalid in a trial of this process: nothing is written for them on disk, and
 * the load's own compile() asked for a second trial, one more child, before refusing them.
 */
const invalidHere = new Set<string>();

/**
 * The trial of `bytes` (content hash `hash`), one child at a time in this process: a hostile
 * module listed many times holds one child at a time. Never throws for what the module does.
 *
 * `nice`: the child's CPU priority (Linux nice value), for a trial nobody waits on (the inline
 * lane's metered copies): QuickJS's takes seconds of TurboFan, and on a small node it took them
 * from the workers at the first burst of reviews (the overload test shed every call).
 */
export async function trialCompile(bytes: Uint8Array, hash: string, bounds: TrialBounds = TRIAL_BOUNDS, nice?: number): Promise<TrialVerdict> {
  return (await trialCompileAll([{ bytes, hash }], bounds, nice === undefined ? {} : { nice }))[0]!;
}

/**
 * The trials of several modules (a component's core modules), in one child per compiler for
 * those not tried before; a verdict for each, in order. The same bounds apply to each module
 * as when it is tried alone. `firstRefusal`: stop at the first module refused (a load needs no
 * more), leaving the rest `untried`; a component of runaways must not hold the queue for each.
 */
export async function trialCompileAll(
  modules: { bytes: Uint8Array; hash: string }[], bounds: TrialBounds = TRIAL_BOUNDS, options: { nice?: number; firstRefusal?: boolean } = {},
): Promise<TrialVerdict[]> {
  // Read outside the queue: modules tried before do not wait behind a hostile one's bounds.
  const passed = await Promise.all(modules.map(async ({ hash }): Promise<TrialVerdict | undefined> => {
    const record = passRecord(hash, bounds);
    // Found invalid by V8 here before: the load refuses it on its own compile, with no child.
    if (invalidHere.has(record)) return { ok: true, invalid: true };
    if (!passedHere.has(record)) {
      if (!await readFile(record, 'utf8').then((text) => text === 'passed', () => false)) return undefined;
      passedNow(record);
    }
    used(record);
    return { ok: true };
  }));
  // Each content once: a component may carry the same module twice, and policies loading at
  // once share their modules (every TypeScript policy's QuickJS): one that is being tried
  // already is waited for, not tried again after it.
  const lane = options.nice === undefined ? '' : ' (background)';
  const todo = new Map<string, Uint8Array>();
  const verdicts = new Map<string, Promise<TrialVerdict>>();
  for (const [i, { bytes, hash }] of modules.entries()) {
    if (passed[i] !== undefined || verdicts.has(hash)) continue;
    const underway = trying.get(passRecord(hash, bounds) + lane);
    // Left untried by a batch that stopped at another module's refusal: tried here after all.
    const again = async (verdict: TrialVerdict) => (!verdict.ok && verdict.untried ? (await trialCompileAll([{ bytes, hash }], bounds, options))[0]! : verdict);
    if (underway) verdicts.set(hash, underway.then(again));
    else todo.set(hash, bytes);
  }
  if (todo.size > 0) {
    const list = [...todo].map(([hash, bytes]) => ({ hash, bytes, record: passRecord(hash, bounds) }));
    const run = () => trial(list, bounds, options.nice, options.firstRefusal ?? false);
    // Trials nobody waits on queue apart: starved at the lowest priority, one must not hold a load's.
    let answers: Promise<TrialVerdict[]>;
    if (options.nice !== undefined) {
      answers = backgroundQueue.then(run);
      backgroundQueue = answers.catch(() => undefined);
    } else {
      answers = queue.then(run);
      queue = answers.catch(() => undefined);
    }
    for (const [i, { hash, record }] of list.entries()) {
      const verdict = answers.then((all) => all[i]!);
      verdicts.set(hash, verdict);
      trying.set(record + lane, verdict);
      void verdict.finally(() => trying.delete(record + lane)).catch(() => undefined);
    }
  }
  return Promise.all(modules.map(async ({ hash }, i) => passed[i] ?? verdicts.get(hash)!));
}
/** Trials under way, by pass record (and lane): a module is tried by one batch at a time. */
const trying = new Map<string, Promise<TrialVerdict>>();

async function trial(
  modules: { bytes: Uint8Array; record: string }[], bounds: TrialBounds, nice: number | undefined, firstRefusal: boolean,
): Promise<TrialVerdict[]> {
  const allowances = modules.map(({ bytes }) => allowanceOf(bytes, bounds));
  const verdicts: (TrialVerdict | undefined)[] = modules.map(() => undefined);
  let refused = false;
  for (const compiler of COMPILERS) {
    // The modules still in the running, from the first: a child stopped by one module's bounds
    // answers for the modules before it, and the ones after go to the next child.
    let left = modules.flatMap((_, i) => (verdicts[i] === undefined ? [i] : []));
    while (left.length > 0 && !(firstRefusal && refused)) {
      const limits = left.map((i) => ({
        allowance: allowances[i]!,
        ms: Math.min(bounds.maxMs, compiler.ms(bounds) + Math.ceil((modules[i]!.bytes.length / 2 ** 20) * bounds.msPerMiB)),
      }));
      const answers = await runChild(left.map((i) => modules[i]!.bytes), compiler.flag, limits, nice);
      let done = answers.length;
      for (const [j, answer] of answers.entries()) {
        const i = left[j]!;
        if (answer === 'invalid') {
          verdicts[i] = { ok: true, invalid: true };
          if (invalidHere.size >= MAX_PASSED_HERE) invalidHere.clear();
          invalidHere.add(modules[i]!.record);
        }
        else if (answer !== 'compiled') {
          // Stopped after other modules in the same child, it may owe some of its size or time to
          // them (memory they freed and the allocator kept, a stall between modules): only a child
          // that began with it has the last word, or one module could have another refused.
          if (j > 0) {
            done = j;
            break;
          }
          const reason = answer.reason === 'over'
            ? `took more than ${Math.round(allowances[i]! / 2 ** 20)} MiB of memory (${bounds.growthMiB} MiB, ` +
              `and ${bounds.keptPerByte} bytes per byte of its code and 1 per byte of its data and custom sections, at most ${bounds.keptMaxMiB} MiB, for what it keeps)`
            : answer.reason === 'late' ? `took longer than ${duration(limits[j]!.ms)}` : answer.reason;
          verdicts[i] = { ok: false, lasting: answer.lasting, reason: `compiling it with V8's ${compiler.name} compiler ${reason}` };
          refused = true;
        }
      }
      left = left.slice(done);
    }
  }
  return Promise.all(modules.map(async ({ record }, i) => {
    const verdict = verdicts[i];
    if (verdict) return verdict;
    if (firstRefusal && refused) return { ok: false, untried: true, lasting: false, reason: 'it was not tried: another module was refused first' } as const;
    // A cache that cannot be written costs the next load another trial, nothing else.
    await atomicWrite(record, 'passed').catch(() => undefined);
    passedNow(record);
    return { ok: true } as const;
  }));
}

function duration(ms: number): string {
  return ms >= 1000 ? `${Math.round(ms / 1000)} s` : `${ms} ms`;
}

/** What the child says of one module: `over` and `late` are worded by the caller, with the module's bounds. */
type ChildAnswer = 'compiled' | 'invalid' | { ok: false; reason: string; lasting: boolean };

let backgroundQueue: Promise<unknown> = Promise.resolve();
/** nice(1), where the system has it (coreutils: every Linux image this ships in). */
const NICE_BINARY = ['/usr/bin/nice', '/bin/nice'].find((path) => existsSync(path));

/**
 * What a module may grow the child by. Compilers keep code in proportion to the bytes they
 * compile; data segments and custom sections are only carried (V8 keeps a copy of the module's
 * bytes), so they earn one byte per byte. Counted at the code's rate, 32 MiB of custom section
 * let a runaway grow the child to 512 MiB before its refusal (review of 130f23d). Measured on
 * Node 24 (eager, one task): QuickJS grows it by 8 and 32 MiB; the 430 KB data-only modules of a
 * TypeScript policy by under 1 MiB with either compiler.
 */
export function allowanceOf(bytes: Uint8Array, bounds: TrialBounds): number {
  // A module readLayout refuses is refused before its trial; here it just earns no such discount.
  let carried = 0;
  try {
    carried = readLayout(bytes).carriedBytes;
  } catch {
    // counted as code
  }
  return bounds.growthMiB * 2 ** 20 + Math.min(bounds.keptPerByte * (bytes.length - carried) + carried, bounds.keptMaxMiB * 2 ** 20);
}

/**
 * Runs one child over `modules`, in order. Answers for a prefix of them, at least one: every
 * module the child finished, then, if it stopped early, the one it was compiling (or the first,
 * when it could not start).
 */
function runChild(modules: Uint8Array[], flag: string, limits: { allowance: number; ms: number }[], nice: number | undefined): Promise<ChildAnswer[]> {
  return new Promise((resolve) => {
    const args = ['--no-wasm-lazy-compilation', flag, '--wasm-num-compilation-tasks=1', '--expose-gc', '--no-warnings', '-e', CHILD, String(process.pid)];
    // Started through nice(1), so that every thread of the child (V8's compiler threads start
    // with it) has the priority; where nice is missing, the child's main thread gets it after.
    const niced = nice !== undefined && NICE_BINARY !== undefined;
    let child: ChildProcessWithoutNullStreams;
    try {
      child = spawn(niced ? NICE_BINARY : process.execPath, niced ? ['-n', String(nice), process.execPath, ...args] : args,
        { stdio: ['pipe', 'pipe', 'pipe'], env: { ...process.env, NODE_OPTIONS: '' } });
    } catch (error) {
      return resolve([{ ok: false, reason: `could not be tried: ${error instanceof Error ? error.message : String(error)}`, lasting: false }]);
    }
    // Linux: the child, not the host, is the one to go when memory runs out.
    if (child.pid !== undefined) writeFile(`/proc/${child.pid}/oom_score_adj`, '1000').catch(() => undefined);
    if (child.pid !== undefined && nice !== undefined && !niced) {
      try {
        setPriority(child.pid, nice);
      } catch {
        // The host's own priority, as any trial.
      }
    }
    const answers: ChildAnswer[] = [];
    let stop: 'over' | 'late' | undefined;
    let pending = '';
    let err = '';
    let timedOut = false;
    // The module under way's own time, from when the one before it ended (from the start for the
    // first). The child's watch stops a module past it; this stops a child that never got that far.
    let timer: NodeJS.Timeout | undefined;
    let armedFor = -1;
    const arm = () => {
      if (armedFor === answers.length && stop === undefined) return;
      armedFor = answers.length;
      clearTimeout(timer);
      const next = limits[answers.length];
      timer = next && stop === undefined ? setTimeout(() => {
        timedOut = true;
        child.kill('SIGKILL');
      }, next.ms) : undefined;
    };
    arm();
    // And the child as a whole, for what no module's time covers (between modules, after the last).
    const backstop = setTimeout(() => {
      timedOut = true;
      child.kill('SIGKILL');
    }, limits.reduce((sum, { ms }) => sum + ms, 10_000));
    child.stdout.on('data', (chunk: Buffer) => {
      if (stop !== undefined || pending.length > 1024) return;
      pending += chunk.toString('utf8');
      const lines = pending.split('\n');
      pending = lines.pop()!;
      for (const line of lines) {
        const [how, at] = line.trim().split(' ');
        if (stop !== undefined || at !== String(answers.length)) continue;
        if (how === 'compiled' || how === 'invalid') answers.push(how);
        else if (how === 'over' || how === 'late') stop = how;
      }
      arm();
    });
    child.stderr.on('data', (chunk: Buffer) => {
      if (err.length < 16 * 1024) err += chunk.toString('utf8');
    });
    child.stdin.on('error', () => undefined); // a child that dies early closes its stdin
    const header = Buffer.from(JSON.stringify({ limits }));
    for (const part of [header, ...modules]) {
      const length = Buffer.alloc(4);
      length.writeUInt32LE(part.length);
      child.stdin.write(length);
      child.stdin.write(part);
    }
    child.stdin.end();
    let settled = false;
    const settle = (more: ChildAnswer[]) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      clearTimeout(backstop);
      resolve([...answers, ...more]);
    };
    child.on('error', (error) => settle(answers.length > 0 ? [] : [{ ok: false, reason: `could not be tried: ${error.message}`, lasting: false }]));
    child.on('close', (code, signal) => {
      if (answers.length === modules.length && stop === undefined) return settle([]);
      if (stop === 'over') return settle([{ ok: false, reason: 'over', lasting: true }]);
      if (timedOut || stop === 'late') return settle([{ ok: false, reason: 'late', lasting: true }]);
      // Killed from outside or failed: the machine's doing as much as the module's, so not
      // remembered. Node ends an uncaught error's report with its version: the first line that
      // names an error says more.
      if (signal === 'SIGKILL') {
        return settle([{ ok: false, reason: 'was killed (SIGKILL), most likely by the kernel for want of memory in the Pod or on the machine; it is tried again at the next load', lasting: false }]);
      }
      const lines = err.split('\n').map((l) => l.trim()).filter((l) => l !== '');
      const said = (lines.find((l) => /error/i.test(l)) ?? lines[0] ?? 'no message').slice(0, 300);
      settle([{ ok: false, reason: `failed (${signal ?? `exit ${code}`}): ${said}`, lasting: false }]);
    });
  });
}
