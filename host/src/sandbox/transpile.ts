// jco's transpile of a component, run in a child process with its own memory and time bounds.
// Transpiling runs before anything about the component is trusted, and its cost is not bounded
// by the module's size: 20,000 empty exports (1.4 MB) took ~40 s and 600 MB in the host's
// main thread, a crafted 26 MB component 1.96 GB (red team, issue 14 round). In a child it cannot stall reviews, its heap
// and WebAssembly memories are capped, it is killed when it runs too long, and it volunteers to
// the kernel's OOM killer first; whatever happens to it, the host reports a refused module.
// Components are transpiled once per content (prepare.ts caches the output), and one at a time.
import { spawn } from 'node:child_process';
import { writeFile } from 'node:fs/promises';
import { extname } from 'node:path';
import type { Readable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { mib } from '../util/text.ts';

export interface TranspileBounds {
  timeoutMs: number;
  /** V8 old generation of the child. */
  heapMiB: number;
  /** Each WebAssembly memory of the child (jco's own tools are WebAssembly). */
  wasmMemoryMiB: number;
}

/** Ten times what transpiling our examples takes on a slow core. */
export const TRANSPILE_BOUNDS: TranspileBounds = { timeoutMs: 20_000, heapMiB: 1024, wasmMemoryMiB: 1024 };
/**
 * jco's JavaScript for a component: ~200 KiB for a TypeScript policy. Its size follows the
 * component's types, not its bytes: 12 KB of nested tuples made 57 MB of glue (red team).
 */
export const MAX_GLUE_BYTES = 8 * 2 ** 20;
/** The core modules are the component's own (plus small generated shims): not much more than its bytes. */
const CORE_SLACK_BYTES = 2 ** 20;

export type TranspileResult =
  | { ok: true; imports: string[]; files: Record<string, Uint8Array> }
  /** `lasting`: the same bytes would be refused the same way (not a machine-level accident). */
  | { ok: false; reason: string; lasting: boolean };

// transpile-child.ts in the checkout, transpile-child.js in the installed package.
const CHILD = fileURLToPath(new URL(`./transpile-child${extname(fileURLToPath(import.meta.url))}`, import.meta.url));

let queue: Promise<unknown> = Promise.resolve();

/** Transpiles in a child process, one at a time in this process. Never throws for what the component does. */
export function transpileIsolated(bytes: Uint8Array, bounds: TranspileBounds = TRANSPILE_BOUNDS): Promise<TranspileResult> {
  const run = queue.then(() => runChild(bytes, bounds));
  queue = run.catch(() => undefined);
  return run;
}

function runChild(bytes: Uint8Array, bounds: TranspileBounds): Promise<TranspileResult> {
  return new Promise((resolve) => {
    // jco's tools are WebAssembly, compiled afresh in every child: with TurboFan tiering up on
    // background threads, a TypeScript policy's transpile took 1.7 s and 2 s of CPU, against 1.05
    // s and 1 s with the baseline compiler alone (same output), CPU the first start's compile
    // trials run beside.
    const child = spawn(process.execPath, [
      `--max-old-space-size=${bounds.heapMiB}`, `--wasm-max-mem-pages=${bounds.wasmMemoryMiB * 16}`, '--liftoff-only', '--no-warnings', CHILD,
    ], { stdio: ['pipe', 'ignore', 'pipe', 'pipe'], env: { ...process.env, NODE_OPTIONS: '' } });
    // Linux: the child, not the host, is the one to go when memory runs out.
    if (child.pid !== undefined) writeFile(`/proc/${child.pid}/oom_score_adj`, '1000').catch(() => undefined);
    const answer = child.stdio[3] as Readable;
    const out: Buffer[] = [];
    let outBytes = 0;
    let err = '';
    let verdict: { reason: string; lasting: boolean } | undefined;
    let settled = false;
    const settle = (result: TranspileResult) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      resolve(result);
    };
    const maxOut = bytes.length + CORE_SLACK_BYTES + MAX_GLUE_BYTES + 64 * 1024;
    const stop = (reason: string) => {
      verdict ??= { reason, lasting: true };
      child.kill('SIGKILL');
    };
    const timer = setTimeout(() => stop(`transpiling it took longer than ${bounds.timeoutMs / 1000}s`), bounds.timeoutMs);
    answer.on('data', (chunk: Buffer) => {
      outBytes += chunk.length;
      if (outBytes > maxOut) stop(`transpiling it produced more than ${Math.round(maxOut / 2 ** 20)} MiB (its JavaScript may be at most ${MAX_GLUE_BYTES / 2 ** 20} MiB)`);
      else out.push(chunk);
    });
    child.stderr!.on('data', (chunk: Buffer) => {
      if (err.length < 64 * 1024) err += chunk.toString('utf8');
    });
    child.stdin!.on('error', () => undefined); // a child that dies early closes its stdin
    child.stdin!.end(bytes);
    // A child that could not be started may never emit 'close'.
    child.on('error', (error) => settle({ ok: false, reason: `the transpiler could not be started: ${error.message}`, lasting: false }));
    child.on('close', (code, signal) => {
      if (verdict !== undefined) return settle({ ok: false, ...verdict });
      if (code !== 0) {
        // Out of memory may be the machine's doing (the kernel's OOM killer), not the component's alone.
        const oom = /out of memory|Allocation failed|Cannot allocate|RangeError: WebAssembly\.Memory/i.test(err) || signal === 'SIGKILL';
        return settle({
          ok: false,
          lasting: false,
          reason: oom
            ? `transpiling it ran out of the memory it may use (${bounds.heapMiB} MiB heap, ${bounds.wasmMemoryMiB} MiB per WebAssembly memory)`
            : `the transpiler failed (${signal ?? `exit ${code}`}): ${lastLine(err)}`,
        });
      }
      settle(parse(Buffer.concat(out), bytes.length));
    });
  });
}

interface Header {
  error?: string;
  imports?: string[];
  files?: [string, number][];
}

function parse(output: Buffer, inputBytes: number): TranspileResult {
  const newline = output.indexOf(0x0a);
  if (newline < 0) return { ok: false, reason: 'the transpiler gave no answer', lasting: false };
  let header: Header;
  try {
    header = JSON.parse(output.subarray(0, newline).toString('utf8')) as Header;
  } catch {
    return { ok: false, reason: 'the transpiler\'s answer was not understood', lasting: false };
  }
  if (header.error !== undefined) return { ok: false, reason: `not a usable component: ${header.error}`, lasting: true };
  const files: Record<string, Uint8Array> = {};
  let at = newline + 1;
  let cores = 0;
  for (const [name, length] of header.files ?? []) {
    if (name.endsWith('.js') && length > MAX_GLUE_BYTES) {
      return { ok: false, reason: `its JavaScript glue would be ${mib(length)} MiB, above ${mib(MAX_GLUE_BYTES)} MiB (far more types than a policy needs)`, lasting: true };
    }
    if (name.endsWith('.wasm')) cores += length;
    files[name] = new Uint8Array(output.subarray(at, at + length));
    at += length;
  }
  if (cores > inputBytes + CORE_SLACK_BYTES) return { ok: false, reason: `its core modules came to ${mib(cores)} MiB, more than the component itself`, lasting: true };
  if (at !== output.length) return { ok: false, reason: 'the transpiler\'s answer was cut short', lasting: false };
  return { ok: true, imports: header.imports ?? [], files };
}

function lastLine(text: string): string {
  const lines = text.trim().split('\n').filter((line) => line.trim() !== '');
  return (lines.at(-1) ?? 'no message').slice(0, 300);
}
