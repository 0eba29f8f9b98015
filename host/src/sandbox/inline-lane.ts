// The inline lane (issue 14): a cheap policy (an AssemblyScript core module, or a TypeScript
// component) called in the main thread, with no hop to a worker, while the pool is idle. At low
// load a hop costs more than the policy: a message to a sleeping worker and its answer back took
// 80-290 µs on this project's VMs, a whole AssemblyScript call 30-120 µs.
//
// THE INLINE DEADLINE IS TIME, CHECKED AS FUEL RUNS OUT: the lane runs metered copies of the
// modules (metering.ts), whose fuel guest.ts's Meter grants in slices (INLINE_FUEL_SLICE) while
// the call is under INLINE_WALL_MS; every host function checks the same bound (guest.ts). A call
// that runs out, traps, or misbehaves in any way is not answered here: the pool runs it again in
// a worker, under the policy's real deadline, and the worker's answer is the one that counts. A
// policy that did that, or was slow once, is never called inline again (until its sandbox is
// replaced: a change to its module, limits or settings, or a restart), so a policy holds the
// main thread a bounded few times at most (INLINE_SLOW_STRIKES).
// Only policies the pool already trusts come here: answered from a worker, not costly or
// distrusted, quick to instantiate, no context grants (reads are answered by the workers'
// replicas), not fresh per call.
import { performance } from 'node:perf_hooks';
import type { Guest, LogBuffer } from './guest.ts';
import type { CallInput, GuestFunction, LogEntry, SandboxSpec } from './protocol.ts';
import { meteredComponent, meteredCopy, type Unmetered } from './prepare.ts';
import { MAX_HOST_CALLS_PER_INSTANCE } from './import-wrappers.ts';
import { COMPACT_FROM_CHARS } from './outcome.ts';
// Reasons kept for a policy out of the lane are cut, as a copy: a guest chooses its error text
// (red team: a slice of a 60 MB error_set text kept it all, per policy).
import { cutMessage } from '../util/text.ts';
import { threadCpuMicros } from '../util/thread-cpu.ts';

/**
 * Fuel per inline call, all of an instance's modules together. A charge counts the longest path
 * through a loop's body, whichever path runs, and a host or indirect call as 1,000, so real code
 * burns more fuel than it runs instructions: the AssemblyScript examples take 1.0-1.2 million
 * units on the benchmark's 5 KB review (2.3 million at most, when their collector runs), a
 * TypeScript policy 9-23 million, and 200,000 more for each line it logs (QuickJS's dispatch
 * loop is charged its longest case on every opcode). Fuel is not time: code whose every load
 * misses the caches burns ~30 units a µs, QuickJS ~200,000. So the fuel is granted in slices
 * (INLINE_FUEL_SLICE) and at each the clock decides (INLINE_WALL_MS): a call's bound is that
 * time plus about a slice. This budget only caps it besides (about 5 ms of QuickJS).
 */
export const INLINE_FUEL = 1_000_000_000n;
/**
 * Fuel granted at a time (guest.ts Meter). Between two looks at the clock a guest runs at most
 * this: ~35 ms for the worst code the red team found (a pointer chase), well under a ms for
 * straight-line code; a TypeScript call asks 9-23 times (a host call, ~0.3 µs, each).
 */
export const INLINE_FUEL_SLICE = 1_000_000n;
/**
 * A call that took more of the main thread's CPU than this (ms, the whole call: host functions,
 * input, output) ends the policy's inline life; its answer still counts (it came within the
 * deadline). CPU, not wall time: on a busy node the thread is descheduled now and then, and a
 * good policy's call caught by that once left the lane for good (likely what a benchmark run
 * showed: one AS policy's paced p50 was 0.67 ms there, 0.46 ms in a rerun).
 */
