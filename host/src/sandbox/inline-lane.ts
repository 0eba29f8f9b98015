// The inline lane (issue 14): a cheap core-module policy called in the main thread, with no hop
// to a worker, while the pool is idle. At low load a hop costs more than the policy: a message
// to a sleeping worker and its answer back took 80-290 µs on this project's VMs, a whole
// AssemblyScript call 30-120 µs.
//
// THE INLINE DEADLINE IS FUEL: the lane runs a metered copy of the module (metering.ts), given
// INLINE_FUEL per call, about a millisecond of guest work. A call that runs out, traps, or
// misbehaves in any way is not answered here: the pool runs it again in a worker, under the
// policy's real deadline, and the worker's answer is the one that counts. The policy is then
// never called inline again (until it is reloaded), so a policy costs the main thread at most
// one such call. Only policies the pool already trusts come here: answered from a worker, not
// costly or distrusted, quick to instantiate, no context grants (reads are answered by the
// workers' replicas), not fresh per call.
import type { Guest, LogBuffer } from './guest.ts';
import type { CallInput, GuestFunction, LogEntry, SandboxSpec } from './protocol.ts';
import { meteredCopy } from './prepare.ts';
import { START_FUEL } from './metering.ts';

/**
 * Fuel per inline call. A charge counts every instruction of a loop's body, whichever run, so
 * real code burns far more fuel than it runs instructions: the AssemblyScript examples take
 * 1.2-1.6 million units for a 43-60 µs call (3.1 million at most, when their collector runs).
 * Straight-line code that runs every instruction it is charged for gets about 3-10 ms of it.
 */
export const INLINE_FUEL = 10_000_000n;
/**
 * A call slower than this (ms, the whole call: host functions, input, output) is slow; a
 * policy's INLINE_SLOW_CALLS-th slow call ends its inline life. More than one: a collection in
 * the main thread's heap can stop any call for a few ms.
 */
export const INLINE_SLOW_MS = 3;
export const INLINE_SLOW_CALLS = 3;
/**
 * The same for an instance's first call, which also compiles the functions it runs (V8 compiles
 * a module's functions on their first call): 4 ms for the AssemblyScript examples here.
 */
export const INLINE_FIRST_CALL_MS = 25;
/** Metered modules larger than this stay in workers: compiling them would hold the main thread. */
export const INLINE_MAX_MODULE_BYTES = 256 * 1024;
/**
 * An inline copy's memory cap (its one memory is capped again at this): the main thread keeps
 * little. A policy that needs more traps there and is answered by a worker, with its own cap.
 */
export const INLINE_MAX_MEMORY_BYTES = 8 * 2 ** 20;
/**
 * The most an inline call may take (ms), checked in every host function it calls (see
 * FuelBudget.wallMs): fuel bounds the guest's own code, this the host's work for it.
 */
export const INLINE_WALL_MS = 10;
/** Inline instances the main thread holds at most. */
export const INLINE_MAX_POLICIES = 16;

export type InlineAnswer = { ok: true; output: string; guestMicros: number; logs: LogEntry[] };

/** One policy's inline instance, its own log buffer, and its slow calls so far (undefined: it has not answered yet). */
interface Entry {
  guest: Guest;
  logs: LogBuffer;
  slowCalls: number | undefined;
}

export class InlineLane {
  readonly #entries = new Map<string, Entry>();
  readonly #preparing = new Set<string>();
  /** Keys unloaded while their instance was being made. */
  readonly #gone = new Set<string>();
  /** Policies out of the lane, and why (for tests and logs). */
  readonly #out = new Map<string, string>();
  #busy = false;
  #calls = 0;
  #closed = false;

  /** Inline calls answered so far. */
  get calls(): number {
    return this.#calls;
  }

