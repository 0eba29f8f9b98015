#!/usr/bin/env node
// The version check runs before any of the CLI is loaded, so an old Node gets one clear line
// instead of a syntax or loader error from deep inside.
import { existsSync } from 'node:fs';
import module from 'node:module';
import { homedir } from 'node:os';
import { join } from 'node:path';
import { setFlagsFromString } from 'node:v8';

// 22.19 brought process.threadCpuUsage, which the sandbox reads: on 22.12-22.18 every policy
// failed to load, with a message that blamed the policy (newcomer).
const [major, minor] = process.versions.node.split('.').map(Number);
if (major < 22 || (major === 22 && minor < 19)) {
  process.stderr.write(`portcullis: Node ${process.versions.node} is not supported; install Node 22.19 or later, or 24 (LTS), and run it again\n`);
  process.exit(1);
}
// `serve` is a long-lived process whose wasm compiler and workers free large blocks of malloc'd
// memory; glibc keeps them unless told a trim threshold (its default adapts upward and then
// holds tens of MiB: 405 -> ~340 MiB RSS with 50 policies, no throughput change, measured by
// `npm run bench`). The threshold is read only at process start, so the process replaces itself
// once with it set (same PID, nothing else changes). An operator's own setting wins.
if (process.argv[2] === 'serve' && process.platform === 'linux' && typeof process.execve === 'function'
    && process.env.MALLOC_TRIM_THRESHOLD_ === undefined && !(process.env.GLIBC_TUNABLES ?? '').includes('trim_threshold')) {
  process.execve(process.execPath, [process.execPath, ...process.execArgv, ...process.argv.slice(1)],
    { ...process.env, MALLOC_TRIM_THRESHOLD_: String(1 << 20) });
}
// Node's on-disk compile cache (V8 code, and in the checkout the sources with their types
// stripped): `serve` with 10 policies was ready in 1.67 s, 1.18 s with it (bench cold start).
// In our cache folder (util/files.ts cacheDir); the variable is what worker threads (and the
// transpile child) read when they start (the call below covers this thread only). An
// operator's NODE_COMPILE_CACHE or NODE_DISABLE_COMPILE_CACHE wins; a folder that cannot be
// written only costs the speed-up.
if (process.env.NODE_COMPILE_CACHE === undefined && typeof module.enableCompileCache === 'function') {
  try {
    const folder = join(process.env.PORTCULLIS_CACHE || join(homedir(), '.cache', 'portcullis'), 'node-compile-cache');
    const { directory } = module.enableCompileCache(folder);
    if (directory !== undefined) process.env.NODE_COMPILE_CACHE = directory;
  } catch {
    // No home folder (no HOME, no passwd entry): the commands that need the cache say so.
  }
}
// V8 compiles no wasm-to-JavaScript import wrapper on its own (host/src/sandbox/import-wrappers.ts
// says why: the V8 of Node 24 crashed the host freeing one). Set here, before the first
// TypeScript file is loaded: in the checkout, Node's type stripper is itself a wasm module, and
// V8 fixes an instance's budget when it makes it.
setFlagsFromString('--wasm-wrapper-tiering-budget=2147483647');
// In the checkout Node 24 runs the TypeScript sources (type stripping); the installed package
// carries them compiled to JavaScript instead.
const source = new URL('../src/cli/main.ts', import.meta.url);
await import(existsSync(source) ? source.href : new URL('../src/cli/main.js', import.meta.url).href);