export const INLINE_SLOW_MS = 5;
/**
 * Slow calls (INLINE_SLOW_MS) a policy may make before it leaves the lane. One was too few: a
 * major collection of the host's own heap runs inside whatever call is under way, and took a
 * TypeScript policy that never left in 8,000 calls alone out of the lane within 1,700 calls of
 * the benchmark. Each is still bounded by INLINE_WALL_MS, so a policy slow on purpose holds the
 * main thread this many times at most.
 */
export const INLINE_SLOW_STRIKES = 3;
/**
 * The same for an instance's first call, which compiles the functions it runs (see
 * FuelBudget.firstCallWallMs), and that call's time bound (INLINE_WALL_MS for later calls); and
 * the time making the instance may take (its start function runs then), by the wall clock and
 * this thread's CPU time both. Both span awaits, in which the thread may run other work too.
 */
export const INLINE_FIRST_CALL_MS = 25;
/** What an inline instance's start function may burn (see INLINE_FUEL; it is timed as a call is). */
export const INLINE_START_FUEL = 1_000_000_000n;
/** Metered modules larger than this stay in workers: compiling them would hold the main thread. */
export const INLINE_MAX_MODULE_BYTES = 256 * 1024;
/**
 * The same for a component's core modules together (a TypeScript policy's are about 1.8 MB,
 * QuickJS's 1.3 MB shared by all): they are metered and walked on a thread of their own
 * (meter-thread.ts), and compiled once by content.
 */
export const INLINE_MAX_COMPONENT_BYTES = 4 * 2 ** 20;
/** ... and at most this many core modules (a TypeScript policy has 13): each is made in the main thread. */
export const INLINE_MAX_COMPONENT_MODULES = 24;
/**
 * An inline copy's memory cap (its one memory is capped again at this): the main thread keeps
 * little. A policy that needs more traps there and is answered by a worker, with its own cap.
 */
export const INLINE_MAX_MEMORY_BYTES = 8 * 2 ** 20;
/**
 * The most an inline call may take (ms), checked in every host function it calls (see
 * FuelBudget.wallMs): fuel bounds the guest's own code, this the host's work for it. Past it in
 * wall time and in the thread's CPU time both: a descheduled thread is not the guest's doing.
 */
export const INLINE_WALL_MS = 10;
/**
 * The jco glue (its SHA-256, as transpile caches it) of the components the lane takes: the glue
 * this project's SDK and toolchain produce for a TypeScript policy (jco and componentize-qjs as
 * package-lock.json pins them, glue.ts's rewrites), read for what it does in the main thread.
 * The glue lifts and lowers values in JavaScript, as the component's types say, outside the
 * fuel's reach; a component of other types or shape (reviewer: `result<string, E>`, which jco
 * declares as `string`, has its error lifted without bound) has other glue and stays in the
 * workers. test/unit/glue.test.ts fails when the toolchain's glue changes: read the new glue,
 * then add its hash here.
 */
export const REVIEWED_GLUE: ReadonlySet<string> = new Set([
  // GLUE_REVISION 8: as 66a66642… (revision 5) with the resource handle caps (4 lines, read).
  '23308a78a4d08a7c58300307106f15159c03fa2d6463ce68e213f4c80705eb34',
]);

/** Inline instances the main thread holds at most. */
export const INLINE_MAX_POLICIES = 16;
/** The lane takes only policies whose deadline is at least this (ms): an inline call runs a few ms at most. */
export const INLINE_MIN_TIMEOUT_MS = 50;
/** ... and whose instantiation in a worker took at most this (ms of the worker's CPU time): the main thread instantiates its own. */
export const INLINE_MAX_LOAD_MS = 20;
/** The lane is used while the main thread's event loop was busy less than this share of the last INLINE_SAMPLE_MS or more. */
export const INLINE_MAX_UTILIZATION = 0.3;
export const INLINE_SAMPLE_MS = 50;

export type InlineAnswer = { ok: true; output: string; guestMicros: number; logs: LogEntry[] };

