// Entry point of one sandbox worker thread. It holds an instance of every policy it was given
// and runs one call at a time; the pool enforces the CPU deadline from outside by terminating
// this thread, because a guest stuck in a loop never yields back to JavaScript.
import './quiet-wasi-warning.ts';
import module from 'node:module';
import { parentPort, workerData, type MessagePort } from 'node:worker_threads';
import { compactOutput } from './outcome.ts';
import type { Guest } from './guest.ts';
import { guestMessage, mib } from '../util/text.ts';
import { threadCpuMicros } from '../util/thread-cpu.ts';
import { lowerThisThread } from '../util/thread-priority.ts';
import { MAX_HOST_CALLS_PER_INSTANCE } from './import-wrappers.ts';
import { clock, Progress, type CallAnswer, type CallReply, type CallRequest, type FromWorker, type SandboxSpec, type ToWorker } from './protocol.ts';

// Imported only now: node:wasi (pulled in by Extism) is linked before any module body runs,
// so a static import would warn before the filter above is installed.
const { GuestFault, instantiateGuest, LogBuffer, outputTooLarge } = await import('./guest.ts');
const { Garbage } = await import('./garbage.ts');
// Issue 15: context reads are answered from this worker's replica.
const { applyContextChange } = await import('../context/replica.ts');

if (!parentPort) throw new Error('sandbox worker started outside a worker thread');

// Guests running to their deadlines, a load spike or a hostile policy yield to the main thread.
lowerThisThread();
const port = parentPort;
// Answers go back on their own channel, which the pool can read between sockets (SandboxPool.pump).
const replies = (workerData as { replies: MessagePort }).replies;
const specs = new Map<string, SandboxSpec>();
const guests = new Map<string, Guest>();
const starting = new Map<string, Promise<Guest>>();
const logs = new LogBuffer();
const garbage = new Garbage();
const maxHostCalls = (workerData as { maxHostCalls?: number }).maxHostCalls ?? MAX_HOST_CALLS_PER_INSTANCE;
const progress = new Progress((workerData as { progress: SharedArrayBuffer }).progress);

function send(message: FromWorker): void {
  replies.postMessage(message);
}

async function guestFor(spec: SandboxSpec): Promise<Guest> {
  const existing = guests.get(spec.key);
  if (existing) return existing;
  if (spec.fresh) return instantiateGuest(spec, logs, undefined, maxHostCalls);
  // A call can arrive while the eager instantiation from `load` is still under way.
  let pending = starting.get(spec.key);
  if (!pending) {
    pending = instantiateGuest(spec, logs, undefined, maxHostCalls).finally(() => starting.delete(spec.key));
    starting.set(spec.key, pending);
  }
  const guest = await pending;
  if (specs.get(spec.key) === spec) guests.set(spec.key, guest);
  return guest;
}

function discard(key: string): void {
  const guest = guests.get(key);
  if (guest) drop(guest);
  guests.delete(key);
}

/** Drops `guest` (a fresh one, or the one held for its policy), counting what it leaves behind. */
function drop(guest: Guest): void {
  garbage.discarded(guest.footprintBytes());
  guest.close();
}

