// Turns the bytes of a policy into a SandboxSpec: tells component from core module, refuses
// imports the host does not grant, caps every linear memory, compiles the core modules once
// (workers receive the compiled modules), and for components caches jco's transpiled glue on
// disk by content hash so a restart does not transpile again.
import { createHash } from 'node:crypto';
import { mkdir, readdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { homedir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { moduleKind, type ModuleKind } from '../policy/module-kind.ts';
import { capMemory } from './memory-cap.ts';
import type { SandboxSpec } from './protocol.ts';

export interface SandboxLimits {
  timeoutMs: number;
  memoryMiB: number;
  maxOutputBytes: number;
}

export const DEFAULT_LIMITS: SandboxLimits = { timeoutMs: 2000, memoryMiB: 64, maxOutputBytes: 1 << 20 };

/** The one interface a component may import. Anything else (WASI files, sockets, clocks...) is refused. */
const COMPONENT_IMPORTS = new Set(['portcullis:policy/host']);

/**
 * The Extism kernel functions a core module may import. Left out on purpose: http_request and
 * friends (network), and every WASI import (files, clocks, random, environment).
 */
const EXTISM_IMPORTS = new Set([
  'alloc', 'free', 'length', 'length_unsafe', 'load_u8', 'load_u64', 'store_u8', 'store_u64',
  'input_length', 'input_load_u8', 'input_load_u64', 'input_offset', 'output_set', 'error_set',
  'config_get', 'var_get', 'var_set', 'log_info', 'log_warn', 'log_debug', 'log_error', 'log_trace', 'get_log_level',
]);

export class PrepareError extends Error {}

export function cacheDir(): string {
  return process.env.PORTCULLIS_CACHE ?? join(homedir(), '.cache', 'portcullis');
}

export function sha256(bytes: Uint8Array): string {
  return createHash('sha256').update(bytes).digest('hex');
}

export async function prepareSandbox(
  policy: string, bytes: Uint8Array, limits: SandboxLimits, fresh: boolean,
): Promise<SandboxSpec & { digest: string }> {
  const kind: ModuleKind | undefined = moduleKind(bytes);
  if (!kind) throw new PrepareError('the file is not a WebAssembly module or component (bad header)');
  const digest = sha256(bytes);
  const capBytes = limits.memoryMiB * 2 ** 20;
  const base = { key: `${policy}@${digest.slice(0, 12)}`, policy, kind, memoryCapBytes: capBytes, maxOutputBytes: limits.maxOutputBytes, fresh, digest };
  if (kind === 'core') {
    const module = await compile(capMemory(bytes, capBytes));
    checkCoreImports(module);
    return { ...base, modules: { 'policy.wasm': module } };
  }
  const transpiled = await transpileCached(bytes, digest);
  const modules: Record<string, WebAssembly.Module> = {};
  for (const [name, core] of Object.entries(transpiled.cores)) modules[name] = await compile(capMemory(core, capBytes));
  return { ...base, modules, glue: transpiled.glue };
}

async function compile(bytes: Uint8Array): Promise<WebAssembly.Module> {
  try {
    return await WebAssembly.compile(bytes as Uint8Array<ArrayBuffer>);
  } catch (error) {
    throw new PrepareError(`invalid WebAssembly: ${error instanceof Error ? error.message : String(error)}`);
  }
}

function checkCoreImports(module: WebAssembly.Module): void {
  for (const { module: namespace, name } of WebAssembly.Module.imports(module)) {
    if (namespace === 'extism:host/env' && EXTISM_IMPORTS.has(name)) continue;
    throw new PrepareError(
      `it imports ${namespace}.${name}, which Portcullis does not grant to policies ` +
      '(no files, network, clock, random or environment); build it without that import',
    );
  }
  const exports = new Set(WebAssembly.Module.exports(module).map((e) => e.name));
  if (!exports.has('validate') && !exports.has('mutate')) {
    throw new PrepareError('it exports neither "validate" nor "mutate"; is it a Portcullis policy?');
  }
}

interface Transpiled {
  glue: string;
  cores: Record<string, Uint8Array>;
}

async function transpileCached(bytes: Uint8Array, digest: string): Promise<Transpiled> {
  const dir = join(cacheDir(), 'transpiled', digest);
  try {
    return await readTranspiled(dir);
  } catch {
    // not cached yet (or a partial entry): transpile below
  }
  const { transpile } = await import('@bytecodealliance/jco');
  let out;
  try {
    out = await transpile(bytes, { name: 'policy', instantiation: 'async', noTypescript: true, nodejsCompat: false });
  } catch (error) {
    throw new PrepareError(`not a usable component: ${error instanceof Error ? error.message : String(error)}`);
  }
  const foreign = out.imports.filter((name: string) => !COMPONENT_IMPORTS.has(name.replace(/@[^/]*$/, '')));
  if (foreign.length > 0) {
    throw new PrepareError(
      `it imports ${foreign.join(', ')}, which Portcullis does not grant to policies ` +
      '(no files, network, clock, random or environment); build it with `portcullis build`, which stubs WASI out',
    );
  }
  const tmp = `${dir}.tmp-${process.pid}-${Date.now()}`;
  await mkdir(tmp, { recursive: true });
  for (const [name, content] of Object.entries(out.files as Record<string, Uint8Array>)) {
    if (name.includes('/') || name.endsWith('.d.ts')) continue;
    await writeFile(join(tmp, name.endsWith('.js') ? 'policy.mjs' : name), content);
  }
  await rm(dir, { recursive: true, force: true });
  await rename(tmp, dir).catch(async () => rm(tmp, { recursive: true, force: true }));
  return readTranspiled(dir);
}

async function readTranspiled(dir: string): Promise<Transpiled> {
  const cores: Record<string, Uint8Array> = {};
  for (const name of await readdir(dir)) if (name.endsWith('.wasm')) cores[name] = new Uint8Array(await readFile(join(dir, name)));
  if (Object.keys(cores).length === 0) throw new Error('empty cache entry');
  await readFile(join(dir, 'policy.mjs'));
  return { glue: pathToFileURL(join(dir, 'policy.mjs')).href, cores };
}
