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
import type { Guest, LogBuffer as LogBufferType } from './guest.ts';
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
/** An inline instance whose memories grow past this ends its inline life: the main thread keeps little. */
export const INLINE_MAX_MEMORY_BYTES = 8 * 2 ** 20;
/** Inline instances the main thread holds at most. */
export const INLINE_MAX_POLICIES = 16;

export type InlineAnswer = { ok: true; output: string; guestMicros: number; logs: LogEntry[] };

export class InlineLane {
  readonly #guests = new Map<string, Guest>();
  /** Instances that have answered a call (their first call compiled what it ran), with their slow calls so far. */
  readonly #warm = new Map<Guest, number>();
  readonly #preparing = new Set<string>();
  /** Policies out of the lane, and why (for tests and logs). */
  readonly #out = new Map<string, string>();
  #logs: LogBufferType | undefined;
  #busy = false;
  #calls = 0;
  #closed = false;

  /** Inline calls answered so far. */
  get calls(): number {
    return this.#calls;
  }

  /** Whether `key` can be called inline now (its instance is ready and no inline call runs). */
  ready(key: string): boolean {
    return !this.#busy && this.#guests.has(key);
  }

  /** Why the policy left the lane, if it did. */
  outReason(key: string): string | undefined {
    return this.#out.get(key);
  }

  /** Makes the policy's inline instance in the background, once; it is used when ready. */
  want(spec: SandboxSpec): void {
    const { key } = spec;
    if (this.#closed || this.#guests.has(key) || this.#preparing.has(key) || this.#out.has(key)) return;
    if (this.#guests.size + this.#preparing.size >= INLINE_MAX_POLICIES) return;
    this.#preparing.add(key);
    void this.#prepare(spec).finally(() => this.#preparing.delete(key));
  }

  async #prepare(spec: SandboxSpec): Promise<void> {
    const module = await meteredCopy(spec, INLINE_MAX_MODULE_BYTES);
    if (!(module instanceof WebAssembly.Module)) {
      this.#out.set(spec.key, module.unmetered);
      return;
    }
    // Imported only now: Extism pulls in node:wasi, and a host with no core policy never needs it.
    await import('./quiet-wasi-warning.ts');
    const { instantiateGuest, LogBuffer } = await import('./guest.ts');
    this.#logs ??= new LogBuffer();
    try {
      const guest = await instantiateGuest({ ...spec, modules: { 'policy.wasm': module } }, this.#logs, { start: START_FUEL, call: INLINE_FUEL });
      this.#logs.take();
      // Unloaded or closed meanwhile: nobody will call it.
      if (this.#closed || this.#out.has(spec.key) || this.#gone.has(spec.key)) guest.close();
      else this.#guests.set(spec.key, guest);
    } catch (error) {
      this.#out.set(spec.key, `its inline instance failed: ${error instanceof Error ? error.message : String(error)}`);
    } finally {
      this.#gone.delete(spec.key);
    }
  }

  /** Keys unloaded while their instance was being made. */
  readonly #gone = new Set<string>();

  /**
   * Calls the policy inline. undefined: not answered here (out of fuel, a trap, a fault, an
   * error answer, too slow, too large): the caller runs the call in a worker, and the policy
   * leaves the lane.
   */
  async call(spec: SandboxSpec, fn: GuestFunction, input: CallInput): Promise<InlineAnswer | undefined> {
    const guest = this.#guests.get(spec.key);
    if (!guest || this.#busy) return undefined;
    this.#busy = true;
    const started = performance.now();
    try {
      const output = await guest.call(fn, input);
      const micros = Math.round((performance.now() - started) * 1000);
      const logs = this.#logs!.take();
      // What a worker judges (output over its limit, an error answer that may be the memory cap)
      // it judges again.
      const tooLarge = output.length * 3 > spec.maxOutputBytes && Buffer.byteLength(output) > spec.maxOutputBytes;
      const rejudge = tooLarge ? 'its answer is over its output limit' : output.includes('"outcome":"error"') ? 'it answered an error' : undefined;
      // A slow or growing policy answered, but has no place in the main thread.
      const slow = this.#warm.get(guest);
      const firstCall = slow === undefined;
      const slowCalls = (slow ?? 0) + (micros > (firstCall ? INLINE_FIRST_CALL_MS : INLINE_SLOW_MS) * 1000 ? 1 : 0);
      this.#warm.set(guest, slowCalls);
      const unfit = slowCalls >= INLINE_SLOW_CALLS || (firstCall && slowCalls > 0) ? `a call took ${micros} µs`
        : guest.memoryBytes() > INLINE_MAX_MEMORY_BYTES ? 'its memory grew' : undefined;
      const reason = rejudge ?? unfit;
      if (reason) this.#leave(spec.key, reason);
      if (rejudge) return undefined;
      this.#calls++;
      return { ok: true, output, guestMicros: micros, logs };
    } catch (error) {
      this.#logs!.take();
      const spent = (guest.fuelLeft() ?? 0n) < 0n;
      this.#leave(spec.key, spent ? 'it ran out of inline fuel' : `it failed inline: ${error instanceof Error ? error.message : String(error)}`);
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
    const guest = this.#guests.get(key);
    if (!guest) return;
    guest.close();
    this.#warm.delete(guest);
    this.#guests.delete(key);
  }

  /** The policy was unloaded: its instance goes, and a reload with the same key starts afresh. */
  drop(key: string): void {
    this.#drop(key);
    this.#out.delete(key);
    if (this.#preparing.has(key)) this.#gone.add(key);
  }

  close(): void {
    this.#closed = true;
    for (const key of [...this.#guests.keys()]) this.#drop(key);
  }
}
