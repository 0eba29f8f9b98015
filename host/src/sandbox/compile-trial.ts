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
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { readFile, writeFile } from 'node:fs/promises';
import { setPriority } from 'node:os';
import { join } from 'node:path';
import { atomicWrite, cacheDir, sha256, touch } from '../util/files.ts';

export interface TrialBounds {
  /** What one function's compile may take, MiB: how much the child may grow beyond the code it keeps. */
  growthMiB: number;
  /** The code a compiler keeps, per byte of module: the child may grow this much more, up to keptMaxMiB. */
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
export type TrialVerdict = { ok: true; invalid?: true } | { ok: false; reason: string; lasting: boolean };

/**
 * The child: JavaScript, not a file of this package, so that Node compiles no WebAssembly of its
 * own under the trial's flags (a .ts file would make it compile its type stripper, 3 s with
 * TurboFan). The modules come on stdin, each a 4-byte length and its bytes, and are compiled one
 * after another: a component's dozen core modules cost one child per compiler, not one each
 * (each child is ~0.3 s of Node starting, which made a TypeScript policy's first load 12 s).
 * Each module has its own time, and its own memory on top of the code the modules before it may
 * keep (which a collection between modules frees anyway), all measured from the child's start. A thread
 * of its own watches the size every 2 ms, since V8 may compile on the main thread, and kills the
 * process past the bound, saying `over <i>` first; the host's event loop, busy with other
 * policies' checks, is no watchman (red team: a child watched from there reached 1.3 GB). Each
 * module ends with a line `compiled <i>`, `invalid <i>` or `over <i>`.
 */
const CHILD = `
const { Worker } = require('node:worker_threads');
const bounds = JSON.parse(process.argv[1]);
// The host's pid, passed in: a child whose host died before it started must not take init for it.
const parent = Number(process.argv[2]);
const size = () => { try { return process.memoryUsage.rss(); } catch { return process.resourceUsage().maxRSS * 1024; } };
const peak = () => process.resourceUsage().maxRSS * 1024;
const chunks = [];
process.stdin.on('data', (chunk) => chunks.push(chunk));
process.stdin.on('end', () => {
  const input = Buffer.concat(chunks);
  const modules = [];
  for (let at = 0; at + 4 <= input.length; at += 4 + input.readUInt32LE(at)) modules.push(input.subarray(at + 4, at + 4 + input.readUInt32LE(at)));
  // The module being compiled, and its bounds: index (-1 between modules), base and allowance
  // in KiB, deadline in ms from start. Shared memory, so that the watch never reads one
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
      if (Atomics.load(limit, 0) !== index) return;
      if (Date.now() - start > deadline) end('late ' + index);
      let rss;
      try { rss = process.memoryUsage.rss(); } catch { return; }
      if (rss / 1024 - base > allowance) end('over ' + index);
    }, 2);
  \`, { eval: true, workerData: { limit, parent, start } });
  watch.once('online', async () => {
    // Measured with the watching thread running: its own memory is not the modules'. Every
    // module is measured from here: the host's allowance for one includes the code the modules
    // before it may have kept, so the child as a whole stays as bounded as one trial.
    const base = Math.max(size(), peak());
    Atomics.store(limit, 1, Math.floor(base / 1024));
    for (const [index, bytes] of modules.entries()) {
      const peakBefore = peak();
      Atomics.store(limit, 2, Math.floor(bounds[index].allowance / 1024));
      Atomics.store(limit, 3, Date.now() - start + bounds[index].ms);
      Atomics.store(limit, 0, index);
      let how;
      try {
        await WebAssembly.compile(bytes);
        how = 'compiled';
      } catch {
        how = 'invalid';
      }
      Atomics.store(limit, 0, -1);
      // What was compiled is of no more use: its code goes before the next module's compile.
      globalThis.gc();
      const after = peak();
      if (after > peakBefore && after - base > bounds[index].allowance) how = 'over';
      await new Promise((resolve) => process.stdout.write(how + ' ' + index + '\\n', resolve));
      if (how === 'over') process.exit(0);
    }
    process.exit(0);
  });
});
`;

let queue: Promise<unknown> = Promise.resolve();

/**
 * Where a passed trial is recorded: per V8 version and bounds (in the name), since another V8
 * compiles differently, and other bounds must try again.
 */
function passRecord(hash: string, bounds: TrialBounds): string {
  const version = `v8-${process.versions.v8}-${sha256(Buffer.from(JSON.stringify(bounds))).slice(0, 12)}`;
  return join(cacheDir(), 'compile-trials', `${hash}-${version}`);
}

/** A module compiled before in this process is used again: its pass record counts as used (cache/prune.ts). */
export function markTrialUsed(hash: string, bounds: TrialBounds = TRIAL_BOUNDS): void {
  void touch(passRecord(hash, bounds));
}

/**
 * The trial of `bytes` (content hash `hash`), one child at a time in this process: a hostile
 * module listed many times holds one child at a time. Never throws for what the module does.
 *
 * `nice`: the child's CPU priority (Linux nice value), for a trial nobody waits on (the inline
 * lane's metered copies): QuickJS's takes seconds of TurboFan, and on a small node it took them
 * from the workers at the first burst of reviews (the overload test shed every call).
 */
export async function trialCompile(bytes: Uint8Array, hash: string, bounds: TrialBounds = TRIAL_BOUNDS, nice?: number): Promise<TrialVerdict> {
  return (await trialCompileAll([{ bytes, hash }], bounds, nice))[0]!;
}

/**
 * The trials of several modules (a component's core modules), in one child per compiler for
 * those not tried before; a verdict for each, in order. The same bounds apply to each module
 * as when it is tried alone.
 */
export async function trialCompileAll(
  modules: { bytes: Uint8Array; hash: string }[], bounds: TrialBounds = TRIAL_BOUNDS, nice?: number,
): Promise<TrialVerdict[]> {
  // Read outside the queue: modules tried before do not wait behind a hostile one's bounds.
  const passed = await Promise.all(modules.map(async ({ hash }) => {
    const record = passRecord(hash, bounds);
    if (!await readFile(record, 'utf8').then((text) => text === 'passed', () => false)) return false;
    void touch(record);
    return true;
  }));
  // Each content once: a component may carry the same module twice.
  const todo = new Map<string, Uint8Array>();
  for (const [i, { bytes, hash }] of modules.entries()) if (!passed[i]) todo.set(hash, bytes);
  let verdicts = new Map<string, TrialVerdict>();
  if (todo.size > 0) {
    const run = () => trial([...todo].map(([hash, bytes]) => ({ bytes, record: passRecord(hash, bounds) })), bounds, nice)
      .then((list) => new Map([...todo.keys()].map((hash, i) => [hash, list[i]!])));
    // Trials nobody waits on queue apart: starved at the lowest priority, one must not hold a load's.
    if (nice !== undefined) {
      const background = backgroundQueue.then(run);
      backgroundQueue = background.catch(() => undefined);
      verdicts = await background;
    } else {
      const next = queue.then(run);
      queue = next.catch(() => undefined);
      verdicts = await next;
    }
  }
  return modules.map(({ hash }, i) => (passed[i] ? { ok: true } : verdicts.get(hash)!));
}

async function trial(modules: { bytes: Uint8Array; record: string }[], bounds: TrialBounds, nice: number | undefined): Promise<TrialVerdict[]> {
  const kept = (bytes: Uint8Array) => Math.min(bounds.keptPerByte * bytes.length, bounds.keptMaxMiB * 2 ** 20);
  const allowances = modules.map(({ bytes }) => (bounds.growthMiB * 2 ** 20) + kept(bytes));
  const verdicts: (TrialVerdict | undefined)[] = modules.map(() => undefined);
  for (const compiler of COMPILERS) {
    // The modules still in the running, from the first: a child stopped by one module's bounds
    // answers for the modules before it, and the ones after go to the next child.
    let left = modules.flatMap((_, i) => (verdicts[i] === undefined ? [i] : []));
    while (left.length > 0) {
      // Each module's allowance in the child adds the code the modules before it may keep.
      let keptBefore = 0;
      const limits = left.map((i) => {
        const limit = {
          allowance: allowances[i]! + keptBefore,
          ms: Math.min(bounds.maxMs, compiler.ms(bounds) + Math.ceil((modules[i]!.bytes.length / 2 ** 20) * bounds.msPerMiB)),
        };
        keptBefore += kept(modules[i]!.bytes);
        return limit;
      });
      const answers = await runChild(left.map((i) => modules[i]!.bytes), compiler.flag, limits, nice);
      for (const [j, answer] of answers.entries()) {
        const i = left[j]!;
        if (answer === 'invalid') verdicts[i] = { ok: true, invalid: true };
        else if (answer !== 'compiled') {
          const reason = answer.reason === 'over'
            ? `took more than ${Math.round(allowances[i]! / 2 ** 20)} MiB of memory (${bounds.growthMiB} MiB, ` +
              `and ${bounds.keptPerByte} bytes per byte of module, at most ${bounds.keptMaxMiB} MiB, for the code it keeps)`
            : answer.reason === 'late' ? `took longer than ${duration(limits[j]!.ms)}` : answer.reason;
          verdicts[i] = { ok: false, lasting: answer.lasting, reason: `compiling it with V8's ${compiler.name} compiler ${reason}` };
        }
      }
      left = left.slice(answers.length);
    }
  }
  return Promise.all(modules.map(async ({ record }, i) => {
    const verdict = verdicts[i];
    if (verdict) return verdict;
    // A cache that cannot be written costs the next load another trial, nothing else.
    await atomicWrite(record, 'passed').catch(() => undefined);
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
 * Runs one child over `modules`, in order. Answers for a prefix of them, at least one: every
 * module the child finished, then, if it stopped early, the one it was compiling (or the first,
 * when it could not start).
 */
function runChild(modules: Uint8Array[], flag: string, limits: { allowance: number; ms: number }[], nice: number | undefined): Promise<ChildAnswer[]> {
  return new Promise((resolve) => {
    const args = [
      '--no-wasm-lazy-compilation', flag, '--wasm-num-compilation-tasks=1', '--expose-gc', '--no-warnings', '-e', CHILD, JSON.stringify(limits), String(process.pid),
    ];
    // Started through nice(1), so that every thread of the child (V8's compiler threads start
    // with it) has the priority; where nice is missing, the child's main thread gets it after.
    const niced = nice !== undefined && NICE_BINARY !== undefined;
    const child = spawn(niced ? NICE_BINARY : process.execPath, niced ? ['-n', String(nice), process.execPath, ...args] : args,
      { stdio: ['pipe', 'pipe', 'pipe'], env: { ...process.env, NODE_OPTIONS: '' } });
    // Linux: the child, not the host, is the one to go when memory runs out.
    if (child.pid !== undefined) writeFile(`/proc/${child.pid}/oom_score_adj`, '1000').catch(() => undefined);
    if (child.pid !== undefined && nice !== undefined && !niced) {
      try {
        setPriority(child.pid, nice);
      } catch {
        // The host's own priority, as any trial.
      }
    }
    let out = '';
    let err = '';
    let timedOut = false;
    // The whole run: each module's time, one after another. The child's watch stops a module
    // past its own time; this stops a child that never got that far.
    const totalMs = limits.reduce((sum, { ms }) => sum + ms, 0);
    const timer = setTimeout(() => {
      timedOut = true;
      child.kill('SIGKILL');
    }, totalMs);
    child.stdout.on('data', (chunk: Buffer) => {
      if (out.length < 64 + modules.length * 16) out += chunk.toString('utf8');
    });
    child.stderr.on('data', (chunk: Buffer) => {
      if (err.length < 16 * 1024) err += chunk.toString('utf8');
    });
    child.stdin.on('error', () => undefined); // a child that dies early closes its stdin
    for (const bytes of modules) {
      const length = Buffer.alloc(4);
      length.writeUInt32LE(bytes.length);
      child.stdin.write(length);
      child.stdin.write(bytes);
    }
    child.stdin.end();
    let settled = false;
    const settle = (answers: ChildAnswer[]) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      resolve(answers);
    };
    child.on('error', (error) => settle([{ ok: false, reason: `could not be tried: ${error.message}`, lasting: false }]));
    child.on('close', (code, signal) => {
      const answers: ChildAnswer[] = [];
      let stop: string | undefined;
      for (const line of out.split('\n')) {
        const [how, at] = line.trim().split(' ');
        if (at !== String(answers.length)) continue;
        if (how === 'compiled' || how === 'invalid') answers.push(how);
        else if (how === 'over' || how === 'late') {
          stop = how;
          break;
        }
      }
      if (answers.length === modules.length && stop === undefined) return settle(answers);
      if (stop === 'over') return settle([...answers, { ok: false, reason: 'over', lasting: true }]);
      if (timedOut || stop === 'late') return settle([...answers, { ok: false, reason: 'late', lasting: true }]);
      // Killed from outside or failed: the machine's doing as much as the module's, so not
      // remembered. Node ends an uncaught error's report with its version: the first line that
      // names an error says more.
      if (signal === 'SIGKILL') {
        return settle([...answers, { ok: false, reason: 'was killed (SIGKILL), most likely by the kernel for want of memory in the Pod or on the machine; it is tried again at the next load', lasting: false }]);
      }
      const lines = err.split('\n').map((l) => l.trim()).filter((l) => l !== '');
      const said = (lines.find((l) => /error/i.test(l)) ?? lines[0] ?? 'no message').slice(0, 300);
      settle([...answers, { ok: false, reason: `failed (${signal ?? `exit ${code}`}): ${said}`, lasting: false }]);
    });
  });
}