  /**
   * Takes the lane for one call of `key`, if its instance is ready and no inline call runs or is
   * about to: the caller then makes that call (call()), which frees the lane.
   */
  claim(key: string): boolean {
    if (this.#busy || !this.#entries.has(key)) return false;
    this.#busy = true;
    return true;
  }

  /** Why the policy left the lane, if it did. */
  outReason(key: string): string | undefined {
    return this.#out.get(key);
  }

  /** Makes the policy's inline instance in the background, once; it is used when ready. */
  want(spec: SandboxSpec): void {
    const { key } = spec;
    if (this.#closed || this.#entries.has(key) || this.#preparing.has(key) || this.#out.has(key)) return;
    if (this.#entries.size + this.#preparing.size >= INLINE_MAX_POLICIES) return;
    this.#preparing.add(key);
    void this.#prepare(spec).finally(() => {
      this.#preparing.delete(key);
      this.#gone.delete(key);
    });
  }

  async #prepare(spec: SandboxSpec): Promise<void> {
    const module = await meteredCopy(spec, { maxBytes: INLINE_MAX_MODULE_BYTES, memoryBytes: INLINE_MAX_MEMORY_BYTES });
    if (!(module instanceof WebAssembly.Module)) {
      this.#out.set(spec.key, module.unmetered);
      return;
    }
    // Imported only now: Extism pulls in node:wasi, and a host with no core policy never needs it.
    await import('./quiet-wasi-warning.ts');
    const { instantiateGuest, LogBuffer: Logs } = await import('./guest.ts');
    const logs = new Logs();
    try {
      const guest = await instantiateGuest({ ...spec, modules: { 'policy.wasm': module } }, logs, { start: START_FUEL, call: INLINE_FUEL, wallMs: INLINE_WALL_MS });
      logs.take();
      // Unloaded or closed meanwhile: nobody will call it.
      if (this.#closed || this.#out.has(spec.key) || this.#gone.has(spec.key)) guest.close();
      else this.#entries.set(spec.key, { guest, logs, slowCalls: undefined });
    } catch (error) {
      this.#out.set(spec.key, `its inline instance failed: ${error instanceof Error ? error.message : String(error)}`);
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
    const started = performance.now();
    try {
      const output = await guest.call(fn, input);
      const micros = Math.round((performance.now() - started) * 1000);
      // What a worker judges (output over its limit, an error answer that may be the memory cap)
      // it judges again; an answer later than the policy's deadline would be one a worker never gives.
      const tooLarge = output.length * 3 > spec.maxOutputBytes && Buffer.byteLength(output) > spec.maxOutputBytes;
      const late = micros > timeoutMs * 1000 ? `a call took ${micros} µs, past its deadline` : undefined;
      const rejudge = tooLarge ? 'its answer is over its output limit' : output.includes('"outcome":"error"') ? 'it answered an error' : late;
      const firstCall = entry.slowCalls === undefined;
      entry.slowCalls = (entry.slowCalls ?? 0) + (micros > (firstCall ? INLINE_FIRST_CALL_MS : INLINE_SLOW_MS) * 1000 ? 1 : 0);
      const unfit = entry.slowCalls >= INLINE_SLOW_CALLS || (firstCall && entry.slowCalls > 0) ? `a call took ${micros} µs`
        : guest.memoryBytes() > INLINE_MAX_MEMORY_BYTES ? 'its memory grew' : undefined;
      const reason = rejudge ?? unfit;
      if (reason) this.#leave(spec.key, reason);
      if (rejudge) {
        logs.take();
        return undefined;
      }
      this.#calls++;
      return { ok: true, output, guestMicros: micros, logs: logs.take() };
    } catch (error) {
      logs.take();
      const message = error instanceof Error ? error.message : String(error);
      const spent = (guest.fuelLeft() ?? 0n) < 0n && !message.includes('an inline call may take');
      this.#leave(spec.key, spent ? 'it ran out of inline fuel' : `it failed inline: ${message}`);
      return undefined;
    } finally {
      this.#busy = false;
    }
  }

  #leave(key: string, reason: string): void {
    this.#out.set(key, reason);
    this.#drop(key);
  }

  #drop(key: string): void {
    this.#entries.get(key)?.guest.close();
    this.#entries.delete(key);
  }

  /** The policy was unloaded: its instance goes, and a reload with the same key starts afresh. */
  drop(key: string): void {
    this.#drop(key);
    this.#out.delete(key);
    if (this.#preparing.has(key)) this.#gone.add(key);
  }

  close(): void {
    this.#closed = true;
    for (const key of [...this.#entries.keys()]) this.#drop(key);
  }
}
