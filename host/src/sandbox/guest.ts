// Runs inside a sandbox worker: instantiates one policy and calls its functions. One Guest
// per policy per worker, each with its own linear memories; nothing is shared between them.
import createPlugin, { type CallContext, type Plugin } from '@extism/extism';
import { MAX_REQUEST_DECODE_BYTES } from '../context/read.ts';
import { contextReader } from '../context/replica.ts';
import { copyBytes } from '../util/bytes.ts';
import { threadCpuMicros } from '../util/thread-cpu.ts';
import { inputBytes, inputParts, inputText } from './input.ts';
import type { CallInput, FaultKind, GuestFunction, LogEntry, SandboxSpec } from './protocol.ts';
import { PortcullisError } from '../errors.ts';
import { FUEL_EXPORT, setRefill, START_EXPORT, UNLIMITED_FUEL } from './metering.ts';
import { keepImportWrappersGeneric, MAX_HOST_CALLS_PER_INSTANCE, plainBind } from './import-wrappers.ts';

keepImportWrappersGeneric();

export class GuestFault extends PortcullisError {
  readonly fault: FaultKind;
  constructor(fault: FaultKind, message: string) {
    super('GUEST_FAULT', message);
    this.fault = fault;
  }
}

const MAX_LOGS_PER_CALL = 64;
const LEVELS = new Set<unknown>(['debug', 'info', 'warn', 'error']);
const MAX_LOG_LENGTH = 2048;
const noFetch: typeof fetch = () => Promise.reject(new Error('policies have no network access'));
const LOG_DECODER = new TextDecoder();
const ANSWER_ENCODER = new TextEncoder();
const REQUEST_DECODER = new TextDecoder();
const OUTPUT_DECODER = new TextDecoder();

export interface Guest {
  call(fn: GuestFunction, input: CallInput): Promise<string>;
  /** A metered core module's fuel left after its last call (below zero: it ran out), else undefined. */
  fuelLeft(): bigint | undefined;
  /**
   * The instance has made over half the host calls it may make in its life (import-wrappers.ts
   * MAX_HOST_CALLS_PER_INSTANCE): whoever holds it makes it again after this call, long before a
   * call of it could reach the limit.
   */
  worn(): boolean;
  /** Bytes of the largest linear memory of the instance. */
  memoryBytes(): number;
  /** Bytes of all its linear memories: what dropping it leaves for the collector. */
  footprintBytes(): number;
  close(): void;
}

export class LogBuffer {
  entries: LogEntry[] = [];
  push(level: string, message: string): void {
    if (this.entries.length >= MAX_LOGS_PER_CALL) return;
    // The level is the guest's too: one of four words, or info (red team: an array as the level
    // rode uncut to the main thread).
    level = LEVELS.has(level) ? level : 'info';
    const text = String(message);
    // A copy, not a slice: V8's slice of a long string keeps the whole string alive (red team: 20
    // logs of a 60 MiB block held 1.9 GB).
    this.entries.push([level, text.length <= MAX_LOG_LENGTH ? text : Buffer.from(text.slice(0, MAX_LOG_LENGTH)).toString()]);
  }
  take(): LogEntry[] {
    const entries = this.entries;
    this.entries = [];
    return entries;
  }
}

/**
 * What a metered core module (metering.ts) may burn: in its start function, and in each call. A
 * worker gives it no limit (the pool's deadline stops it); the inline lane a small one.
 */
export interface FuelBudget {
  start: bigint;
  call: bigint;
  /**
   * The inline lane's bound on a call's time (ms), checked by every host function the host
   * provides: past it the fuel counter is emptied and the function throws, so the guest traps at
   * its next charge even if it catches the throw. A host function's work is not fuel (red team:
   * 150 config_get calls on a 60 MB block, 1.5% of a call's fuel, held the main thread 6 s).
   */
  wallMs?: number;
  /** Fuel granted to a counter at a time; between two grants the Meter looks at the clock (see Meter). */
  slice?: bigint;
  /** The same bound as wallMs for making the instance, every start function together (default wallMs). */
  startWallMs?: number;
  /**
   * The same for the instance's first call (default wallMs). V8 compiles a Wasm function the
   * first time it runs (--wasm-lazy-compilation, on by default), so a first call pays for
   * compiling what it runs: 7-8 ms of CPU for a TypeScript policy that logs, against 1-1.5 ms
   * after, on this project's VMs. Under the call's bound a good policy left the lane for good on
   * a slower machine (CI: "ran past the 10 ms" on its first call).
   */
  firstCallWallMs?: number;
}

/** Fuel granted at a time when the budget says nothing: more than any call needs (workers). */
const WHOLE = UNLIMITED_FUEL;

/**
 * The fuel of one instance, for all its metered modules together (a component has up to a dozen):
 * one budget per call (or start), granted to each module's counter in slices as the counter
 * runs dry (metering.ts REFILL_EXPORT). At each grant it looks at the clock: past `wallMs` of
 * wall time and of this thread's CPU both, it grants nothing and the guest traps. So a call is
 * bounded by time, within about a slice, whatever fuel is worth in time for its code.
 */
