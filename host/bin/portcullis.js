#!/usr/bin/env node
// The version check runs before any of the CLI is loaded, so an old Node gets one clear line
// instead of a syntax or loader error from deep inside.
import { existsSync } from 'node:fs';
import module from 'node:module';
import { homedir } from 'node:os';
import { join } from 'node:path';

const major = Number(process.versions.node.split('.')[0]);
if (major < 22) {
  process.stderr.write(`portcullis: Node ${process.versions.node} is not supported; install Node 22 or 24 (LTS) and run it again\n`);
  process.exit(1);
}
// Where the CPU has memory protection keys (PKU, on many x86-64 servers), V8 write-protects
// JIT code with them, and its bookkeeping of those pages fails a CHECK under wasm code churn
// across threads, terminated ones above all (nodejs/node#64500; PGlite users met the same
// `jit_page` CHECK and pass this flag). The CHECK kills the whole process with SIGTRAP, and
// terminating a worker is how a sandbox's CPU deadline ends a looping call: a hostile policy
// could take the host down with it. The flag is read only when V8 starts, and NODE_OPTIONS may
// not carry it, so the commands that run policies replace themselves once with it (same PID).
// Without PKU hardware V8 has nothing to turn off, and the code pages are as on any other host.
const NO_PKU = '--no-memory-protection-keys';
const command = process.argv[2];
const runsPolicies = ['serve', 'run', 'test', 'bench'].includes(command);
const addFlag = runsPolicies && process.arch === 'x64' && !process.execArgv.includes(NO_PKU);
// `serve` is a long-lived process whose wasm compiler and workers free large blocks of malloc'd
// memory; glibc keeps them unless told a trim threshold (its default adapts upward and then
// holds tens of MiB: 405 -> ~340 MiB RSS with 50 policies, no throughput change, measured by
// `npm run bench`). The threshold too is read only at process start. An operator's own setting wins.
const addTrim = command === 'serve' && process.env.MALLOC_TRIM_THRESHOLD_ === undefined
  && !(process.env.GLIBC_TUNABLES ?? '').includes('trim_threshold');
if ((addFlag || addTrim) && process.platform === 'linux' && typeof process.execve === 'function') {
  process.execve(process.execPath, [process.execPath, ...process.execArgv, ...(addFlag ? [NO_PKU] : []), ...process.argv.slice(1)],
    addTrim ? { ...process.env, MALLOC_TRIM_THRESHOLD_: String(1 << 20) } : process.env);
}
// Node's on-disk compile cache (V8 code, and in the checkout the sources with their types
// stripped): `serve` with 10 policies was ready in 1.67 s, 1.18 s with it (bench cold start).
// In our cache folder (util/files.ts cacheDir); the variable is what worker threads (and the
// transpile child) read when they start (the call below covers this thread only). An
// operator's NODE_COMPILE_CACHE or NODE_DISABLE_COMPILE_CACHE wins; a folder that cannot be
// written only costs the speed-up.
if (process.env.NODE_COMPILE_CACHE === undefined && typeof module.enableCompileCache === 'function') {
  try {
    const folder = join(process.env.PORTCULLIS_CACHE ?? join(homedir(), '.cache', 'portcullis'), 'node-compile-cache');
    const { directory } = module.enableCompileCache(folder);
    if (directory !== undefined) process.env.NODE_COMPILE_CACHE = directory;
  } catch {
    // No home folder (no HOME, no passwd entry): the commands that need the cache say so.
  }
}
// In the checkout Node 24 runs the TypeScript sources (type stripping); the installed package
// carries them compiled to JavaScript instead.
const source = new URL('../src/cli/main.ts', import.meta.url);
await import(existsSync(source) ? source.href : new URL('../src/cli/main.js', import.meta.url).href);