/** What the lane times a call by: wall time (ms), and this thread's CPU time (µs). Tests may pass their own. */
export interface LaneClock {
  wallMs(): number;
  cpuMicros(): number;
}

export const THREAD_CLOCK: LaneClock = {
  wallMs: () => performance.now(),
  cpuMicros: threadCpuMicros,
};

/** A policy's metered copy for the lane, within the lane's bounds (sandbox/prepare.ts), or why there is none. */
async function meteredCopyOf(spec: SandboxSpec): Promise<{ modules: Record<string, WebAssembly.Module> } | Unmetered> {
  if (spec.kind === 'core') {
    const copy = await meteredCopy(spec, { maxBytes: INLINE_MAX_MODULE_BYTES, memoryBytes: INLINE_MAX_MEMORY_BYTES });
    return copy instanceof WebAssembly.Module ? { modules: { 'policy.wasm': copy } } : copy;
  }
  return meteredComponent(spec, { maxBytes: INLINE_MAX_COMPONENT_BYTES, memoryBytes: INLINE_MAX_MEMORY_BYTES, maxModules: INLINE_MAX_COMPONENT_MODULES });
}

/** One policy's inline instance, its own log buffer, and whether it has answered (its first call compiles nothing now, but is allowed more). */
interface Entry {
  guest: Guest;
  logs: LogBuffer;
  warm: boolean;
  /** Its slow calls so far (INLINE_SLOW_STRIKES). */
  slow: number;
}

export class InlineLane {
  readonly #entries = new Map<string, Entry>();
  readonly #preparing = new Set<string>();
  /** Keys unloaded while their instance was being made. */
  readonly #gone = new Set<string>();
  /** How many times making each policy's instance failed in a way a busy machine can cause (#strike). */
  readonly #slowMakes = new Map<string, number>();
  /** Policies out of the lane, and why (for tests and logs). */
  readonly #out = new Map<string, string>();
  #busy = false;
  #calls = 0;
  #closed = false;
  /** The main thread's event-loop utilization, sampled at most every INLINE_SAMPLE_MS (see #quiet). */
  #sample = performance.eventLoopUtilization();
  #sampledAt = performance.now();
  #busyShare = 0;
  /** Wall time of the lane's own calls since the last sample (ms). */
  #inlineMs = 0;
  readonly #clock: LaneClock;
  readonly #onLeave: ((key: string, reason: string) => void) | undefined;
  readonly #maxHostCalls: number;

  readonly #copyOf: (spec: SandboxSpec) => Promise<{ modules: Record<string, WebAssembly.Module> } | Unmetered>;

  /**
   * `onLeave`: told once per sandbox (see SandboxPool) why the lane no longer takes it.
   * `copyOf`: makes a policy's metered copy (tests stand in for the metering thread with it).
   */
  constructor(
    clock: LaneClock = THREAD_CLOCK, onLeave?: (key: string, reason: string) => void, maxHostCalls = MAX_HOST_CALLS_PER_INSTANCE,
    copyOf = meteredCopyOf,
  ) {
    this.#clock = clock;
    this.#onLeave = onLeave;
    this.#maxHostCalls = maxHostCalls;
    this.#copyOf = copyOf;
  }

  /** Sandboxes the lane no longer takes: until they are unloaded (a reload that changes the policy's module, limits or settings, or a restart). */
  get out(): number {
    return this.#out.size;
  }

  /** Inline calls answered so far. */
  get calls(): number {
    return this.#calls;
  }

  /**
   * Whether the lane may take this policy's calls: a policy the pool trusts (`trusted`:
   * answered from a worker, not costly, not distrusted), instantiated in a worker within
   * `loadMs` of a worker thread's CPU time, with no context grants, reused between calls, whose deadline is far above what an
   * inline call may take.
   */
  fits(spec: SandboxSpec, timeoutMs: number, trusted: boolean, loadMs: number | undefined): boolean {
    return !spec.fresh && !spec.context?.length && timeoutMs >= INLINE_MIN_TIMEOUT_MS &&
      trusted && (loadMs ?? Infinity) <= INLINE_MAX_LOAD_MS;
  }