async function call(spec: SandboxSpec, fn: CallRequest['fn'], input: CallRequest['input']): Promise<CallAnswer> {
  let guest: Guest;
  try {
    guest = await guestFor(spec);
  } catch (error) {
    // Whatever memories it made before failing (a data segment, a trapping start function) are
    // garbage now, of a size nothing tells: count the most its memory cap allows.
    garbage.discarded(spec.memoryCapBytes);
    return { ok: false, fault: 'instantiate', message: `could not be instantiated: ${describe(error)}`, logs: logs.take() };
  }
  const started = performance.now();
  try {
    const output = await guest.call(fn, input);
    const guestMicros = Math.round((performance.now() - started) * 1000);
    // Components return a JS string; measure UTF-8 size only when it could matter.
    if (output.length * 3 > spec.maxOutputBytes && Buffer.byteLength(output) > spec.maxOutputBytes) {
      throw outputTooLarge(spec, Buffer.byteLength(output));
    }
    const used = guest.memoryBytes();
    // A guest that answered but sits near its memory cap would fail the next call; rebuild it now.
    if (spec.fresh) drop(guest);
    // Past half its host calls, made again before a call of it could reach V8's budget (import-wrappers.ts).
    else if (used >= spec.memoryCapBytes * NEAR_CAP || guest.worn()) discard(spec.key);
    // QuickJS turns a failed memory.grow into an "out of memory" exception, which the SDK
    // reports as an error outcome: that is the cap's doing, not the policy's.
    const error = errorOutcome(output);
    if (error && (quickJsOutOfMemory(error) || hitCap(spec, used, error.message))) {
      return { ok: false, fault: 'memory', message: outOfMemoryMessage(spec, used), logs: logs.take() };
    }
    // A review's answer is read here, on this thread's time and the policy's: the main thread
    // gets the answer's contract members only (sandbox/outcome.ts compactOutput).
    if (fn === 'validate' || fn === 'mutate') return { ok: true, ...compactOutput(output, fn), guestMicros, logs: logs.take() };
    return { ok: true, output, guestMicros, logs: logs.take() };
  } catch (error) {
    const used = guest.memoryBytes();
    // After a trap the instance's state is unknown: never reuse it.
    if (spec.fresh) drop(guest);
    else discard(spec.key);
    if (error instanceof GuestFault && error.fault !== 'trap') {
      return { ok: false, fault: error.fault, message: error.message, logs: logs.take() };
    } else if (hitCap(spec, used, String(error))) {
      // A failed memory.grow is often a bare trap, and so is any other trap of a guest whose
      // memory is nearly full: the cap is the likely cause, said with what the trap was (red team:
      // a module that trapped on every call with 60 of its 64 MiB in use read as the cap alone).
      const detail = `most likely: it failed with ${mib(used)} of its ${mib(spec.memoryCapBytes)} MiB in use (${describe(error)})`;
      const message = OUT_OF_MEMORY.test(String(error)) ? memoryCapMessage(spec) : `${memoryCapMessage(spec)}, ${detail}`;
      return { ok: false, fault: 'memory', message, logs: logs.take() };
    } else {
      const entries = logs.take();
      // An AssemblyScript abort logs its message and location just before it traps.
      const abort = entries.findLast(([, text]) => text.startsWith('abort: '));
      const message = `crashed: ${describe(error)}${abort ? ` (${abort[1]})` : ''}`;
      // The abort is said in the message: not a second time as a log line.
      return { ok: false, fault: 'trap', message, logs: abort ? entries.filter((entry) => entry !== abort) : entries };
    }
  }
}

/** Runs a batch's calls in order, saying in `progress` which one runs since when, and answers once. */
async function run(batch: number, first: number, calls: CallRequest[]): Promise<void> {
  const replies: CallReply[] = [];
  for (const [i, { key, fn, input, notAfter }] of calls.entries()) {
    progress.mark(first + i);
    const started = performance.now();
    const spec = specs.get(key);
    let answer: CallAnswer;
    if (!spec) answer = { ok: false, fault: 'unloaded', message: 'is not loaded in this sandbox', logs: [] };
    else if (clock() >= notAfter) answer = { ok: false, fault: 'late', message: 'waited past its deadline behind other calls; not started', logs: [] };
    else answer = await call(spec, fn, input);
    // A guest chooses what its error says (Extism's error_set, a thrown message): tens of
    // megabytes of it went into the response and every log line (red team). Cut, as a copy,
    // and its controls shown (util/text.ts guestMessage).
    if (!answer.ok) answer = { ...answer, message: guestMessage(answer.message) };
    replies.push({ ...answer, spentMicros: Math.round((performance.now() - started) * 1000) });
  }
  progress.mark(first + calls.length);
  send({ type: 'results', batch, replies });
}

// Batches posted while one runs wait here, in order: a call that awaits (a guest still being
// instantiated) lets the next message in, and two batches must never interleave their calls.
const batches: Extract<ToWorker, { type: 'call' }>[] = [];
let running = false;
/** The loads posted so far, in turn (see the 'load' message). */
let loads: Promise<void> = Promise.resolve();

async function drain(): Promise<void> {
  running = true;
  try {
    for (let next = batches.shift(); next; next = batches.shift()) {
      await run(next.batch, next.first, next.calls);
      garbage.settle();
    }
  } finally {
    running = false;
  }
}

// A failed memory.grow leaves memory *below* the cap (the request was larger than the room
// left), and guests report it differently: QuickJS says "out of memory", AssemblyScript's
// allocator traps with a bare `unreachable`. So: an out-of-memory message with at least half
// the cap in use, or any failure with nearly all of it in use, is the cap at work.
const NEAR_CAP = 0.9;
const OUT_OF_MEMORY = /out of memory/i;

function hitCap(spec: SandboxSpec, used: number, text: string): boolean {
  if (OUT_OF_MEMORY.test(text) && used >= spec.memoryCapBytes / 2) return true;
  return used >= spec.memoryCapBytes * NEAR_CAP;
}