class Meter {
  readonly #counters: WebAssembly.Global[] = [];
  readonly #slice: bigint;
  readonly #callMs: number | undefined;
  readonly #startMs: number | undefined;
  readonly #firstMs: number | undefined;
  #wallMs: number | undefined;
  #making = false;
  #first = true;
  #budget = 0n;
  #granted = 0n;
  #started = 0;
  #cpu = 0;
  /** Set when the meter stopped the call: out of time, or told to (stop()). */
  stopped: string | undefined;

  constructor(budget: FuelBudget) {
    this.#slice = budget.slice ?? WHOLE;
    this.#callMs = budget.wallMs;
    this.#startMs = budget.startWallMs ?? budget.wallMs;
    this.#firstMs = budget.firstCallWallMs ?? budget.wallMs;
    this.#wallMs = budget.wallMs;
  }

  get metered(): boolean {
    return this.#counters.length > 0;
  }

  /** A metered instance: its counter, and its refill slot filled. */
  attach(exports: WebAssembly.Exports): boolean {
    const counter = exports[FUEL_EXPORT];
    if (!(counter instanceof WebAssembly.Global)) return false;
    this.#counters.push(counter);
    setRefill(exports, () => this.#refill(counter));
    return true;
  }

  /** A new call (or, `making`, the instance's start functions), with `budget` units for all the modules together. */
  begin(budget: bigint, making = false): void {
    this.#making = making;
    this.#wallMs = making ? this.#startMs : this.#first ? this.#firstMs : this.#callMs;
    if (!making) this.#first = false;
    this.#budget = budget;
    this.#granted = 0n;
    this.stopped = undefined;
    for (const counter of this.#counters) counter.value = 0n;
    this.#started = performance.now();
    if (this.#wallMs !== undefined) this.#cpu = threadCpuMicros();
  }

  /** Wall time first (cheap); then this thread's CPU: being descheduled on a busy node is not the guest's doing. */
  overTime(): boolean {
    const wallMs = this.#wallMs;
    return wallMs !== undefined && performance.now() - this.#started > wallMs && threadCpuMicros() - this.#cpu > wallMs * 1000;
  }

  /** No more fuel this call: the guest traps at its next charge. */
  stop(why: string): void {
    this.stopped ??= why;
    for (const counter of this.#counters) counter.value = -1n;
  }

  /** What the guest ran past, for its fault. */
  get late(): string {
    return `ran past the ${this.#wallMs} ms ${this.#making ? 'making an inline instance' : 'an inline call'} may take`;
  }

  #refill(counter: WebAssembly.Global): void {
    if (this.stopped !== undefined) return;
    if (this.overTime()) {
      this.stopped = this.late;
      return;
    }
    let value = counter.value as bigint;
    while (value < 0n && this.#granted < this.#budget) {
      const grant = this.#budget - this.#granted < this.#slice ? this.#budget - this.#granted : this.#slice;
      this.#granted += grant;
      value += grant;
    }
    counter.value = value;
  }

  /** Fuel left of the last budget; below zero when it ran out (undefined: nothing metered). */
  left(): bigint | undefined {
    if (this.#counters.length === 0) return undefined;
    const lowest = this.#counters.reduce((low, c) => ((c.value as bigint) < low ? (c.value as bigint) : low), 0n);
    return lowest < 0n ? lowest : this.#budget - this.#granted + this.#counters.reduce((sum, c) => sum + (c.value as bigint), 0n);
  }
}

const NO_FUEL_LIMIT: FuelBudget = { start: UNLIMITED_FUEL, call: UNLIMITED_FUEL };

export async function instantiateGuest(spec: SandboxSpec, logs: LogBuffer, fuel = NO_FUEL_LIMIT, maxHostCalls = MAX_HOST_CALLS_PER_INSTANCE): Promise<Guest> {
  const life = new LifeCalls(maxHostCalls);
  return spec.kind === 'component' ? instantiateComponent(spec, logs, fuel, life) : instantiateCore(spec, logs, fuel, life);
}

/** An instance's host calls over its life, all imports together (import-wrappers.ts). */
class LifeCalls {
  count = 0;
  readonly #max: number;
  constructor(max: number) {
    this.#max = max;
  }
  get worn(): boolean {
    return this.count >= this.#max / 2;
  }
  /** Counts one call; past the limit, the fault to throw (the instance then traps). */
  over(): GuestFault | undefined {
    if (++this.count <= this.#max) return undefined;
    return new GuestFault('trap', `made more than ${this.#max} host calls over its instance's life, the most V8 lets one instance make `
      + 'before it compiles the host a shared import wrapper (the instance is made again after any call that leaves it past half)');
  }
}

/**
 * Calls of the JavaScript a metered component imports (the host log, and jco's glue: its
 * canonical ABI helpers, resource and task bookkeeping) one inline call may make. The policies
 * of this SDK make none but their log lines (64 kept at most); the glue keeps state for some
 * (handles, tasks) that the fuel of one call would let pile up over many.
 */
export const MAX_HOST_CALLS_PER_CALL = 256;
/**
 * Calls of jco's own helpers (not the host log or context reads) an inline instance may make in
 * its life. This SDK's policies make none once made; what the glue keeps for them (handles,
 * tasks) would otherwise pile up over calls, out of sight of the memory cap.
 */
export const MAX_GLUE_CALLS = 4096;

interface ComponentExports {
  metadata(): string;
  validateSettings(input: string): string;
  validate(input: string): string;
  mutate(input: string): string;
}

type JcoInstantiate = (
  getCoreModule: (name: string) => WebAssembly.Module,
  imports: Record<string, unknown>,
  instantiateCore: (module: WebAssembly.Module, imports: WebAssembly.Imports) => Promise<WebAssembly.Instance>,
) => Promise<Record<string, unknown>>;

async function instantiateComponent(spec: SandboxSpec, logs: LogBuffer, budget: FuelBudget, life: LifeCalls): Promise<Guest> {
  const glue = (await import(spec.glue!)) as { instantiate: JcoInstantiate };
  const memories: WebAssembly.Memory[] = [];
  const instantiated = new Map<WebAssembly.Module, number>();
  // Metered core modules (the inline lane's copies, metering.ts): one budget for them all.
  const meter = new Meter(budget);
  const { wallMs } = budget;
  let hostCalls = 0;
  let fault: GuestFault | undefined;
  const halt = (why: string): GuestFault => {
    meter.stop(why);
    return (fault ??= new GuestFault('trap', why));
  };
  // Calls of the glue's own functions (not the host's log or context read) over the instance's
  // life: jco keeps state for some (resource handles), which the lane does not see in linear
  // memory (red team: 250 handles a call, never dropped, ~5 KB of the main thread's heap each).
  let glueCalls = 0;
  let ownCalls = 0;
  const own = <A extends unknown[], R>(fn: (...args: A) => R) => (...args: A): R => {
    ownCalls++;
    return fn(...args);
  };
  /** Bounds a function the host provides (the glue's or ours) by the call's time and count. */
  const bounded = (fn: (...args: unknown[]) => unknown) => (...args: unknown[]): unknown => {
    if (++hostCalls > MAX_HOST_CALLS_PER_CALL) throw halt(`made more than ${MAX_HOST_CALLS_PER_CALL} host calls in one inline call`);
    if (meter.overTime()) throw halt(meter.late);
    const before = ownCalls;
    try {
      return fn(...args);
    } finally {
      if (ownCalls === before && ++glueCalls > MAX_GLUE_CALLS) halt(`made more than ${MAX_GLUE_CALLS} calls of the component glue's own functions`);
    }
  };
  // Red team 7: when a function the glue gives a core module throws (an invalid enum to the host
  // log, a nested component's exception), jco has already opened a subtask for the call and never
  // closes it: ~1.1 KB of the worker's heap for each one the guest catches, outside the memory
  // cap, 500 MiB in five calls that all answered. The first throw poisons the instance: every
  // later call of those functions throws at once (no more state), and the call fails as a trap,
  // which makes the worker discard the instance.
  let poisoned: GuestFault | undefined;
  const guarded = (fn: (...args: unknown[]) => unknown) => (...args: unknown[]): unknown => {
    if (poisoned) throw poisoned;
    try {
      const over = life.over();
      if (over) throw over;
      return fn(...args);
    } catch (error) {
      poisoned ??= error instanceof GuestFault ? error
        : new GuestFault('trap', `a function its glue gave it threw (${describeThrown(error)}); the instance is not used again`);
      throw error;
    }
  };
  // Functions the instances export: what is imported and is not one of these is JavaScript.
  const wasmFunctions = new WeakSet<object>();
  // The host's wrappers of what the glue gives (guarded, and bounded in the inline lane).
  const ours = new WeakSet<object>();
  // One window and one budget for making the whole instance, every start function together (red
  // team: 40 modules whose start functions each ran just under a window of their own held the
  // main thread 264 ms in one stretch).
  meter.begin(budget.start, true);
  const instance = await glue.instantiate(
    (name) => {
      const module = spec.modules[name];
      if (!module) throw new Error(`component glue asked for unknown core module ${name}`);
      return module;
    },
    // The only imports a policy component may have (checked at load): the host log, and (issue 15)
    // context reads, which refuse every kind the policy has no grant for.
    {
      'portcullis:policy/host': { log: own((level: string, message: string) => logs.push(level, message)) },
      'portcullis:policy/context': { read: own(contextReader(spec.policy, spec.context ?? [], spec.memoryCapBytes)) },
    },
    async (module, imports) => {
      // The memory cap was split among the component's core modules once each (planBudget): a
      // component that instantiates one of them again would hold that share again, as often as
      // it likes (red team: 8 instances of a 48 MiB memory under a 64 MiB cap).
      const times = (instantiated.get(module) ?? 0) + 1;
      // Two names may hold the same bytes (compiled once): each was budgeted.
      if (times > Object.values(spec.modules).filter((m) => m === module).length) {
        throw new Error('the component instantiates one of its core modules more than once, which its memory cap does not allow');
      }
      instantiated.set(module, times);
      if (meter.overTime()) throw new Error(`making its instance ${meter.late}`);
      // Every function the host gives the component is guarded, and in the inline lane bounded
      // too, a module's without code as well (its start function may be one of them).
      for (const namespace of Object.values(imports ?? {})) {
        const functions = namespace as Record<string, unknown>;
        for (const [name, value] of Object.entries(functions)) {
          if (typeof value !== 'function' || wasmFunctions.has(value)) continue;
          const fn = value as (...args: unknown[]) => unknown;
          const wrapped = guarded(wallMs !== undefined ? bounded(fn) : fn);
          ours.add(wrapped);
          functions[name] = wrapped;
        }
      }
      // Each function import as V8 will look it up must be one of those or a wasm function: any
      // other (a name the loop cannot see, a WebAssembly.Suspending) would skip the guard, and V8
      // would compile it a shared import wrapper (import-wrappers.ts).
      for (const { module: from, name, kind } of WebAssembly.Module.imports(module)) {
        if (kind !== 'function') continue;
        const value = (imports?.[from] as Record<string, unknown> | undefined)?.[name];
        if (!(typeof value === 'function' && (ours.has(value) || wasmFunctions.has(value)))) {
          throw new Error(`the component's glue gives a core module its import ${from}.${name} as something other than a plain function`);
        }
      }
      const core = await WebAssembly.instantiate(module, imports);
      for (const value of Object.values(core.exports)) {
        if (value instanceof WebAssembly.Memory) memories.push(value);
        if (typeof value === 'function') wasmFunctions.add(value);
      }
      if (meter.attach(core.exports)) {
        // As a start function would run now, on the instance's start budget (the counter is 0 until granted).
        const start = core.exports[START_EXPORT];
        try {
          if (typeof start === 'function') (start as () => void)();
        } catch (error) {
          if (meter.stopped) throw new Error(`a start function ${meter.stopped}`);
          if ((meter.left() ?? 0n) < 0n) throw new Error(`a start function ran past the ${budget.start} units of fuel it may use here`);
          throw error;
        }
      }
      return core;
    },
  );
  const exports = instance['portcullis:policy/policy@0.1.0'] as ComponentExports | undefined;
  if (!exports) throw new Error('the component does not export portcullis:policy/policy@0.1.0');
  const fns: Record<GuestFunction, (input: string) => string> = {
    metadata: () => exports.metadata(),
    'validate-settings': (input) => exports.validateSettings(input),
    validate: (input) => exports.validate(input),
    mutate: (input) => exports.mutate(input),
  };
  if (!meter.metered) {
    return {
      call: (fn, input) => {
        const output = fns[fn](inputText(input));
        // A guest that caught what a glue function threw and answered anyway failed for that.
        return poisoned ? Promise.reject(poisoned) : Promise.resolve(output);
      },
      fuelLeft: () => undefined,
      worn: () => life.worn,
      memoryBytes: () => largestMemory(memories),
      footprintBytes: () => total(memories),
      close: () => {},
    };
  }
  return {
    call: (fn, input) => {
      const text = inputText(input);
      hostCalls = 0;
      fault = undefined;
      meter.begin(budget.call);
      try {
        const output = fns[fn](text);
        // A guest that caught what a host function threw and answered anyway failed for that.
        const caught = fault ?? poisoned;
        if (caught) throw caught;
        // And an answer after the meter stopped it (should the glue ever swallow the trap) is none.
        if (meter.stopped !== undefined) throw new GuestFault('trap', meter.stopped);
        return Promise.resolve(output);
      } catch (error) {
        const stopped = meter.stopped;
        return Promise.reject(fault ?? (stopped ? new GuestFault('trap', stopped) : error instanceof Error ? error : new Error(String(error))));
      }
    },
    fuelLeft: () => meter.left(),
    worn: () => life.worn,
    memoryBytes: () => largestMemory(memories),
    footprintBytes: () => total(memories),
    close: () => {},
  };
}


/** What a glue function threw, in a few words: a guest may put anything in a thrown value. */
function describeThrown(error: unknown): string {
  const text = error instanceof Error ? `${error.name}: ${error.message}` : 'a value that is not an Error';
  return text.length > 200 ? `${text.slice(0, 200)}…` : text;
}

const NO_INPUT: [Uint8Array, Uint8Array] = [new Uint8Array(0), new Uint8Array(0)];

/**
 * A guest's offset or length: an i32 is read unsigned, as wasm addresses are; an i64 (BigInt) at
 * or past 2^32 is no address at all (NaN, so it fails every bounds check) rather than wrapping
 * round to one (red team: 0x100000400 read offset 1024).
 */
function u32(value: number | bigint): number {
  if (typeof value === 'number') return value >>> 0;
  return value >= 0n && value < 2n ** 32n ? Number(value) : Number.NaN;
}
/**
 * What one Extism kernel block costs the worker besides its bytes (its Block, ArrayBuffer and
 * DataView, and its slot): measured at about 500 bytes of RSS per empty block on Node 24.
 */
const BLOCK_COST = 512;
/**
 * Kernel blocks, variables and context answers one call may make in all, whatever its memory
 * cap. Each also takes objects on the worker's JavaScript heap (its 512 MiB limit, pool.ts), not
 * only the bytes the cap counts: under a 1.5 GiB cap, 8 million empty blocks ran that heap out,
 * and V8 aborted the whole host (red team). Below 32,768: Extism's block addresses (index << 48,
 * an i64) turn negative from there (review helper). The SDKs make a handful.
 */
const MAX_KERNEL_OBJECTS = 32_000;
/** What one Extism variable costs besides its name (a map entry). */
const VAR_COST = 128;
const MAX_VAR_NAME_BYTES = 4096;

/** The AssemblyScript SDK's handler behind each entry point, for the hint of a guest that returned something else. */
const HANDLERS: Record<string, string> = { validate: 'handleValidate', mutate: 'handleMutate', validate_settings: 'handleSettings' };

const CORE_EXPORTS: Record<GuestFunction, string> = {
  metadata: '',
  'validate-settings': 'validate_settings',
  validate: 'validate',
  mutate: 'mutate',
};

/**
 * Extism's kernel functions for one plugin: the object its call context keeps under a symbol
 * named "env", which is also what the module imports as extism:host/env (Extism 1.x). Checked,
 * so that an Extism that keeps them elsewhere fails every instantiation instead of going uncounted.
 */
function extismKernel(context: unknown): Record<string, unknown> {
  const holder = context as Record<symbol, unknown> | null;
  const symbol = holder === null || typeof holder !== 'object' ? undefined : Object.getOwnPropertySymbols(holder).find((s) => s.description === 'env');
  const kernel = symbol === undefined ? undefined : holder![symbol];
  if (typeof kernel !== 'object' || kernel === null || typeof (kernel as Record<string, unknown>).load_u8 !== 'function') {
    throw new Error("Extism's call context does not keep its kernel functions where this host expects them");
  }
  return kernel as Record<string, unknown>;
}

async function instantiateCore(spec: SandboxSpec, logs: LogBuffer, budget: FuelBudget, life: LifeCalls): Promise<Guest> {
  const module = spec.modules['policy.wasm']!;
  const exported = new Set(WebAssembly.Module.exports(module).map((e) => e.name));
  const logger = {
    info: (m: string) => logs.push('info', m), debug: (m: string) => logs.push('debug', m),
    warn: (m: string) => logs.push('warn', m), error: (m: string) => logs.push('error', m),
    trace: (m: string) => logs.push('debug', m), log: (m: string) => logs.push('info', m),
  } as unknown as Console;
  // Extism's kernel serves `alloc` with ArrayBuffers outside the guest's linear memory, where
  // the memory cap does not reach. Meter them per call against the same cap, each block at its
  // length plus what a block costs the worker whatever its length (red team: `alloc(0)` in a
  // loop, metered at nothing, grew the host by a gigabyte in one two-second call).
  let allocated = 0;
  let objects = 0;
  // A guest can catch what a host function throws (exception handling's catch_all) and run on:
  // the first fault of a call is kept and decides the call however the guest carries on.
  let fault: GuestFault | undefined;
  const kept = (error: GuestFault): GuestFault => {
    fault ??= error;
    return error;
  };
  /** Counts `bytes` of kernel memory against the cap, or faults the call naming `what`. */
  const charge = (bytes: number, what: string): void => {
    // Checked before it counts: a negative length would lower the meter (a red-team bypass).
    if (!(bytes >= 0) || allocated + bytes > spec.memoryCapBytes) {
      throw kept(new GuestFault('memory', `exceeded its ${Math.round(spec.memoryCapBytes / 2 ** 20)} MiB memory cap (${what})`));
    }
    if (++objects > MAX_KERNEL_OBJECTS) {
      throw kept(new GuestFault('memory', `made more than ${MAX_KERNEL_OBJECTS} Extism kernel blocks, variables and context answers in one call, `
        + 'the most a call may make (each takes some of the worker\'s own heap)'));
    }
    allocated += bytes;
  };
  const alloc = (context: CallContext, length: bigint): bigint => {
    charge(Number(length) + BLOCK_COST, 'Extism kernel allocations');
    return context.alloc(length);
  };
  // Extism keeps variables in a map of its own that no reset clears and no meter sees: a guest
  // that set 200,000 names per call piled them up across calls until the worker's heap limit,
  // which V8 then enforced by aborting the whole host (red team). Ours live for one call (as
  // their values, kernel blocks, always did) and count against the cap.
  const vars = new Map<string, bigint>();
  const varName = (context: CallContext, addr: bigint): string | undefined => {
    if (context.length(addr) > BigInt(MAX_VAR_NAME_BYTES)) {
      throw kept(new GuestFault('trap', `named a variable longer than ${MAX_VAR_NAME_BYTES} bytes`));
    }
    return context.read(addr)?.text();
  };
  const var_get = (context: CallContext, addr: bigint): bigint => {
    const name = varName(context, addr);
    return name === undefined ? 0n : (vars.get(name) ?? 0n);
  };
  const var_set = (context: CallContext, addr: bigint, value: bigint): void => {
    const name = varName(context, addr);
    if (name === undefined) return;
    if (value === 0n) {
      vars.delete(name);
      return;
    }
    if (!vars.has(name)) charge(VAR_COST + name.length * 2, 'Extism variables');
    // As Extism does: a variable names a whole block, whatever offset it was given.
    vars.set(name, (value >> 48n) << 48n);
  };
  // Issue 15: context reads for AssemblyScript policies (sdk/assembly/context.ts), JSON in and out.
  const readContext = contextReader(spec.policy, spec.context ?? [], spec.memoryCapBytes);
  // Answers are stored in kernel memory like `alloc`s, so they count against the same cap: a
  // guest that reads in a loop without freeing cannot grow the worker past it.
  const portcullis_context_read = (context: CallContext, offset: bigint): bigint => {
    const request = context.read(offset);
    // A fresh Uint8Array: Extism copies from its buffer, and Buffer.from may share a pooled one.
    const answer = ANSWER_ENCODER.encode(readContext(request === null ? '' : request.text()));
    charge(answer.length + BLOCK_COST, 'context read answers');
    return context.store(answer);
  };
  // Issue 14: Extism's input is read by the guest 8 bytes per host call. A module built with this
  // SDK asks for it instead in one call that copies it into a buffer it allocated (sdk/assembly).
  let parts = NO_INPUT;
  // Filled once the instance exists; the host functions above are created before it.
  const guest: { memory?: WebAssembly.Memory } = {};
  /**
   * `length` bytes at `offset` of the guest's memory, or a fault naming `what` when they are
   * outside it. The SDK declares both i32; a module that declares i64 sends BigInts, read alike.
   */
  const guestBytes = (offset: number | bigint, length: number | bigint, what: string): Uint8Array => {
    const at = u32(offset);
    const size = u32(length);
    // Red team 6: a module exporting its memory under another name read "outside its 0-byte memory".
    if (!guest.memory) throw kept(new GuestFault('trap', `gave ${what}, but it exports no memory named "memory", where the host reads and writes it (export the module's memory as "memory")`));
    if (!(at + size <= guest.memory.buffer.byteLength)) {
      const shown = (n: number, given: number | bigint) => (Number.isNaN(n) ? String(given) : n);
      throw kept(new GuestFault('trap', `gave ${what} at ${shown(at, offset)} (${shown(size, length)} bytes), outside its ${guest.memory.buffer.byteLength}-byte memory`));
    }
    return new Uint8Array(guest.memory.buffer, at, size);
  };
  // The same for context reads (this SDK's contextGet/contextList): the request is read where the
  // guest wrote it and the answer written where it allocated room, instead of both going through
  // Extism's kernel 1 and 8 bytes per host call (~15 µs of a 25 µs get). The answer waits here
  // between the two calls; a new request replaces it, so one is held at most.
  let pendingAnswer = NO_INPUT[0];
  const portcullis_context_call = (_context: CallContext, offset: number | bigint, length: number | bigint): number => {
    // A request longer than the reader takes is still refused by it, without decoding megabytes first.
    const request = guestBytes(offset, length, 'a context request');
    pendingAnswer = ANSWER_ENCODER.encode(readContext(REQUEST_DECODER.decode(request.subarray(0, MAX_REQUEST_DECODE_BYTES))));
    return pendingAnswer.length;
  };
  const portcullis_context_answer = (_context: CallContext, offset: number | bigint): void => {
    guestBytes(offset, pendingAnswer.length, 'room for a context answer').set(pendingAnswer);
    pendingAnswer = NO_INPUT[0];
  };
  const portcullis_input_length = (): number => parts[0].length + parts[1].length;
  const portcullis_input_read = (_context: CallContext, offset: number | bigint): void => {
    const [head, tail] = parts;
    const view = guestBytes(offset, head.length + tail.length, 'room for its input');
    copyBytes(head, view);
    copyBytes(tail, view, head.length);
  };
  // Extism's own log functions decode the whole block a guest names, however large; these
  // decode only what is kept.
  const logTo = (level: string) => (context: CallContext, addr: bigint): void => {
    if (logs.entries.length >= MAX_LOGS_PER_CALL) return;
    const block = context.read(addr);
    if (block === null) return;
    logs.push(level, LOG_DECODER.decode(block.bytes().subarray(0, MAX_LOG_LENGTH * 4)));
  };
  const oneCopy = WebAssembly.Module.imports(module).some((i) => i.module === 'extism:host/user' && i.name === 'portcullis_input_read');
  // Extism's own config_get decodes the whole block it is named, however large, to look up a
  // configuration policies are never given: the answer is always "none" (0).
  const config_get = (): bigint => 0n;
  // Extism's JavaScript kernel answers the whole block output_set names, whatever offset and
  // length it is given; Extism's own runtime answers the `length` bytes at that address, read as
  // the call ends (red team 2: JSON written at the start of a larger block read as "not JSON" for
  // the zeros after it). The block's bytes are held, not copied: a guest that sets its output in
  // a loop costs nothing per turn (reviewer), and one that frees the block still answers.
  let output: Uint8Array | undefined;
  let calling = false;
  const output_set = (context: CallContext, addr: bigint, length: bigint): void => {
    // A TypeError, as Extism's own throws there: startError names it for the start function.
    if (!calling) throw new TypeError('output_set outside a call');
    const index = addr >> 48n;
    const offset = Number(BigInt.asUintN(48, addr));
    // Block 0 is Extism's own placeholder, never one the guest allocated.
    const block = index === 0n ? undefined : context.read(addr)?.bytes();
    if (block === undefined) throw kept(new GuestFault('trap', `set its output at address 0x${BigInt.asUintN(64, addr).toString(16)}, which is not in a block it allocated`));
    const size = Number(length);
    if (size < 0 || offset + size > block.length) {
      throw kept(new GuestFault('trap', `set its output to ${length} bytes at offset ${offset} of a ${block.length}-byte block`));
    }
    if (size > spec.maxOutputBytes) throw kept(outputTooLarge(spec, size));
    output = block.subarray(offset, offset + size);
  };
  const meter = new Meter(budget);
  const functions: Record<string, Record<string, (context: CallContext, ...args: never[]) => unknown>> = {
    'extism:host/env': {
      alloc, var_get, var_set, config_get, output_set,
      log_info: logTo('info'), log_warn: logTo('warn'), log_error: logTo('error'), log_debug: logTo('debug'), log_trace: logTo('debug'),
      // Extism 1.0 has no get_log_level; PDKs ask it to skip formatting logs nobody reads. Every level is kept (64 lines a call at most).
      get_log_level: () => 0,
    },
    'extism:host/user': { portcullis_context_read, portcullis_context_call, portcullis_context_answer, portcullis_input_length, portcullis_input_read },
  };
  const { wallMs } = budget;
  if (wallMs !== undefined) {
    for (const namespace of Object.values(functions)) {
      for (const [name, fn] of Object.entries(namespace)) {
        namespace[name] = (context, ...args) => {
          if (meter.overTime()) {
            meter.stop(meter.late);
            throw kept(new GuestFault('trap', meter.late));
          }
          return fn(context, ...args);
        };
      }
    }
  }
  // Every host call counts against the instance's life (import-wrappers.ts), ours and those of
  // Extism's own kernel (load_u8, store_u64, ...), which it keeps in its call context.
  const counted = <A extends unknown[], R>(fn: (...args: A) => R) => (...args: A): R => {
    const over = life.over();
    if (over) throw kept(over);
    return fn(...args);
  };
  let kernelCounted = false;
  const countKernel = ([context]: unknown[]): void => {
    if (kernelCounted) return;
    kernelCounted = true;
    const kernel = extismKernel(context);
    for (const [name, fn] of Object.entries(kernel)) {
      if (typeof fn === 'function') kernel[name] = counted(fn as (...args: unknown[]) => unknown);
    }
  };
  // Extism binds each of these to its call context: a plain closure instead (import-wrappers.ts).
  for (const namespace of Object.values(functions)) {
    for (const [name, fn] of Object.entries(namespace)) namespace[name] = plainBind(counted(fn), countKernel);
  }
  let plugin: Plugin;
  try {
    // The module itself, not a manifest naming it: Extism checks a manifest against the global
    // Response, and (as for the global fetch when none is given) that first read loads Node's
    // built-in undici into the worker, ~30 ms of its start and its memory. Nothing is fetched.
    plugin = await createPlugin(module, {
      useWasi: false, runInWorker: false, logger, allowedHosts: [], fetch: noFetch,
      functions: functions as NonNullable<Parameters<typeof createPlugin>[1]>['functions'],
    });
  } catch (error) {
    throw startError(error);
  }
  const instance = await plugin.getInstance();
  // A metered module's start function is an export, run now on the start budget (metering.ts).
  if (meter.attach(instance.exports)) {
    meter.begin(budget.start, true);
    const start = instance.exports[START_EXPORT];
    try {
      if (typeof start === 'function') (start as () => void)();
    } catch (error) {
      void plugin.close();
      if (meter.stopped) throw new Error(`its start function ${meter.stopped}`);
      if ((meter.left() ?? 0n) < 0n) throw new Error(`its start function ran past the ${budget.start} units of fuel it may use here`);
      throw startError(error);
    }
  }
  let returned: unknown;
  keepReturnValues(plugin, Object.values(CORE_EXPORTS).filter((name) => exported.has(name)), (value) => {
    returned = value;
  });
  const memories = Object.values(instance.exports).filter((v): v is WebAssembly.Memory => v instanceof WebAssembly.Memory);
  guest.memory = instance.exports.memory instanceof WebAssembly.Memory ? instance.exports.memory : undefined;
  return {
    call: async (fn, input) => {
      // A core module says what it can do by what it exports.
      if (fn === 'metadata') {
        return JSON.stringify({ modes: ['validate', 'mutate'].filter((m) => exported.has(m)), settings: exported.has('validate_settings') });
      }
      const name = CORE_EXPORTS[fn];
      if (!exported.has(name)) throw new GuestFault('trap', `the module does not export "${name}"`);
      allocated = 0;
      objects = 0;
      fault = undefined;
      returned = undefined;
      output = undefined;
      calling = true;
      meter.begin(budget.call);
      if (oneCopy) parts = inputParts(input);
      try {
        await plugin.call(name, oneCopy ? undefined : inputBytes(input)).catch((error: unknown) => {
          // A guest that caught a host function's fault and then trapped failed for that fault.
          throw fault ?? (meter.stopped ? new GuestFault('trap', meter.stopped) : error);
        });
        // Set by the host functions during the call, which the compiler cannot see from here.
        const caught = fault as GuestFault | undefined;
        if (caught) throw caught;
        const code = returned;
        if ((typeof code === 'number' && code !== 0) || (typeof code === 'bigint' && code !== 0n)) {
          throw new GuestFault('trap', `returned ${code} from ${name}, which says it failed (Extism's convention: 0 is success), without an error message; its output, if any, is not used ` +
            `(an entry point returns the SDK's status: in AssemblyScript, \`export function ${name}(): i32 { return ${HANDLERS[name] ?? 'handleValidate'}(check); }\`)`);
        }
        // Extism's output is always null: output_set above keeps it instead (its limit checked there).
        return output === undefined ? '' : OUTPUT_DECODER.decode(output);
      } finally {
        output = undefined;
        calling = false;
        parts = NO_INPUT;
        pendingAnswer = NO_INPUT[0];
        vars.clear();
        // Extism 1.0 never frees a call's memory blocks: without a reset they pile up (~6 KB a
        // review) until block 32,768 overflows its address encoding, after 16,384 calls. Freed
        // as the call ends, not when the next begins: up to the cap per call would otherwise
        // stay while the policy is idle. Linear memory survives a reset.
        await plugin.reset();
      }
    },
    fuelLeft: () => meter.left(),
    worn: () => life.worn,
    memoryBytes: () => largestMemory(memories),
    footprintBytes: () => total(memories),
    close: () => void plugin.close(),
  };
}

/**
 * A start function runs before any call: Extism's output, error and input functions then fail
 * inside the kernel with a TypeError that names none of it (red team).
 */
function startError(error: unknown): unknown {
  if (error instanceof TypeError) return new Error(`its start function called a host function that works only during a call (${error.message})`);
  // A trap while instantiating is its start function's, unless V8 names a segment (data or
  // elements past the end of their memory or table): said as a bare trap, it read as a call's.
  if (error instanceof WebAssembly.RuntimeError && !/segment/i.test(error.message)) {
    return new Error(`its start function trapped (wasm trap: ${error.message.replace(/^wasm trap: /, '')})`);
  }
  return error;
}

/**
 * Extism's convention is that an export returning non-zero has failed (its Rust runtime reports
 * it as an error), but this JS SDK drops the value: a module that wrote an allow and returned 1
 * was allowed (red team). Each of `names` is wrapped, where the SDK looks it up for a call, to
 * hand its return value to `onReturn`. Relies on the SDK's own lookup (pinned 1.0.x): if it
 * changes, policies refuse to load here rather than run unchecked.
 */
function keepReturnValues(plugin: Plugin, names: string[], onReturn: (value: unknown) => void): void {
  type Target = { instance: { exports: WebAssembly.Exports } };
  const lookup = (plugin as unknown as { lookupTarget?: (name: string) => Target | undefined }).lookupTarget;
  const target = typeof lookup === 'function' ? lookup.call(plugin, '0') : undefined;
  if (!target?.instance?.exports) throw new Error('this version of @extism/extism does not let the host read a function\'s return value; pin 1.0.x');
  const exports: WebAssembly.Exports = { ...target.instance.exports };
  for (const name of names) {
    const fn = exports[name];
    if (typeof fn !== 'function') continue;
    exports[name] = (...args: unknown[]): unknown => {
      const value: unknown = (fn as (...a: unknown[]) => unknown)(...args);
      onReturn(value);
      return value;
    };
  }
  target.instance = { exports };
}

function largestMemory(memories: WebAssembly.Memory[]): number {
  return memories.reduce((max, m) => Math.max(max, m.buffer.byteLength), 0);
}

function total(memories: WebAssembly.Memory[]): number {
  return memories.reduce((sum, m) => sum + m.buffer.byteLength, 0);
}

export function outputTooLarge(spec: SandboxSpec, size: number): GuestFault {
  return new GuestFault('output', `returned ${size} bytes, more than its ${spec.maxOutputBytes}-byte output limit`);
}
