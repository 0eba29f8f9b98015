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
 * TurboFan). The module comes on stdin. A thread of its own watches its size every 2 ms, since
 * V8 may compile on the main thread, and kills the process past the bound, saying `over` first;
 * the host's event loop, busy with other policies' checks, is no watchman (red team: a child
 * watched from there reached 1.3 GB). The last line on stdout says how it ended.
 */
const CHILD = `
const { Worker } = require('node:worker_threads');
const allowance = Number(process.argv[1]);
const deadline = Date.now() + Number(process.argv[2]);
// The host's pid, passed in: a child whose host died before it started must not take init for it.
const parent = Number(process.argv[3]);
const size = () => { try { return process.memoryUsage.rss(); } catch { return process.resourceUsage().maxRSS * 1024; } };
const chunks = [];
process.stdin.on('data', (chunk) => chunks.push(chunk));
process.stdin.on('end', () => {
  const bytes = Buffer.concat(chunks);
  const watch = new Worker(\`
    const { parentPort, workerData } = require('node:worker_threads');
    const { writeSync } = require('node:fs');
    // Written if the host still reads it: to a host that is gone the write fails, and the kill must not wait on it.
    const end = (why) => { try { writeSync(1, why + '\\\\n'); } catch {} process.kill(process.pid, 'SIGKILL'); };
    parentPort.once('message', (base) => setInterval(() => {
      // The host's timer and the host itself may be gone (killed mid-trial): time is watched here too.
      if (Date.now() > workerData.deadline) end('late');
      if (process.ppid !== workerData.parent) end('orphan');
      let rss;
      try { rss = process.memoryUsage.rss(); } catch { return; }
      if (rss - base > workerData.allowance) end('over');
    }, 2));
  \`, { eval: true, workerData: { allowance, deadline, parent } });
  watch.once('online', () => {
    // Measured with the watching thread running: its own memory is not the module's.
    const base = Math.max(size(), process.resourceUsage().maxRSS * 1024);
    watch.postMessage(base);
    const end = (how) => () => {
      const grew = process.resourceUsage().maxRSS * 1024 - base;
      process.stdout.on('error', () => process.exit(0));
      process.stdout.write((grew > allowance ? 'over' : how) + '\\n', () => process.exit(0));
    };
    WebAssembly.compile(bytes).then(end('compiled'), end('invalid'));
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
 * The trial of `bytes` (content hash `hash`), one at a time in this process: a hostile module
 * listed many times holds one child at a time. Never throws for what the module does.
 */
/**
 * `nice`: the child's CPU priority (Linux nice value), for a trial nobody waits on (the inline
 * lane's metered copies): QuickJS's takes seconds of TurboFan, and on a small node it took them
 * from the workers at the first burst of reviews (the overload test shed every call).
 */
export async function trialCompile(bytes: Uint8Array, hash: string, bounds: TrialBounds = TRIAL_BOUNDS, nice?: number): Promise<TrialVerdict> {
  // Read outside the queue: modules tried before do not wait behind a hostile one's bounds.
  const passed = passRecord(hash, bounds);
  if (await readFile(passed, 'utf8').then((text) => text === 'passed', () => false)) {
    void touch(passed);
    return { ok: true };
  }
  // Trials nobody waits on queue apart: starved at the lowest priority, one must not hold a load's.
  if (nice !== undefined) {
    const background = backgroundQueue.then(() => trial(bytes, passed, bounds, nice));
    backgroundQueue = background.catch(() => undefined);
    return background;
  }
  const run = queue.then(() => trial(bytes, passed, bounds, nice));
  queue = run.catch(() => undefined);
  return run;
}

async function trial(bytes: Uint8Array, passed: string, bounds: TrialBounds, nice: number | undefined): Promise<TrialVerdict> {
  const allowance = (bounds.growthMiB * 2 ** 20) + Math.min(bounds.keptPerByte * bytes.length, bounds.keptMaxMiB * 2 ** 20);
  const over = `took more than ${Math.round(allowance / 2 ** 20)} MiB of memory (${bounds.growthMiB} MiB, ` +
    `and ${bounds.keptPerByte} bytes per byte of module, at most ${bounds.keptMaxMiB} MiB, for the code it keeps)`;
  for (const compiler of COMPILERS) {
    const timeoutMs = Math.min(bounds.maxMs, compiler.ms(bounds) + Math.ceil((bytes.length / 2 ** 20) * bounds.msPerMiB));
    const verdict = await runChild(bytes, compiler.flag, { allowance, over, timeoutMs, nice });
    if (verdict === 'invalid') return { ok: true, invalid: true };
    if (verdict !== 'compiled') return { ...verdict, reason: `compiling it with V8's ${compiler.name} compiler ${verdict.reason}` };
  }
  // A cache that cannot be written costs the next load another trial, nothing else.
  await atomicWrite(passed, 'passed').catch(() => undefined);
  return { ok: true };
}

type ChildVerdict = 'compiled' | 'invalid' | { ok: false; reason: string; lasting: boolean };

let backgroundQueue: Promise<unknown> = Promise.resolve();
/** nice(1), where the system has it (coreutils: every Linux image this ships in). */
const NICE_BINARY = ['/usr/bin/nice', '/bin/nice'].find((path) => existsSync(path));

function runChild(
  bytes: Uint8Array, flag: string, { allowance, over, timeoutMs, nice }: { allowance: number; over: string; timeoutMs: number; nice: number | undefined },
): Promise<ChildVerdict> {
  return new Promise((resolve) => {
    const args = [
      '--no-wasm-lazy-compilation', flag, '--wasm-num-compilation-tasks=1', '--no-warnings', '-e', CHILD, String(allowance), String(timeoutMs), String(process.pid),
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
    const timer = setTimeout(() => {
      timedOut = true;
      child.kill('SIGKILL');
    }, timeoutMs);
    child.stdout.on('data', (chunk: Buffer) => {
      if (out.length < 1024) out += chunk.toString('utf8');
    });
    child.stderr.on('data', (chunk: Buffer) => {
      if (err.length < 16 * 1024) err += chunk.toString('utf8');
    });
    child.stdin.on('error', () => undefined); // a child that dies early closes its stdin
    child.stdin.end(bytes);
    let settled = false;
    const settle = (verdict: ChildVerdict) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      resolve(verdict);
    };
    child.on('error', (error) => settle({ ok: false, reason: `could not be tried: ${error.message}`, lasting: false }));
    child.on('close', (code, signal) => {
      const last = out.trim().split('\n').at(-1);
      if (last === 'over') return settle({ ok: false, reason: over, lasting: true });
      if (timedOut || last === 'late') {
        return settle({ ok: false, reason: `took longer than ${timeoutMs >= 1000 ? `${Math.round(timeoutMs / 1000)} s` : `${timeoutMs} ms`}`, lasting: true });
      }
      if (code === 0 && (last === 'compiled' || last === 'invalid')) return settle(last);
      // Killed from outside or failed: the machine's doing as much as the module's, so not
      // remembered. Node ends an uncaught error's report with its version: the first line that
      // names an error says more.
      if (signal === 'SIGKILL') {
        return settle({ ok: false, reason: 'was killed (SIGKILL), most likely by the kernel for want of memory in the Pod or on the machine; it is tried again at the next load', lasting: false });
      }
      const lines = err.split('\n').map((l) => l.trim()).filter((l) => l !== '');
      const said = (lines.find((l) => /error/i.test(l)) ?? lines[0] ?? 'no message').slice(0, 300);
      settle({ ok: false, reason: `failed (${signal ?? `exit ${code}`}): ${said}`, lasting: false });
    });
  });
}