/** An answer that is an error outcome (the SDKs write `outcome` first): its kind and message. */
function errorOutcome(output: string): { kind: unknown; message: string } | undefined {
  if (!output.startsWith('{"outcome":"error"')) return undefined;
  try {
    const value = JSON.parse(output) as { kind?: unknown; message?: unknown };
    return typeof value.message === 'string' ? { kind: value.kind, message: value.message } : undefined;
  } catch {
    return undefined; // garbage: decodeOutput says so
  }
}

/**
 * QuickJS's own exception for a failed allocation, however little was in use: one allocation
 * larger than the room left fails with the memory almost empty (a 32 MiB string under a 24 MiB
 * cap read as "crashed: InternalError: out of memory", and its operator would have looked for a
 * bug in the policy, not at limits.memoryMiB). Only the exception the SDK reports: a patch or
 * a message that quotes the words (from the reviewed object, say) is not it (review helper).
 */
function quickJsOutOfMemory(error: { kind: unknown; message: string }): boolean {
  return error.kind === 'exception' && /^InternalError: out of memory( \(at [^)]*\))?$/.test(error.message);
}

function memoryCapMessage(spec: SandboxSpec): string {
  return `exceeded its ${Math.round(spec.memoryCapBytes / 2 ** 20)} MiB memory cap`;
}

/** An out-of-memory failure: with the memory far from full, one allocation asked for more than was left. */
function outOfMemoryMessage(spec: SandboxSpec, used: number): string {
  if (used >= spec.memoryCapBytes / 2) return memoryCapMessage(spec);
  return `${memoryCapMessage(spec)}: an allocation asked for more than the ${mib(spec.memoryCapBytes - used)} MiB left (${mib(used)} MiB in use)`;
}

// Not in TypeScript's lib yet (exception handling shipped in V8 9.5).
const WasmException = (WebAssembly as unknown as { Exception?: abstract new (...args: never[]) => object }).Exception;

function describe(error: unknown): string {
  if (error instanceof WebAssembly.RuntimeError) {
    const text = error.message.startsWith('wasm trap') ? error.message : `wasm trap: ${error.message}`;
    // QuickJS keeps its C stack in linear memory: running off it is an out-of-bounds access.
    if (/out of bounds memory access/.test(text)) return `${text} (in a TypeScript policy, usually a stack overflow: unbounded recursion?)`;
    return text;
  }
  if (error instanceof RangeError && /call stack size/i.test(error.message)) return `stack overflow (unbounded recursion?): ${error.message}`;
  // A wasm `throw` nothing caught: its payload is the guest's own values, which say nothing here.
  if (WasmException && error instanceof WasmException) return 'threw a WebAssembly exception that it did not catch';
  return error instanceof Error ? error.message : String(error);
}

port.on('message', (message: ToWorker) => {
  switch (message.type) {
    case 'load': {
      const { spec } = message;
      specs.set(spec.key, spec);
      discard(spec.key);
      // One load at a time, each timed alone: the pool keeps a policy whose instantiation (its
      // start function included) is slow out of relief workers, and counts a worker loading it
      // as held (see SandboxPool's SLOW_LOAD_MS). Interleaved, a 5 s start function would make
      // every load behind it look as slow.
      const turn = loads.then(async () => {
        // Unloaded or loaded again while it waited its turn: no start function is run for nothing.
        // The newer load answers for the key; an unloaded one is answered now.
        if (specs.get(spec.key) !== spec) {
          if (!specs.has(spec.key)) send({ type: 'loaded', key: spec.key });
          return;
        }
        // jco's glue is the host's code, not the policy's: loaded (parsed, compiled) before the
        // load is timed, as the inline lane times its own instance. A first import, with Node's
        // compile cache empty, took a TypeScript policy's load past the lane's INLINE_MAX_LOAD_MS
        // on a busy machine, and the lane never took it.
        if (spec.glue) await import(spec.glue);
        const started = performance.now();
        const cpuStarted = threadCpuMicros();
        const guest = await guestFor(spec);
        // A fresh policy's instance was made only to prove it instantiates.
        if (spec.fresh) drop(guest);
        send({ type: 'loaded', key: spec.key, micros: Math.round((performance.now() - started) * 1000), cpuMicros: Math.round(threadCpuMicros() - cpuStarted) });
        // A thread that is terminated never writes Node's compile cache (bin/portcullis.js):
        // now, with this policy's glue in it. Writes only what is new.
        module.flushCompileCache?.(); // Node 22.10+
      });
      loads = turn.catch((error: unknown) => send({ type: 'loaded', key: spec.key, error: describe(error) }));
      break;
    }
    case 'unload':
      specs.delete(message.key);
      discard(message.key);
      break;
    case 'call':
      batches.push(message);
      if (!running) void drain();
      break;
    case 'context': // Issue 15
      applyContextChange(message);
      break;
  }
});
