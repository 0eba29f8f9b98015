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
import { mkdir, readFile, rename, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { cacheDir } from '../util/files.ts';

export interface TrialBounds {
  /** How much the child may grow while compiling, MiB. */
  growthMiB: number;
  /** Per compiler, ms. */
  liftoffMs: number;
  turbofanMs: number;
}

/**
 * One function at a time (one compile task), as a worker compiles. Our largest module, the
 * QuickJS runtime of TypeScript policies (1.3 MB), grows the child by 10 MiB in 50 ms with
 * Liftoff and 35 MiB in 2 s with TurboFan. A host runs a handful of such compiles at once (each
 * worker's Liftoff, V8's few background threads), so a function may take little of the pod.
 */
export const TRIAL_BOUNDS: TrialBounds = { growthMiB: 128, liftoffMs: 10_000, turbofanMs: 30_000 };

const COMPILERS = [
  { name: 'baseline (Liftoff)', flag: '--liftoff-only', bound: (b: TrialBounds) => b.liftoffMs },
  { name: 'optimising (TurboFan)', flag: '--no-liftoff', bound: (b: TrialBounds) => b.turbofanMs },
] as const;

/** A module passes its trial when both compilers stay in bounds; invalid WebAssembly passes too, and the real compile says why. */
export type TrialVerdict = { ok: true } | { ok: false; reason: string; lasting: boolean };

/**
 * The child: JavaScript, not a file of this package, so that Node compiles no WebAssembly of its
 * own under the trial's flags (a .ts file would make it compile its type stripper, 3 s with
 * TurboFan). The module comes on stdin; the child says how big it was before compiling and its
 * high-water mark after, one line each, on stdout.
 */
const CHILD = `
const hwm = () => process.resourceUsage().maxRSS * 1024;
const chunks = [];
process.stdin.on('data', (chunk) => chunks.push(chunk));
process.stdin.on('end', () => {
  const bytes = Buffer.concat(chunks);
  process.stdout.write('base ' + Math.max(hwm(), process.memoryUsage.rss()) + '\\n', () => {
    // An asynchronous compile does not keep Node's event loop alive: this does.
    const alive = setInterval(() => {}, 1000);
    const done = () => process.stdout.write('peak ' + hwm() + '\\n', () => process.exit(0));
    // Invalid WebAssembly passes: the host's own compile says why.
    WebAssembly.compile(bytes).then(done, done);
  });
});
`;

let queue: Promise<unknown> = Promise.resolve();

/**
 * The trial of `bytes` (content hash `hash`), one at a time in this process: a hostile module
 * listed many times holds one child at a time. Never throws for what the module does.
 */
export async function trialCompile(bytes: Uint8Array, hash: string, bounds: TrialBounds = TRIAL_BOUNDS): Promise<TrialVerdict> {
  // Outside the queue: modules tried before do not wait behind a hostile one's bounds.
  const passed = join(cacheDir(), 'compile-trials', `${hash}-v8-${process.versions.v8}`);
  if (await readFile(passed, 'utf8').then((text) => text === 'passed', () => false)) return { ok: true };
  const run = queue.then(() => trial(bytes, passed, bounds));
  queue = run.catch(() => undefined);
  return run;
}

async function trial(bytes: Uint8Array, passed: string, bounds: TrialBounds): Promise<TrialVerdict> {
  for (const compiler of COMPILERS) {
    const verdict = await runChild(bytes, compiler.flag, bounds.growthMiB, compiler.bound(bounds));
    if (!verdict.ok) return { ...verdict, reason: `compiling it with V8's ${compiler.name} compiler ${verdict.reason}` };
  }
  // Kept per V8 version (in the name): another V8 compiles differently. Written under a
  // temporary name and renamed, so a concurrent reader never sees half of it; a cache that
  // cannot be written costs the next load another trial, nothing else.
  const tmp = `${passed}.tmp-${process.pid}-${Math.random().toString(36).slice(2)}`;
  await mkdir(dirname(passed), { recursive: true })
    .then(() => writeFile(tmp, 'passed'))
    .then(() => rename(tmp, passed))
    .catch(() => undefined);
  return { ok: true };
}

function runChild(bytes: Uint8Array, flag: string, growthMiB: number, timeoutMs: number): Promise<TrialVerdict> {
  const limit = growthMiB * 2 ** 20;
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [
      '--no-wasm-lazy-compilation', flag, '--wasm-num-compilation-tasks=1', '--no-warnings', '-e', CHILD,
    ], { stdio: ['pipe', 'pipe', 'pipe'], env: { ...process.env, NODE_OPTIONS: '' } });
    // Linux: the child, not the host, is the one to go when memory runs out.
    if (child.pid !== undefined) writeFile(`/proc/${child.pid}/oom_score_adj`, '1000').catch(() => undefined);
    let out = '';
    let err = '';
    let stopped: string | undefined;
    const stop = (reason: string) => {
      stopped ??= reason;
      child.kill('SIGKILL');
    };
    const timer = setTimeout(() => stop(`took longer than ${timeoutMs / 1000}s`), timeoutMs);
    const base = () => Number(/^base (\d+)$/m.exec(out)?.[1] ?? NaN);
    // Watched from here: V8 may compile on the child's only JavaScript thread, which then cannot
    // watch itself. Polled every 10 ms, a runaway is stopped long before its gigabytes (Linux;
    // elsewhere only the high-water mark after the compile is checked).
    const over = `took more than ${growthMiB} MiB of memory (policies' compile to a few MiB)`;
    const watch = setInterval(() => {
      if (child.pid === undefined || Number.isNaN(base())) return;
      readFile(`/proc/${child.pid}/status`, 'utf8').then((status) => {
        const rss = Number(/VmRSS:\s+(\d+)/.exec(status)?.[1] ?? 0) * 1024;
        if (rss - base() > limit) stop(over);
      }, () => undefined);
    }, 10);
    child.stdout.on('data', (chunk: Buffer) => {
      if (out.length < 1024) out += chunk.toString('utf8');
    });
    child.stderr.on('data', (chunk: Buffer) => {
      if (err.length < 16 * 1024) err += chunk.toString('utf8');
    });
    child.stdin.on('error', () => undefined); // a child that dies early closes its stdin
    child.stdin.end(bytes);
    let settled = false;
    const settle = (verdict: TrialVerdict) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      clearInterval(watch);
      resolve(verdict);
    };
    child.on('error', (error) => settle({ ok: false, reason: `could not be tried: ${error.message}`, lasting: false }));
    child.on('close', (code, signal) => {
      if (stopped !== undefined) return settle({ ok: false, reason: stopped, lasting: true });
      const peak = Number(/^peak (\d+)$/m.exec(out)?.[1] ?? NaN);
      // The kernel's high-water mark catches a peak between two polls.
      if (code === 0 && peak - base() > limit) return settle({ ok: false, reason: over, lasting: true });
      if (code === 0 && !Number.isNaN(peak)) return settle({ ok: true });
      // Killed from outside (the kernel's OOM killer) or failed: the machine's doing as much as the module's.
      const last = err.trim().split('\n').filter((l) => l.trim() !== '').at(-1)?.slice(0, 300) ?? 'no message';
      settle({ ok: false, reason: `failed (${signal ?? `exit ${code}`}): ${last}`, lasting: false });
    });
  });
}
