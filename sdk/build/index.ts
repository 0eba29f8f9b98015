// Builds a policy source into a .wasm: TypeScript -> component (QuickJS, via componentize-qjs),
// AssemblyScript -> core module (Extism PDK ABI). Used by `portcullis build` and `npm run build`.
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { existsSync } from 'node:fs';
import { isBuiltin } from 'node:module';
import { basename, dirname, extname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';
import { withSourceLines } from './source-lines.ts';

export type Language = 'typescript' | 'assemblyscript';

export interface BuildOptions {
  source: string;
  /** Inferred when absent: a source under an `assembly/` folder is AssemblyScript. */
  language?: Language;
  /**
   * TypeScript only. false keeps WASI imports in the component, which the host refuses to
   * load; it exists so the host's refusal can be tested. Default true.
   */
  stubWasi?: boolean;
  /** TypeScript only: how long evaluating the policy's top-level code may take. Default 60 s. */
  timeoutMs?: number;
  /** TypeScript only: refuse to build on a type error. Default false (the CLI turns it on). */
  typecheck?: boolean;
}

export interface BuildResult {
  bytes: Uint8Array;
  language: Language;
}

export class BuildError extends Error {
  readonly code = 'POLICY_BUILD_FAILED';
  constructor(source: string, detail: string) {
    super(`could not build policy ${source}: ${detail}`);
    this.name = 'BuildError';
  }
}

const sdkRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..');
// The installed package carries wit/ inside; the checkout keeps it at the repository's top.
const witDir = existsSync(resolve(sdkRoot, 'wit')) ? resolve(sdkRoot, 'wit') : resolve(sdkRoot, '..', 'wit');

export function inferLanguage(source: string): Language {
  return /(^|[\\/])assembly[\\/]/.test(source) ? 'assemblyscript' : 'typescript';
}

export async function buildPolicy(options: BuildOptions): Promise<BuildResult> {
  const source = resolve(options.source);
  const language = options.language ?? inferLanguage(source);
  if (language === 'typescript' && options.typecheck) {
    const { typeErrors } = await import('./typecheck.ts');
    const errors = await typeErrors(source);
    if (errors.length > 0) {
      // Syntax errors come this way too: "type error" misnamed them (outsider).
      throw new BuildError(source, withBuiltinHint(`${errors.length} error(s) from the TypeScript compiler (--no-typecheck builds anyway):\n${errors.slice(0, 20).join('\n')}`));
    }
  }
  const bytes = language === 'assemblyscript' ? await buildAssemblyScript(source) : await buildTypeScript(source, options.stubWasi ?? true, options.timeoutMs ?? 60_000);
  return { bytes, language };
}

/**
 * Newcomer: `import … from 'node:fs'` gave "Cannot find module 'node:fs'" (or esbuild's "Could
 * not resolve"), which reads as a missing install.
 */
function withBuiltinHint(text: string): string {
  const builtin = /(?:Cannot find module|Could not resolve) ['"]([\w:/]+)['"]/.exec(text)?.[1];
  return builtin && isBuiltin(builtin) ? `${text}\n${builtin} is one of Node's own modules, which a policy cannot use: it runs in a sandbox with no files, network, clock or process; read what the request and settings give, and cluster objects through the SDK's context` : text;
}

const NOT_A_POLICY = 'the default export is not a policy: write `export default definePolicy({ validate(request) { ... } })` (import { definePolicy } from \'@portcullis/sdk\'), not a plain object or function';

async function buildTypeScript(source: string, stubWasi: boolean, timeoutMs: number): Promise<Uint8Array> {
  const { build } = await import('esbuild');
  // The entry connects the SDK's log to the host import and exports the policy under the
  // interface name the WIT world expects; authors only write `export default definePolicy(...)`.
  const entry = [
    'import \'@portcullis/sdk/no-ambient\';', // first: clock, timers and random throw clear errors
    'import { log } from \'portcullis:policy/host@0.1.0\';',
    'import { read } from \'portcullis:policy/context@0.1.0\';', // issue 15: context reads
    'import { bindContextReader, bindHostLog } from \'@portcullis/sdk/runtime\';',
    `import definition from ${JSON.stringify(source)};`,
    'bindHostLog((level, message) => log(level, message));',
    'bindContextReader((request) => read(request));',
    // Outsider: a plain object as the default export built, then failed in the sandbox with a
    // wasm trap. Said at the build's snapshot of the top level instead, in the author's words.
    `if (typeof definition?.metadata !== 'function' || typeof definition.validate !== 'function') throw new Error(${JSON.stringify(NOT_A_POLICY)});`,
    'export const policy = definition;',
  ].join('\n');
  let bundled;
  try {
    bundled = await build({
      stdin: { contents: entry, resolveDir: dirname(source), sourcefile: 'portcullis-entry.js', loader: 'js' },
      bundle: true, format: 'esm', platform: 'neutral', target: 'es2022', write: false, sourcemap: 'inline',
      external: ['portcullis:*'], logLevel: 'silent', mainFields: ['module', 'main'],
    });
  } catch (error) {
    const text = errorText(error);
    // esbuild names our generated entry file; say what the author has to write instead.
    if (/No matching export in "[^"]*" for import "default"/.test(text)) {
      throw new BuildError(source, 'it has no default export: a policy ends with `export default definePolicy({ ... })` (import { definePolicy } from \'@portcullis/sdk\')');
    }
    throw new BuildError(source, withBuiltinHint(text));
  }
  // stubWasi: the component imports nothing from WASI, so a policy has no clock, random,
  // files, network or environment unless the host grants a capability interface.
  // The map becomes a table of source lines, so an exception names policy.ts:LINE (source-lines.ts).
  const jsSource = withSourceLines(bundled.outputFiles[0]!.text, dirname(source));
  const options = { witPath: witDir, world: 'admission-policy', jsSource, stubWasi, sync: true };
  return componentizeWithDeadline(source, options, timeoutMs);
}

function componentizeWithDeadline(source: string, options: object, timeoutMs: number): Promise<Uint8Array> {
  const worker = new Worker(new URL(`./componentize-worker${extname(fileURLToPath(import.meta.url))}`, import.meta.url), { workerData: options });
  return new Promise<Uint8Array>((resolvePromise, reject) => {
    const timer = setTimeout(() => {
      void worker.terminate();
      reject(new BuildError(source, `evaluating its top-level code did not finish within ${timeoutMs / 1000}s; ` +
        'the build runs the module once to snapshot it, so code outside the handlers must finish (a loop at the top level?)'));
    }, timeoutMs);
    worker.once('message', (message: { ok: true; component: Uint8Array } | { ok: false; error: string }) => {
      clearTimeout(timer);
      void worker.terminate();
      if (message.ok) resolvePromise(message.component);
      else reject(new BuildError(source, message.error.includes(NOT_A_POLICY) ? NOT_A_POLICY : message.error));
    });
    worker.once('error', (error) => {
      clearTimeout(timer);
      reject(new BuildError(source, errorText(error)));
    });
  });
}

async function buildAssemblyScript(source: string): Promise<Uint8Array> {
  // asc finds the SDK, and json-as (its transform and library), in node_modules above the source
  // only: without them it printed a Node stack trace about json-as/transform (newcomer, with the
  // CLI installed elsewhere). TypeScript builds say the same in their own words.
  const above = nodeModulesAbove(source);
  if (!above.some((dir) => existsSync(join(dir, '@portcullis', 'sdk', 'assembly')))) {
    throw new BuildError(source, 'cannot find module \'@portcullis/sdk\' (its assembly/ folder) in a node_modules folder above the source: ' +
      'install the SDK in the policy\'s project (npm install --save-dev the @portcullis/sdk package or tarball), as `portcullis new` sets it up');
  }
  const asc = await import('assemblyscript/asc');
  const dir = await mkdtemp(join(tmpdir(), 'portcullis-asc-'));
  const out = join(dir, basename(source, '.ts') + '.wasm');
  let messages = '';
  const sink = { write: (chunk: string | Uint8Array) => { messages += String(chunk); return true; } };
  try {
    const { error } = await asc.main([
      // asc resolves the entry against --baseDir (default: the working folder), and an entry that
      // is then plain `assembly/index.ts` compiled to an empty module: anchor it above its project.
      // asc looks for packages in node_modules above --baseDir only, so name the project's own.
      source, '--baseDir', dirname(dirname(dirname(source))), ...above.flatMap((dir) => ['--path', dir]), '--outFile', out, '--optimizeLevel', '3', '--shrinkLevel', '1', '--runtime', 'incremental',
      '--transform', 'json-as/transform', '--use', 'abort=~lib/@portcullis/sdk/assembly/index/portcullisAbort',
      '--disableWarning', '201',
      // Colours are for a terminal; this text goes into an error message (and asc colours it when CI is set).
      '--noColors',
    ], { stdout: sink, stderr: sink });
    if (error) {
      // The build names the SDK's abort handler (for file:line in crash reports), which only exists once the SDK is imported.
      const hint = messages.includes('portcullisAbort\' not found')
        ? '\nthe entry file must import from \'@portcullis/sdk/assembly\' (e.g. import { Context, Result, handleValidate } from \'@portcullis/sdk/assembly\')'
        : '';
      // asc's notes on the SDK's own code (AS210 "never null" where its flow analysis knows more
      // than the code says) surrounded every error of the policy's (newcomer): only the policy's are shown.
      const shown = messages.split(/\n(?=ERROR|WARNING|INFO)/).filter((block) => !(block.startsWith('INFO') && block.includes('~lib/@portcullis/sdk/'))).join('\n');
      throw new BuildError(source, `${error.message}\n${shown.trim()}${hint}`);
    }
    const bytes = new Uint8Array(await readFile(out));
    // Never write a module that cannot be a policy: the host would refuse it at load anyway.
    const exports = WebAssembly.Module.exports(await WebAssembly.compile(bytes));
    if (!exports.some((e) => (e.name === 'validate' || e.name === 'mutate') && e.kind === 'function')) {
      throw new BuildError(source, `the module exports no "validate" or "mutate" function (it exports: ${exports.map((e) => e.name).join(', ') || 'nothing'}); ` +
        'export them from the entry file, e.g. export function validate(): i32 { return handleValidate(check); }');
    }
    return bytes;
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/** Every node_modules folder from the source's folder up, nearest first (Node's lookup order). */
function nodeModulesAbove(source: string): string[] {
  const found: string[] = [];
  for (let dir = dirname(source); ; dir = dirname(dir)) {
    if (existsSync(join(dir, 'node_modules'))) found.push(join(dir, 'node_modules'));
    if (dirname(dir) === dir) return found;
  }
}

function errorText(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

export async function buildPolicyToFile(options: BuildOptions & { out: string }): Promise<BuildResult> {
  const result = await buildPolicy(options);
  await writeFile(options.out, result.bytes);
  return result;
}
