// Turns the bytes of a policy into a SandboxSpec: tells component from core module, refuses
// imports the host does not grant, caps every linear memory, tries V8's compilers on each core
// module in a bounded child (compile-trial.ts), compiles the core modules once (workers receive
// the compiled modules), and for components caches jco's output on disk by
// content hash so a restart does not transpile again (transpile.ts runs jco in a bounded child).
import './interrupts.ts';
import { existsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import v8 from 'node:v8';
import { extname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { Worker } from 'node:worker_threads';
import type { SandboxLimits } from '../config/limits.ts';
import { atomicWrite, cacheDir, sha256, touch, touchedAt } from '../util/files.ts';
import { moduleKind, type ModuleKind } from './module-kind.ts';
import { applyPlan, capMemory, planBudget, readLayout, type ModuleLayout } from './memory-cap.ts';
import { checkCodeSection, CODE_WALK_REVISION } from './code-walk.ts';
import { entryPointProblems } from './entry-points.ts';
import { unsafeGlueName } from './glue-names.ts';
import { FUEL_EXPORT, REFILL_EXPORT, START_EXPORT, type Metering } from './metering.ts';
import { GLUE_REVISION, HANDLE_TABLE, MAX_RESOURCE_TABLES, tuneGlue, type TunedGlue } from './glue.ts';
import { transpileIsolated } from './transpile.ts';
import { markTrialUsed, trialCompile, trialCompileAll } from './compile-trial.ts';
import { cutMessage, foreignText, mib } from '../util/text.ts';
import { KERNEL_NAMESPACES, kernelImportProblem } from './kernel-imports.ts';
import { checkComponentBuiltins, ComponentBuiltinError } from './component-builtins.ts';
import type { SandboxSpec } from './protocol.ts';
import { PortcullisError } from '../errors.ts';

/** The one interface a component may import. Anything else (WASI files, sockets, clocks...) is refused. */
// Issue 15: portcullis:policy/context is safe to link for every policy: it refuses kinds not granted.
const COMPONENT_IMPORTS = new Set(['portcullis:policy/host', 'portcullis:policy/context']);

export class PrepareError extends PortcullisError {
  /** false: the machine's doing, not the module's (a trial at the lowest priority out of time), worth trying again later. */
  readonly lasting: boolean;
  constructor(message: string, lasting = true) {
    super('MODULE_REFUSED', message);
    this.lasting = lasting;
  }
}

/**
 * Why the lane has no metered copy of a policy; `again`: the machine's doing (a time-out of
 * the metering thread or of a compile trial at the lowest priority), so the lane tries again
 * at a later quiet moment rather than keep the policy out for good.
 */
export type Unmetered = { unmetered: string; again?: true };
const unmeteredBy = (message: string, error: unknown): Unmetered =>
  error instanceof PrepareError && !error.lasting ? { unmetered: message, again: true } : { unmetered: message };

export async function prepareSandbox(
  policy: string, bytes: Uint8Array, limits: SandboxLimits, fresh: boolean,
): Promise<SandboxSpec & { digest: string }> {
  if (bytes.length > limits.maxModuleMiB * 2 ** 20) {
    throw new PrepareError(`the module is ${mib(bytes.length)} MiB, above limits.maxModuleMiB (${limits.maxModuleMiB} MiB)`);
  }
  const kind: ModuleKind | undefined = moduleKind(bytes);
  if (!kind) throw new PrepareError('the file is not a WebAssembly module or component (bad header)');
  const digest = sha256(bytes);
  const capBytes = limits.memoryMiB * 2 ** 20;
  const base = { key: `${policy}@${digest.slice(0, 12)}`, policy, kind, memoryCapBytes: capBytes, maxOutputBytes: limits.maxOutputBytes, fresh, digest };
  if (kind === 'core') {
    const capped = capMemory(bytes, capBytes);
    const module = await compile(capped);
    checkCoreImports(module, capped);
    const problems = entryPointProblems(capped, module);
    if (problems.length > 0) throw new PrepareError(problems.join('; '));
    cappedBytes.set(module, capped);
    return { ...base, modules: { 'policy.wasm': module } };
  }
  try {
    checkComponentBuiltins(bytes);
  } catch (error) {
    if (error instanceof ComponentBuiltinError) throw new PrepareError(error.message);
    throw error;
  }
  const transpiled = await transpileCached(bytes, digest);
  // One budget for the whole component: its core modules' memories and tables together.
  const cores = Object.entries(transpiled.cores).map(([name, core]) => ({ name, core, layout: readLayout(core) }));
  const plan = planBudget(cores.map((c) => c.layout), capBytes);
  const planned = cores.map(({ name, core, layout }, i) => withPlan(core, transpiled.hashes[name]!, layout, plan.memoryMax[i]!, plan.tableMax[i]!));
  const refused = await walkAndTry(planned, { walked: false, background: false });
  if (refused) throw refused.error;
  const modules: Record<string, WebAssembly.Module> = {};
  for (const [i, { name }] of cores.entries()) {
    // Walked above, unless it was compiled or compiling already (then compile() walks what it must).
    modules[name] = await compile(planned[i]!, false, walkedContent.has(hashOf(planned[i]!)));
    // Before any worker imports the glue, which holds these names as code (glue-names.ts).
    const unsafe = unsafeGlueName(modules[name]);
    if (unsafe !== undefined) {
      throw new PrepareError(`its core module ${name} names an import or export ${JSON.stringify(unsafe.length > 200 ? `${unsafe.slice(0, 200)}…` : unsafe)}, ` +
        'which could run as code in the JavaScript jco generates for it; toolchains name them in plain ASCII without quotes or backslashes');
    }
  }
  return { ...base, modules, glue: transpiled.glue, cores: transpiled.hashes };
}

/**
 * A component's core modules with fuel counters (metering.ts), for the inline lane; or why there
 * are none. Read again from the transpile cache (kept there while the policy is loaded, see
 * cache/prune.ts) rather than held in memory for every policy the lane may never want. The
 * memory cap is planned again at `memoryBytes` for the whole component; every module with code
 * must take its counter (a module without code runs nothing of its own), and the walks run on a
 * thread of their own (meter-thread.ts). Metered copies are compiled once by content: every
 * TypeScript policy shares QuickJS's.
 */
export async function meteredComponent(
  spec: SandboxSpec, bounds: { maxBytes: number; memoryBytes: number; maxModules: number },
): Promise<{ modules: Record<string, WebAssembly.Module> } | Unmetered> {
  if (spec.kind !== 'component' || !spec.cores) return { unmetered: 'it is not a component prepared here' };
  const names = Object.keys(spec.cores);
  if (names.length > bounds.maxModules) return { unmetered: `it has ${names.length} core modules, more than the ${bounds.maxModules} the lane takes` };
  // The names metering gives its counter, refill slot and start: a module (one without code too,
  // which is not metered) that imports or exports one could reach another module's (reviewer).
  for (const module of Object.values(spec.modules)) {
    const named = [...WebAssembly.Module.imports(module), ...WebAssembly.Module.exports(module)].find((d) => METERING_NAMES.has(d.name));
    if (named) return { unmetered: `one of its core modules names ${named.name}, which metering reserves` };
  }
  let originals: Uint8Array[];
  try {
    originals = await Promise.all(names.map(async (name) => {
      const hash = spec.cores![name]!;
      const content = new Uint8Array(await readFile(join(cacheDir(), 'transpiled', 'cores', `${hash}.wasm`)));
      if (sha256(content) !== hash) throw new Error(`cache entry ${hash} is damaged`);
      return content;
    }));
  } catch (error) {
    return { unmetered: `its core modules could not be read again from the cache: ${error instanceof Error ? error.message : String(error)}` };
  }
  const size = originals.reduce((n, b) => n + b.length, 0);
  if (size > bounds.maxBytes) return { unmetered: `its core modules are ${size} bytes, more than the ${bounds.maxBytes} the lane takes` };
  let capped: Uint8Array<ArrayBuffer>[];
  let layouts: ReturnType<typeof readLayout>[];
  try {
    layouts = originals.map((bytes) => readLayout(bytes));
    const plan = planBudget(layouts, Math.min(spec.memoryCapBytes, bounds.memoryBytes));
    capped = originals.map((bytes, i) => applyPlan(bytes, layouts[i]!, plan.memoryMax[i]!, plan.tableMax[i]!));
  } catch (error) {
    return { unmetered: `it needs more memory than the lane allows: ${error instanceof Error ? error.message : String(error)}` };
  }
  const hashes = capped.map((bytes) => sha256(bytes));
  const known = hashes.map((hash) => meteredByContent.get(hash)?.deref());
  // The plan changes only limits: a module has code as it came.
  const todo = capped.filter((_, i) => !known[i] && layouts[i]!.codeSection);
  const meterings = todo.length > 0 ? await meterInThread(todo) : [];
  const metered: Uint8Array<ArrayBuffer>[] = [];
  let next = 0;
  for (const [i, name] of names.entries()) {
    if (known[i]) continue;
    // No code: nothing of its own runs (its start, if any, is an import: metered or host-bounded).
    const metering = layouts[i]!.codeSection ? meterings[next++]! : { bytes: capped[i]! };
    if (!('bytes' in metering)) return { ...metering, unmetered: `its core module ${name} cannot be metered: ${metering.unmetered}` };
    metered[i] = metering.bytes;
  }
  const refused = await walkAndTry(metered.filter((bytes) => bytes !== undefined), { walked: true, background: true });
  if (refused) {
    const name = names[metered.findIndex((bytes) => bytes === refused.bytes)];
    return unmeteredBy(`the metered copy of ${name} was refused: ${refused.error.message}`, refused.error);
  }
  const modules: Record<string, WebAssembly.Module> = {};
  for (const [i, name] of names.entries()) {
    const have = known[i];
    if (have) {
      modules[name] = have;
      continue;
    }
    try {
      modules[name] = await compile(metered[i]!, true, true, true);
    } catch (error) {
      return unmeteredBy(`the metered copy of ${name} was refused: ${error instanceof Error ? error.message : String(error)}`, error);
    }
    meteredByContent.set(hashes[i]!, new WeakRef(modules[name]));
  }
  return { modules };
}
const meteredByContent = new Map<string, WeakRef<WebAssembly.Module>>();
const METERING_NAMES = new Set([FUEL_EXPORT, REFILL_EXPORT, START_EXPORT]);
/** The compile trials of the lane's copies yield to everything else (compile-trial.ts `nice`). */
const LANE_TRIAL_NICE = 19;

/** What the lane waits at most for a component's walks (the thread is ended past it). */
const METER_THREAD_MS = 30_000;

/**
 * One metering thread at a time, in turn: the lane prepares up to 16 policies at once, and a
 * thread each left ~7 MiB of RSS per policy behind (each thread's own malloc arena and isolate),
 * where one after another reuse the same.
 */
function meterInThread(modules: Uint8Array<ArrayBuffer>[]): Promise<(Metering | Unmetered)[]> {
  const run = meterQueue.then(() => meterInNewThread(modules));
  meterQueue = run.catch(() => undefined);
  return run;
}
let meterQueue: Promise<unknown> = Promise.resolve();

function meterInNewThread(modules: Uint8Array<ArrayBuffer>[]): Promise<(Metering | Unmetered)[]> {
  return new Promise((resolve) => {
    // meter-thread.ts in the checkout, meter-thread.js in the installed package.
    const worker = new Worker(new URL(`./meter-thread${extname(fileURLToPath(import.meta.url))}`, import.meta.url), {
      workerData: modules, stdout: false, stderr: false, resourceLimits: { maxOldGenerationSizeMb: 256 },
    });
    worker.unref();
    const failed = (why: string, again = false): Unmetered[] => modules.map(() => (again ? { unmetered: why, again: true } : { unmetered: why }));
    // At the lowest priority on a busy node, the machine's doing as likely as the module's.
    const timer = setTimeout(() => {
      void worker.terminate();
      resolve(failed(`metering took more than ${METER_THREAD_MS} ms`, true));
    }, METER_THREAD_MS);
    timer.unref();
    worker.once('message', (answers: Metering[]) => {
      clearTimeout(timer);
      void worker.terminate();
      resolve(answers);
    });
    worker.once('error', (error: Error) => {
      clearTimeout(timer);
      resolve(failed(`the metering thread failed: ${error.message}`));
    });
    worker.once('exit', () => {
      clearTimeout(timer);
      resolve(failed('the metering thread ended without an answer'));
    });
  });
}

/**
 * A core policy's bytes as its workers run them, by its compiled module (which every copy of its
 * spec shares), for a metered copy (meteredCopy). Not posted to workers.
 */
const cappedBytes = new WeakMap<WebAssembly.Module, Uint8Array<ArrayBuffer>>();

/**
 * The core policy's module with a fuel counter (metering.ts), compiled after its own compile
 * trial, for the inline lane; or why there is none. Made only when the lane wants it: metering
 * costs a guest time (an AssemblyScript call on the benchmark review, alone in a loop: 25 µs as
 * it came, 41 metered), so workers keep running the module as it came. Its memory is capped
 * again at `memoryBytes` (the main thread keeps little), and it must have one memory, exported,
 * so that the lane sees all of it (red team: an unexported second memory held 56 MiB per policy
 * in the main thread).
 */
export async function meteredCopy(spec: SandboxSpec, bounds: { maxBytes: number; memoryBytes: number }): Promise<WebAssembly.Module | Unmetered> {
  const core = spec.kind === 'core' ? spec.modules['policy.wasm'] : undefined;
  const bytes = core && cappedBytes.get(core);
  if (!bytes || !core) return { unmetered: 'it is not a core module prepared here' };
  const memories = readLayout(bytes).memories.length + WebAssembly.Module.imports(core).filter((i) => i.kind === 'memory').length;
  const exported = WebAssembly.Module.exports(core).filter((e) => e.kind === 'memory').length;
  if (memories !== 1 || exported !== 1) return { unmetered: `it has ${memories} memories, ${exported} exported (the lane takes one, exported)` };
  // The metered copy is never smaller: a module over the bound is not walked again for nothing
  // (red team: the walk holds the main thread ~0.4 s for a 30 MiB module).
  if (bytes.length > bounds.maxBytes) return { unmetered: `it is ${bytes.length} bytes, more than the ${bounds.maxBytes} a metered copy may be` };
  let small: Uint8Array<ArrayBuffer>;
  try {
    small = capMemory(bytes, Math.min(spec.memoryCapBytes, bounds.memoryBytes));
  } catch (error) {
    return { unmetered: `it needs more memory than the lane allows: ${error instanceof Error ? error.message : String(error)}` };
  }
  // In a thread of its own, as a component's (red team 8b: 240 KB of 60,000 empty functions held
  // the main thread ~1 s here, then the copy came out too large). That thread also walks the copy.
  const [metering] = await meterInThread([small]);
  if (!metering || !('bytes' in metering)) return metering ?? { unmetered: 'the metering thread gave no answer' };
  if (metering.bytes.length > bounds.maxBytes) return { unmetered: `its metered copy is ${metering.bytes.length} bytes, more than ${bounds.maxBytes}` };
  try {
    return await compile(metering.bytes, true, true, true);
  } catch (error) {
    return unmeteredBy(`its metered copy was refused: ${error instanceof Error ? error.message : String(error)}`, error);
  }
}

/**
 * Walks a component's core modules (code-walk.ts), unless `walked`, and tries their compiles
 * together, in one child per compiler (compile-trial.ts), before compile() takes them one by one
 * and finds them tried: a dozen modules tried one by one cost two dozen children, most of a
 * TypeScript policy's first load. Modules compiled in this process already are left out. The
 * first refusal, in order, is returned with its module's bytes; a lasting one is remembered,
 * as compile() remembers it.
 */
async function walkAndTry(
  modules: Uint8Array<ArrayBuffer>[], { walked, background }: { walked: boolean; background: boolean },
): Promise<{ bytes: Uint8Array<ArrayBuffer>; error: PrepareError } | undefined> {
  const fresh: { bytes: Uint8Array<ArrayBuffer>; hash: string }[] = [];
  for (const bytes of modules) {
    const hash = hashOf(bytes);
    if (compiled.get(hash)?.deref() || compiling.has(hash)) continue;
    const refused = recentRefusal(hash);
    if (refused) return { bytes, error: refused };
    // Thrown as compile() throws it.
    if (!walked) walk(bytes, hash);
    fresh.push({ bytes, hash });
  }
  const verdicts = await trialCompileAll(fresh, undefined, { firstRefusal: true, ...(background ? { nice: LANE_TRIAL_NICE } : {}) });
  for (const [i, verdict] of verdicts.entries()) {
    if (!verdict.ok && !verdict.untried) return { bytes: fresh[i]!.bytes, error: refusal(fresh[i]!.hash, verdict, background) };
  }
  return undefined;
}

/** Why a module refused lately is refused again, without another trial (see `remember`). */
function recentRefusal(hash: string): PrepareError | undefined {
  const refused = refusals.get(hash);
  return refused && refused.until > Date.now() ? new PrepareError(refused.reason) : undefined;
}

/**
 * Before V8 sees it: a body nested deep enough costs the worker's compiler gigabytes later.
 * Policies loading at once share modules (QuickJS, 1.3 MB, in every TypeScript policy), and none
 * is compiling yet while they are all in walkAndTry: each content is walked once.
 */
function walk(bytes: Uint8Array<ArrayBuffer>, hash: string, { codeSection } = readLayout(bytes)): void {
  if (walkedContent.has(hash)) return;
  const record = walkRecord(hash);
  if (record !== undefined && existsSync(record)) {
    void touch(record);
  } else {
    if (codeSection) checkCodeSection(bytes, codeSection.start, codeSection.end);
    if (record !== undefined) void atomicWrite(record, '').catch(() => undefined);
  }
  if (walkedContent.size >= MAX_WALKED) walkedContent.clear();
  walkedContent.add(hash);
}

/**
 * Where a passed walk is recorded, beside the compile trials' records and pruned with them: the
 * walk of QuickJS (1.3 MB) took about 60 ms of the main thread at every start with a TypeScript
 * policy, while the workers waited for the CPU (bench cold start). Trusted as a trial's pass
 * record is: whoever can write the cache can write the glue the workers run. Undefined without
 * a cache folder (no home folder): the walk then runs every time.
 */
function walkRecord(hash: string): string | undefined {
  try {
    return join(cacheDir(), 'compile-trials', `${hash}-walk-${CODE_WALK_REVISION}`);
  } catch {
    return undefined;
  }
}

/** A walk record counts as used (cache/prune.ts) while its module is: marked at most once a minute. */
function markWalkUsed(hash: string): void {
  const record = walkRecord(hash);
  if (record !== undefined && (touchedAt(record) ?? 0) < Date.now() - 60_000) void touch(record);
}

/** Contents code-walk.ts passed, by hash (the walk depends on nothing else). */
const walkedContent = new Set<string>();
const MAX_WALKED = 10_000;

/** A trial's refusal as the load reports it; a lasting one is remembered. */
function refusal(hash: string, verdict: { reason: string; lasting: boolean }, background: boolean): PrepareError {
  // A trial at the lowest priority may run out of time on a busy node: not the module's doing.
  if (verdict.lasting && !background) remember(hash, verdict.reason);
  return new PrepareError(verdict.reason, verdict.lasting);
}

/** A module's content hash, computed once per buffer (walkAndTry, then compile, hash the same bytes). */
function hashOf(bytes: Uint8Array<ArrayBuffer>): string {
  let hash = hashes.get(bytes);
  if (hash === undefined) hashes.set(bytes, hash = sha256(bytes));
  return hash;
}
const hashes = new WeakMap<Uint8Array<ArrayBuffer>, string>();

/**
 * A core module with its memory plan applied, the same bytes for the same content and plan:
 * every TypeScript policy's QuickJS (1.3 MB) was copied and hashed again for each policy, about
 * 5% of a ten-policy start. Held weakly: what no loaded policy uses any more can go.
 */
function withPlan(core: Uint8Array, hash: string, layout: ModuleLayout, memoryMax: number[], tableMax: number[]): Uint8Array<ArrayBuffer> {
  const key = `${hash}:${memoryMax.join(',')}:${tableMax.join(',')}`;
  const known = plannedByContent.get(key)?.deref();
  if (known) return known;
  const bytes = applyPlan(core, layout, memoryMax, tableMax);
  if (plannedByContent.size >= MAX_WALKED) plannedByContent.clear();
  plannedByContent.set(key, new WeakRef(bytes));
  return bytes;
}
const plannedByContent = new Map<string, WeakRef<Uint8Array<ArrayBuffer>>>();

// Every TypeScript policy carries the same QuickJS runtime (a 1.3 MB core module) and the
// same jco glue. Compiled modules are shared by content: V8 then keeps one copy of the
// machine code for all policies, in the main thread and in every worker it is posted to.
const compiled = new Map<string, WeakRef<WebAssembly.Module>>();
const compiling = new Map<string, Promise<WebAssembly.Module>>();

/**
 * `eager`: every function compiled now, off the main thread, rather than on its first call in the
 * thread that calls it. `walked`: code-walk.ts has checked these very bytes already, on another
 * thread (meter-thread.ts).
 */
async function compile(bytes: Uint8Array<ArrayBuffer>, eager = false, walked = false, background = false): Promise<WebAssembly.Module> {
  const hash = hashOf(bytes);
  const known = compiled.get(hash)?.deref();
  if (known) {
    // Its compile trial and walk are not read again; their records are still what a restart needs.
    markTrialUsed(hash);
    markWalkUsed(hash);
    return known;
  }
  let pending = compiling.get(hash);
  if (!pending) {
    pending = trialThenCompile(bytes, hash, eager, walked, background).then(
      (module) => {
        compiled.set(hash, new WeakRef(module));
        return module;
      },
    ).finally(() => compiling.delete(hash));
    compiling.set(hash, pending);
  }
  return pending;
}

async function trialThenCompile(
  bytes: Uint8Array<ArrayBuffer>, hash: string, eager: boolean, walked: boolean, background: boolean,
): Promise<WebAssembly.Module> {
  const refused = recentRefusal(hash);
  if (refused) throw refused;
  const layout = readLayout(bytes);
  if (!walked) walk(bytes, hash, layout);
  // Nesting is one way to make a compiler run away, not the only one: try both where it is safe.
  const verdict = await trialCompile(bytes, hash, undefined, background ? LANE_TRIAL_NICE : undefined);
  if (!verdict.ok) throw refusal(hash, verdict, background);
  processTypes.charge(hash, layout.types);
  let module: WebAssembly.Module;
  try {
    module = await (eager ? compileEagerly(bytes) : WebAssembly.compile(bytes));
  } catch (error) {
    throw new PrepareError(`invalid WebAssembly: ${error instanceof Error ? error.message : String(error)}`);
  }
  // The trial runs without the host's NODE_OPTIONS: a feature enabled only here would make the
  // module invalid there, and untried.
  if (verdict.invalid) throw new PrepareError('V8 compiles it in the host but refused it in the compile trial, which runs without NODE_OPTIONS; do not enable WebAssembly features there');
  return module;
}

/** Whether this process compiles lazily (V8's default), so that compileEagerly puts it back as it was. */
const LAZY_BY_DEFAULT = !/--no-wasm-lazy-compilation\b/.test([...process.execArgv, process.env.NODE_OPTIONS ?? ''].join(' '));

/**
 * V8 compiles a module's functions lazily, each on its first call, in the thread that calls it.
 * For the inline lane that thread is the main thread (red team: one first call compiled for 350
 * ms there, a shape Liftoff is slow on and the compile trial allows). Lazy compilation is turned
 * off while this compilation runs (V8 reads the flag as it goes, not only as it starts), and V8
 * compiles on its background threads. Other modules compiled meanwhile are compiled eagerly too,
 * which changes when, not what. The compile trial has bounded what compiling the module costs.
 */
async function compileEagerly(bytes: Uint8Array<ArrayBuffer>): Promise<WebAssembly.Module> {
  if (!LAZY_BY_DEFAULT) return WebAssembly.compile(bytes);
  if (eagerCompiles++ === 0) v8.setFlagsFromString('--no-wasm-lazy-compilation');
  try {
    return await WebAssembly.compile(bytes);
  } finally {
    if (--eagerCompiles === 0) v8.setFlagsFromString('--wasm-lazy-compilation');
  }
}
let eagerCompiles = 0;

/**
 * Function types V8 may keep for the life of the process, all distinct modules ever compiled
 * here together. V8 never forgets a type and ends the process when its table (a million) is
 * full: red team, three refused reloads of 400,000 new types each killed the host. A module is
 * charged once, by content, with every type it declares (at most MAX_TYPES, so a host sees
 * thousands of distinct policy modules before this refuses one; a restart starts afresh).
 */
export const MAX_PROCESS_TYPES = 500_000;

export class TypeBudget {
  readonly #limit: number;
  readonly #charged = new Set<string>();
  #types = 0;
  constructor(limit: number) {
    this.#limit = limit;
  }

  /** Charges the module of content `hash` with `types` function types, once; throws past the limit. */
  charge(hash: string, types: number): void {
    if (this.#charged.has(hash)) return;
    if (this.#types + types > this.#limit) {
      throw new PrepareError(`this host has compiled modules declaring ${this.#types} function types, which V8 keeps until the process ends; ` +
        `this module's ${types} more would pass ${this.#limit}: restart the host (a rolling restart) to load it`);
    }
    this.#charged.add(hash);
    this.#types += types;
  }
}

const processTypes = new TypeBudget(MAX_PROCESS_TYPES);

/** Refuses a core module that imports what the host does not give, or gives with another signature (kernel-imports.ts). */
function checkCoreImports(module: WebAssembly.Module, bytes: Uint8Array): void {
  const problem = kernelImportProblem(bytes, readLayout(bytes));
  if (problem) throw new PrepareError(problem);
  for (const { module: namespace, name } of WebAssembly.Module.imports(module)) {
    if (KERNEL_NAMESPACES.get(namespace)?.has(name)) continue; // its signature checked above
    throw new PrepareError(
      `it imports ${foreignText(namespace)}.${foreignText(name)}, which Portcullis does not grant to policies ` +
      '(no files, network, clock, random or environment); build it without that import',
    );
  }
  const exports = WebAssembly.Module.exports(module);
  const entries = exports.filter((e) => e.name === 'validate' || e.name === 'mutate');
  if (entries.length === 0) throw new PrepareError('it exports neither "validate" nor "mutate"; is it a Portcullis policy?');
  // Found at load, not on every call: an entry point that is not a function can never answer.
  for (const e of entries) if (e.kind !== 'function') throw new PrepareError(`it exports "${e.name}" as a ${e.kind}, not a function`);
}

interface Transpiled {
  glue: string;
  cores: Record<string, Uint8Array>;
  /** Each core's content hash: its file in the cache's cores folder. */
  hashes: Record<string, string>;
}

/** What one component transpiled to: jco's file names mapped to content hashes in the cache. */
interface TranspiledIndex {
  /** GLUE_REVISION when stored: an entry from another revision is transpiled again. */
  revision?: number;
  glue: string;
  cores: Record<string, string>;
}

const transpiling = new Map<string, Promise<Transpiled>>();
/**
 * Components whose transpile, and core modules whose compile trial, was refused for what they
 * are (not for a machine-level accident), by digest: a hostile one listed in the configuration
 * holds the one-at-a-time transpiler or trial for up to its time bound, and would again on every
 * reload. Remembered for a while, not forever, in case the machine was the cause after all.
 */
const refusals = new Map<string, { reason: string; until: number }>();
const REFUSAL_MEMORY_MS = 10 * 60_000;
const MAX_REFUSALS = 256;

function remember(digest: string, reason: string): void {
  if (refusals.size >= MAX_REFUSALS) refusals.clear();
  refusals.set(digest, { reason, until: Date.now() + REFUSAL_MEMORY_MS });
}

/**
 * jco's output, cached on disk by content: `cores/<sha256>.wasm`, `glue/<sha256>.mjs` (one
 * shared ES module for all policies built by the same toolchain) and `<digest>.json` naming
 * them. Files are written under a temporary name and renamed, so concurrent loads, in this
 * process or another, never see half a file; identical content makes the last rename harmless.
 */
function transpileCached(bytes: Uint8Array, digest: string): Promise<Transpiled> {
  const refused = refusals.get(digest);
  if (refused && refused.until > Date.now()) return Promise.reject(new PrepareError(refused.reason));
  let pending = transpiling.get(digest);
  if (!pending) {
    pending = readTranspiled(digest).catch(() => transpileAndStore(bytes, digest)).finally(() => transpiling.delete(digest));
    transpiling.set(digest, pending);
  }
  return pending;
}

async function transpileAndStore(bytes: Uint8Array, digest: string): Promise<Transpiled> {
  const out = await transpileIsolated(bytes);
  if (!out.ok) {
    if (out.lasting) remember(digest, out.reason);
    throw new PrepareError(out.reason);
  }
  const foreign = out.imports.filter((name: string) => !COMPONENT_IMPORTS.has(name.replace(/@[^/]*$/, '')));
  if (foreign.length > 0) {
    throw new PrepareError(
      `it imports ${foreign.join(', ')}, which Portcullis does not grant to policies ` +
      '(no files, network, clock, random or environment); build it with `portcullis build`, which stubs WASI out',
    );
  }
  checkContract(out.files);
  const root = join(cacheDir(), 'transpiled');
  const index: TranspiledIndex = { revision: GLUE_REVISION, glue: '', cores: {} };
  for (const [name, content] of Object.entries(out.files)) {
    if (name.includes('/') || name.endsWith('.d.ts')) continue;
    if (name.endsWith('.js')) {
      const raw = Buffer.from(content).toString('utf8');
      const tuned = tuneGlue(raw);
      resourceProblem(raw, tuned);
      const glue = Buffer.from(tuned.text);
      index.glue = sha256(glue);
      await writeOnce(join(root, 'glue', `${index.glue}.mjs`), glue);
    } else {
      const hash = sha256(content);
      index.cores[name] = hash;
      await writeOnce(join(root, 'cores', `${hash}.wasm`), content);
    }
  }
  await writeOnce(join(root, `${digest}.json`), Buffer.from(JSON.stringify(index)));
  return readTranspiled(digest);
}

/** Refuses glue whose resource handle tables this host cannot bound (glue.ts capResourceTables). */
export function resourceProblem(raw: string, tuned: TunedGlue): void {
  if (raw.includes('function rscTableCreateOwn(') && !tuned.applied.includes('resource-cap')) {
    throw new PrepareError('it makes resources, and the glue this jco wrote for it does not have the shape glue.ts caps (a jco upgrade?): ' +
      'its handle tables would be unbounded, outside the memory cap');
  }
  const tables = tuned.text.match(HANDLE_TABLE)?.length ?? 0;
  if (tables > MAX_RESOURCE_TABLES) {
    throw new PrepareError(`it has ${tables} resource handle tables (a resource type in each instance of a component); a policy may have at most ${MAX_RESOURCE_TABLES}`);
  }
}

/**
 * The contract's interfaces as jco declares them (wit/policy.wit), parameter names left out. A
 * component was checked by the names of what it imports and exports; the types matter as much:
 * jco's glue lifts what the types say, in JavaScript, in the thread that runs the guest (red
 * team: `log: func(message: list<string>)` made the glue decode 2,000 views of one 64 KiB
 * slice per call, 125 MB in one call, 8 GB in another, in the main thread with the inline lane).
 * Not complete: jco declares a function returning `result<T, E>` as returning T (reviewer), and
 * the declarations do not say which version of an interface. What such a component's glue does
 * stays in its worker (terminated at its deadline, heap-capped); the inline lane runs only glue
 * it has reviewed (inline-lane.ts REVIEWED_GLUE), which a component of other types does not have.
 */
const CONTRACT: Record<string, string> = {
  'interfaces/portcullis-policy-host.d.ts': "export function log(_: Level, _: string): void; export type Level = 'debug' | 'info' | 'warn' | 'error';",
  'interfaces/portcullis-policy-context.d.ts': 'export function read(_: string): string;',
  'interfaces/portcullis-policy-policy.d.ts':
    'export function metadata(): string; export function validateSettings(_: string): string; export function validate(_: string): string; export function mutate(_: string): string;',
};

function checkContract(files: Record<string, Uint8Array>): void {
  for (const [name, expected] of Object.entries(CONTRACT)) {
    const declared = files[name];
    // An interface the component does not import is not there to check (context reads are optional).
    if (!declared) {
      if (name.endsWith('-policy.d.ts')) throw new PrepareError('it does not export portcullis:policy/policy@0.1.0 (build it with `portcullis build`)');
      continue;
    }
    const shape = Buffer.from(declared).toString('utf8')
      .replace(/\/\*[^]*?\*\//g, '').replace(/\/\/[^\n]*/g, '')
      .replace(/([(,]\s*)[\w$]+(\??:)/g, '$1_$2')
      .replace(/\s+/g, ' ').trim();
    if (shape !== expected) {
      const iface = name.replace('interfaces/', '').replace('.d.ts', '').replace(/^portcullis-policy-/, 'portcullis:policy/');
      throw new PrepareError(`its ${iface} interface does not have the contract's types (wit/policy.wit). It declares: ${cutMessage(shape)} Build it with \`portcullis build\``);
    }
  }
}

/** Writes content-addressed data unless an intact copy is already there. */
async function writeOnce(path: string, content: Uint8Array): Promise<void> {
  const existing = await readFile(path).catch(() => undefined);
  if (existing && sha256(existing) === sha256(content)) {
    void touch(path);
    return;
  }
  await atomicWrite(path, content);
}

async function readTranspiled(digest: string): Promise<Transpiled> {
  const root = join(cacheDir(), 'transpiled');
  const indexPath = join(root, `${digest}.json`);
  const index = JSON.parse(await readFile(indexPath, 'utf8')) as TranspiledIndex;
  if (index.revision !== GLUE_REVISION) throw new Error(`cache entry ${digest} is from an older revision`);
  const cores: Record<string, Uint8Array> = {};
  const used = [indexPath];
  for (const [name, hash] of Object.entries(index.cores)) {
    const path = join(root, 'cores', `${hash}.wasm`);
    const read = await readFile(path);
    // A view, not a copy: readFile's buffer is this content's alone.
    const content = new Uint8Array(read.buffer, read.byteOffset, read.length);
    // A damaged cache entry is transpiled again rather than trusted.
    if (sha256(content) !== hash) throw new Error(`cache entry ${hash} is damaged`);
    cores[name] = content;
    used.push(path);
  }
  const gluePath = join(root, 'glue', `${index.glue}.mjs`);
  if (sha256(await readFile(gluePath)) !== index.glue) throw new Error(`cache entry ${index.glue} is damaged`);
  // Marked used only whole. The glue stays needed while the policy is loaded: a worker that
  // replaces another imports it again (cache/prune.ts keeps what the current set touched).
  for (const path of [...used, gluePath]) void touch(path);
  return { glue: pathToFileURL(gluePath).href, cores, hashes: index.cores };
}