  /**
   * Takes the lane for one call of `key`, if its instance is ready, no inline call runs or is
   * about to, and the main thread is quiet: the caller then makes that call (call()), which frees
   * the lane.
   */
  claim(key: string): boolean {
    if (!this.#quiet() || this.#busy || !this.#entries.has(key)) return false;
    this.#busy = true;
    return true;
  }

  /**
   * The main thread was busy with other work than inline calls less than INLINE_MAX_UTILIZATION
   * of the last while: under load its time is the server's limit (TLS, parsing), and a guest run
   * there takes it from other reviews while the workers' cores sit idle (measured: 10-20% fewer
   * reviews a second at saturation). The lane's own calls do not count: a caller sending one
   * review after another kept the thread busy with them alone, and the lane then turned itself
   * off every other turn (a TypeScript call takes ~100 µs here; 9% of AssemblyScript calls back
   * to back went inline once TypeScript ones did too, 71% before).
   */
  #quiet(): boolean {
    const now = performance.now();
    if (now - this.#sampledAt >= INLINE_SAMPLE_MS) {
      const sample = performance.eventLoopUtilization();
      const { active, idle } = performance.eventLoopUtilization(sample, this.#sample);
      this.#busyShare = Math.max(0, active - this.#inlineMs) / Math.max(1, active + idle);
      this.#inlineMs = 0;
      this.#sample = sample;
      this.#sampledAt = now;
    }
    return this.#busyShare < INLINE_MAX_UTILIZATION;
  }

  /**
   * Making the policy's instance failed in a way a busy machine can cause (slow, a time-out at
   * the lowest priority): it is made again at a later quiet moment (want()), and left out only
   * at the INLINE_SLOW_STRIKES-th time, with the last reason.
   */
  #strike(key: string, reason: string): void {
    const strikes = (this.#slowMakes.get(key) ?? 0) + 1;
    this.#slowMakes.set(key, strikes);
    if (strikes >= INLINE_SLOW_STRIKES) this.#setOut(key, `${reason} (${strikes} times)`);
  }

  /** Gives back a claim without calling (the caller sends the call to a worker after all). */
  release(): void {
    this.#busy = false;
  }

  /** Why the policy left the lane, if it did. */
  outReason(key: string): string | undefined {
    return this.#out.get(key);
  }

  /** Policies whose inline instance is ready. */
  get ready(): number {
    return this.#entries.size;
  }

  /** Policies whose inline instance is being made now. */
  get preparing(): number {
    return this.#preparing.size;
  }

  /**
   * Makes the policy's inline instance in the background, once; it is used when ready. Not while
   * the main thread is busy: under load the lane is not used, and making the instance would take
   * CPU from the load (it is asked again at the next quiet call).
   */
  want(spec: SandboxSpec): void {
    const { key } = spec;
    if (this.#closed || this.#entries.has(key) || this.#preparing.has(key) || this.#out.has(key) || !this.#quiet()) return;
    if (this.#entries.size + this.#preparing.size >= INLINE_MAX_POLICIES) return;
    this.#preparing.add(key);
    // Anything that throws before #prepare's own handling (a thread that cannot start) only keeps the policy out.
    const failed = (error: unknown) => this.#setOut(key, `its inline instance failed: ${error instanceof Error ? error.message : String(error)}`);
    void this.#prepare(spec).catch(failed).finally(() => {
      this.#preparing.delete(key);
      this.#gone.delete(key);
    });
  }

  async #prepare(spec: SandboxSpec): Promise<void> {
    if (spec.kind === 'component' && !REVIEWED_GLUE.has(glueHash(spec.glue))) {
      this.#setOut(spec.key, 'its jco glue is not the glue this SDK builds (the lane runs only glue reviewed for the main thread)');
      return;
    }
    const copy = await this.#copyOf(spec);
    if ('unmetered' in copy) {
      if (copy.again) this.#strike(spec.key, copy.unmetered);
      else this.#setOut(spec.key, copy.unmetered);
      return;
    }
    // Imported only now: guest.ts pulls in Extism, which pulls in node:wasi (and its warning).
    await import('./quiet-wasi-warning.ts');
    const { instantiateGuest, LogBuffer: Logs } = await import('./guest.ts');
    const logs = new Logs();
    try {
      // Loaded (parsed, compiled) before the instance is timed: jco's glue is the host's code, not the policy's.
      if (spec.glue) await import(spec.glue);
      const started = this.#clock.wallMs();
      const cpuStarted = this.#clock.cpuMicros();
      // Extism's kernel blocks count against the same 8 MiB as the copy's memory (red team: 60 MiB
      // blocks, within the policy's own cap, made into error texts held in this thread).
      const small = { ...spec, modules: copy.modules, memoryCapBytes: Math.min(spec.memoryCapBytes, INLINE_MAX_MEMORY_BYTES) };
      const guest = await instantiateGuest(small, logs, {
        start: INLINE_START_FUEL, call: INLINE_FUEL, slice: INLINE_FUEL_SLICE,
        wallMs: INLINE_WALL_MS, startWallMs: INLINE_FIRST_CALL_MS, firstCallWallMs: INLINE_FIRST_CALL_MS,
      }, this.#maxHostCalls);
      const ms = this.#clock.wallMs() - started;
      const cpuMs = (this.#clock.cpuMicros() - cpuStarted) / 1000;
      logs.take();
      // Unloaded or closed meanwhile: nobody will call it. Slow to make: its start functions held
      // this thread (each time within the Meter's start window); made again at a later quiet
      // moment, up to INLINE_SLOW_STRIKES times. Slow by the wall clock and by this thread's CPU
      // time, as the Meter judges a start: what runs here runs on this thread's CPU (the lane
      // takes no module that could block it, with atomics), and the wall clock alone counted a
      // thread descheduled on a busy machine against the policy (29 ms, a test run beside others).
      const slow = ms > INLINE_FIRST_CALL_MS && cpuMs > INLINE_FIRST_CALL_MS;
      if (this.#closed || this.#out.has(spec.key) || this.#gone.has(spec.key) || slow) {
        guest.close();
        if (slow) this.#strike(spec.key, `its inline instance took ${Math.round(cpuMs)} ms of this thread's CPU to make, over ${INLINE_FIRST_CALL_MS} ms`);
      } else this.#entries.set(spec.key, { guest, logs, warm: false, slow: 0 });
    } catch (error) {
      this.#setOut(spec.key, `its inline instance failed: ${error instanceof Error ? error.message : String(error)}`);
    }
  }

  /**
   * Calls the policy inline. undefined: not answered here (out of fuel or time, a trap, a fault,
   * an error answer, too large, later than its deadline): the caller runs the call in a worker,
   * and the policy leaves the lane. A slow or growing policy's answer counts, and it leaves.
   */
  async call(spec: SandboxSpec, fn: GuestFunction, input: CallInput, timeoutMs: number): Promise<InlineAnswer | undefined> {
    const entry = this.#entries.get(spec.key);
    if (!entry) {
      this.#busy = false; // dropped since it was claimed
      return undefined;
    }
    const { guest, logs } = entry;
    const started = this.#clock.wallMs();
    const cpuStarted = this.#clock.cpuMicros();
    try {
      const output = await guest.call(fn, input);
      const micros = Math.round((this.#clock.wallMs() - started) * 1000);
      this.#inlineMs += micros / 1000;
      const cpuMicros = Math.round(this.#clock.cpuMicros() - cpuStarted);
      // What a worker judges (output over its limit, an error answer that may be the memory cap)
      // it judges again; an answer later than the policy's deadline would be one a worker never gives.
      const tooLarge = output.length * 3 > spec.maxOutputBytes && Buffer.byteLength(output) > spec.maxOutputBytes;
      // A long answer is read by a worker before this thread parses it (outcome.ts compactOutput).
      const long = output.length >= COMPACT_FROM_CHARS ? 'its answer is longer than the lane takes' : undefined;
      const late = micros > timeoutMs * 1000 ? `a call took ${micros} µs, past its deadline` : undefined;
      const rejudge = tooLarge ? 'its answer is over its output limit' : long ?? (output.includes('"outcome":"error"') ? 'it answered an error' : late);
      const firstCall = !entry.warm;
      entry.warm = true;
      const slow = cpuMicros > (firstCall ? INLINE_FIRST_CALL_MS : INLINE_SLOW_MS) * 1000 && ++entry.slow >= INLINE_SLOW_STRIKES;
      const unfit = slow ? `${INLINE_SLOW_STRIKES} calls took more of the main thread's CPU than the lane allows, the last ${cpuMicros} µs`
        : guest.memoryBytes() > INLINE_MAX_MEMORY_BYTES ? 'its memory grew' : undefined;
      const reason = rejudge ?? unfit;
      if (reason) this.#leave(spec.key, reason);
      // Past half its host calls (import-wrappers.ts): made again at a later quiet moment (want()), as a new policy's is.
      else if (guest.worn()) this.#drop(spec.key);
      if (rejudge) {
        logs.take();
        return undefined;
      }
      this.#calls++;
      return { ok: true, output, guestMicros: micros, logs: logs.take() };
    } catch (error) {
      logs.take();
      const message = error instanceof Error ? error.message : String(error);
      const late = message.startsWith('ran past the ') && message.endsWith('an inline call may take');
      // A fault the host raised (time, host calls) also empties the counters: it is not fuel spent.
      const spent = (error as { code?: unknown }).code !== 'GUEST_FAULT' && (guest.fuelLeft() ?? 0n) < 0n;
      // QuickJS meets the memory cap as a failed allocation, which it throws or, inside some of
      // its own routines, aborts on (a trap): said, whichever it was (a rebuilt SDK moved where a
      // test policy's allocation failed, and the reason read as a bare trap).
      const capped = guest.memoryBytes() > INLINE_MAX_MEMORY_BYTES - 2 ** 20 ? ` (its memory at the lane's ${INLINE_MAX_MEMORY_BYTES / 2 ** 20} MiB cap)` : '';
      this.#leave(spec.key, late ? `it ${message}` : spent ? 'it ran out of inline fuel' : `it failed inline: ${message}${capped}`);
      return undefined;
    } finally {
      this.#busy = false;
    }
  }

  #leave(key: string, reason: string): void {
    this.#setOut(key, reason);
    this.#drop(key);
  }

  #setOut(key: string, reason: string): void {
    // Unloaded (or the lane closed) while its instance was being made: nothing to say, and a
    // reload with the same key must find the lane open to it (drop()).
    if (this.#out.has(key) || this.#closed || this.#gone.has(key)) return;
    const cut = cutMessage(reason);
    this.#out.set(key, cut);
    this.#onLeave?.(key, cut);
  }

  #drop(key: string): void {
    this.#entries.get(key)?.guest.close();
    this.#entries.delete(key);
  }

  /** The policy was unloaded: its instance goes, and a reload with the same key starts afresh. */
  drop(key: string): void {
    this.#drop(key);
    this.#out.delete(key);
    this.#slowMakes.delete(key);
    if (this.#preparing.has(key)) this.#gone.add(key);
  }

  close(): void {
    this.#closed = true;
    for (const key of [...this.#entries.keys()]) this.#drop(key);
  }
}

/** The glue's content hash, from its file name in the transpile cache (prepare.ts). */
export function glueHash(glue: string | undefined): string {
  return /([0-9a-f]{64})\.mjs$/.exec(glue ?? '')?.[1] ?? '';
}
