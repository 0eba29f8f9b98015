// The sandbox pool: a fixed set of worker threads, each holding an instance of every loaded
// policy. Calls are queued and handed to idle workers, so policies of one request run in
// parallel up to the pool size. THE CPU DEADLINE IS ENFORCED HERE, for calls and for loading
// (instantiation and start functions): a guest that outlives its deadline gets its worker
// terminated (the only way to stop a guest in a tight loop) and a new worker takes its place.
// Neighbours are protected three ways: calls are started round-robin between policies, and a
// policy takes its last free worker only when no other policy is waiting (never, while its last
// call was stopped, nor for a probation after: see #suspect, #probation), so one stuck at its
// deadline cannot starve the others; a worker takes calls only once it has loaded every
// policy; and a call that lands on a worker that does not have its policy is queued again,
// never answered wrongly. A queued call whose deadline passed is not started.
//
// Issue 14: the calls of one review (those sharing one SharedInput envelope) go to a worker
// together, in one message, and come back in one: one hop per review per worker. Each call
// keeps its own deadline (the worker publishes which call runs since when, see Progress). When
// a worker is replaced, only the call that was running is answered with the fault; the others
// of its batch go back in line as if never started. A policy that ever got a worker replaced is
// not batched with others again, nor is one before any of its reviews has answered, so a
// hostile policy delays its batch-mates at most once, and one that loops from its first review
// never (see #suspect). Under
// load, calls of other reviews fill the message up to a fair share of the queue; a call still
// waiting in a batch when its deadline passes is not started (the worker checks). With a long
// queue, a worker is given up to MAX_BATCHES batches at once, so it never sits idle while the
// main thread, busy with sockets, has not yet read its answer. Overload: a review whose calls
// would wait longer than QUEUE_SHARE of their deadline (by the queued work, or by how long the
// calls last started had waited, whichever is more) is answered at once, whole, not queued only
// to expire there: waiting reviews stay well within their deadline and what is started is what
// gets answered.
//
// Placement (issue 14): a policy lives in `instances` workers, not necessarily all. By default
// every policy is in every worker while policies × workers stays within INSTANCE_BUDGET; past
// it, each policy gets budget / policies workers (at least one), spread round the pool. Memory
// then grows as policies × min(workers, max(1, budget / policies)) instances instead of
// policies × workers. A policy whose only worker a stopped policy shares gets a second one
// (see #spreadFrom): only a misbehaving neighbour costs that memory. A call goes only to a worker that holds its policy.
// While every worker is held by a long call and others wait, one relief worker is added for
// the waiting policies (see #relief), and goes once it is not needed.
import './interrupts.ts';
import { availableParallelism } from 'node:os';
import { extname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { MessageChannel, receiveMessageOnPort, Worker, type MessagePort } from 'node:worker_threads';
import { PortcullisError } from '../errors.ts';
import type { ContextChange } from '../context/store.ts';
import { InlineLane } from './inline-lane.ts';
import { stopping, unstoppedThreads, UNSTOPPED_MS } from './unstopped.ts';
import { clock, Progress, type CallInput, type CallReply, type FaultKind, type FromWorker, type GuestFunction, type LogEntry, type SandboxSpec, type ToWorker } from './protocol.ts';

export type CallFault = FaultKind | 'deadline' | 'worker';

export type CallResult =
  /** `compact`: the output was read in the worker (sandbox/outcome.ts compactOutput). */
  | { ok: true; output: string; guestMicros: number; totalMicros: number; logs: LogEntry[]; compact?: boolean }
  /** `totalMicros` absent: the call was refused, never started. */
  | { ok: false; fault: CallFault; message: string; totalMicros?: number; logs: LogEntry[] };

interface Job {
  id: number;
  requeued: number;
  key: string;
  fn: GuestFunction;
  input: CallInput;
  timeoutMs: number;
  /** How long it may wait to start (at most timeoutMs): a call that starts later could not answer in time. */
  waitMs: number;
  started: number;
  /** Calls with the same group (a review's shared envelope) may share a message. */
  group: object | undefined;
  /** Its policy's last cost (µs) when queued: its part of #queuedQuick or #queuedCostly. */
  cost: number;
  /** Queued as a call of a costly policy (see #costly): counted in #queuedCostly, not #queuedQuick. */
  costly: boolean;
  /** Queued as a call of an untrusted policy (see #untrusted): counted in #suspectQueued, not in #queuedQuick or #queuedCostly. */
  suspect: boolean;
  resolve: (result: CallResult) => void;
}

/** Calls posted to a worker in one message; `first` numbers its first call in the worker's sequence (see Progress). */
interface Batch {
  id: number;
  first: number;
  jobs: Job[];
}

interface PendingLoad {
  done: (error?: string) => void;
  timer: NodeJS.Timeout | undefined;
  /** A module's first load anywhere (see #loadInto): timed from its turn, allowing `wait` for the calls posted before it. */
  probe?: { spec: SandboxSpec; wait: number };
}

interface Slot {
  worker: Worker;
  /** Where the worker answers (see pump): its own channel, so answers can be read between sockets. */
  replies: MessagePort;
  /** The batches posted to this worker and not yet answered, in order: at most MAX_BATCHES (see #dispatch). */
  batches: Batch[];
  /** The number the next batch's first call gets in the worker's sequence. */
  seq: number;
  timer: NodeJS.Timeout | undefined;
  progress: Progress;
  /** Loads posted and not yet answered, in the order posted, which is the order the worker does them in. */
  loads: Map<string, PendingLoad>;
  /** Its position in the pool: placements name positions, which a replacement worker inherits. */
  index: number;
  /** A relief worker (see #relieve): the policies it was given, which are all it holds. */
  relief?: Set<string>;
  /** A relief worker: the policies whose calls held every worker, which it does not run. */
  holding?: Set<string>;
}

/** How long instantiating a policy (its start function included) may take in one worker. */
export const LOAD_TIMEOUT_MS = 10_000;
/** A call that found no instance of its policy in the worker it reached is retried this often. */
const REQUEUE_LIMIT = 3;
/**
 * Most calls in one message. Under load, calls of several reviews share a message (each message
 * wakes a thread, the largest cost of a call); a bound keeps one worker from taking work that
 * another could start sooner.
 */
const MAX_BATCH = 128;
/**
 * Most batches posted to one worker and not yet answered: the one it runs and those it will run
 * next without waiting for the main thread (see #dispatch).
 */
const MAX_BATCHES = 4;
/**
 * How far into the queue the scheduler looks for its round-robin choice and for companions. The
 * queue is short in normal use; under overload it can hold thousands of calls, and scanning all
 * of them for every call started would make the main thread the bottleneck it is meant to feed.
 */
const WINDOW = 512;
/** A policy whose last call took longer than this in its worker shares messages only with its own review's calls. */
const SHARE_MAX_MICROS = 1000;
/**
 * A policy whose last calls took longer than this is costly (until they take under half of it:
 * a cost near the mark does not flip): its calls go alone, not even with their own review's
 * (see #companions), and are judged for overload by their own backlog (see #queuedAhead,
 * refusals()). Far above what a quick policy takes even on starved workers under overload
 * (0.1-2 ms), so the calls of reviews of quick policies still travel and are judged together.
 */
const COSTLY_MICROS = 10_000;
/**
 * How long a policy stays untrusted after a call of it was stopped (see #probation), doubled at
 * each stop outside it, up to PROBATION_MAX_MS: one that answers once between bursts of loops
 * would otherwise take every worker again at each burst.
 */
const PROBATION_MS = 30_000;
const PROBATION_MAX_MS = 3_600_000;
/**
 * A call that took more than this share of its deadline in its worker makes its policy slow for
 * SLOW_HOLD_MS, which it is treated as untrusted (see #untrusted). Red team: a policy always
 * within its deadline but taking 0.4-1.5 s a call, a few calls at once, held every worker, and
 * its queued calls counted as overload against every other policy: all their calls were refused.
 */
const SLOW_SHARE = 0.1;
const SLOW_HOLD_MS = 60_000;
/**
 * The most queued work (per worker, as a share of its deadline) a call may find ahead of it;
 * past it the call is answered at once, as a deadline. Well under the whole deadline: a caller
 * that keeps sending (the apiserver) has only so many connections, so a queue allowed to
 * approach each call's deadline would make every answer that slow, and, past what those
 * connections carry, push the callers' own waits past the webhook timeout.
 */
export const QUEUE_SHARE = 0.25;
/**
 * The longest the calls last started may have waited (as a share of a call's deadline) for the
 * call to be queued. Looser than QUEUE_SHARE: it is measured, not predicted, and it lags, so at
 * the same bound it refused work that would have fitted (the overload benchmark allowed a
 * sixth fewer reviews); it is there for what the prediction cannot see.
 */
export const WAIT_SHARE = 0.5;
/**
 * How often, while calls wait, the pool looks whether every worker is held (see #relieve), and
 * how long a relief worker stays once nothing holds the workers and it has nothing to run.
 */
const HELD_CHECK_MS = 50;
/**
 * How long a dispatch may wait for the end of the event loop's turn before pump() does it (ms):
 * longer than an ordinary turn under saturating load (a few reviews), far shorter than any
 * deadline, so that idle workers do not wait out a turn of hundreds of requests.
 */
const PUMP_DISPATCH_MS = 1;
const RELIEF_IDLE_MS = 2_000;
const RELIEF_REFUSED_MS = 60_000;
/**
 * A policy whose instantiation (its start function included) took longer than this in a worker
 * is a slow loader: a worker loading it counts as held (see #holdingKeys), and relief workers
 * never load it (see #reliefMayLoad). It loads again in every worker that replaces one, and a
 * worker takes no call while it loads. Red team: a start function of ~5 s beside a looping
 * policy; with one worker reloading it and the other held by the loop, no relief came (a
 * loading worker counted as about to be free), and when one came it loaded the slow policy too
 * and took calls only once that was done: good reviews failed waiting. Real policies load in
 * 5-60 ms here (TypeScript ones the slowest), a first load on a busy machine in a few times that.
 */
export const SLOW_LOAD_MS = 500;
/** Instances (policies × workers holding each) past which policies are no longer in every worker. */
export const INSTANCE_BUDGET = 64;

export interface PoolStats {
  size: number;
  /** Worker threads now: `size`, or one more while a relief worker is there (see #relief). */
  workers: number;
  busy: number;
  queued: number;
  /** Workers loading a sandbox now (a new policy, or a replaced worker loading its policies again). */
  loading: number;
  restarts: number;
  /** Calls answered in the main thread by the inline lane (inline-lane.ts). */
  inlineCalls: number;
  /** Policies the inline lane no longer takes, until their sandbox is replaced (a change to the module, limits or settings) or the host restarts. */
  inlineOut: number;
  /** Policies with an inline instance ready, and those whose instance is being made now. */
  inlineReady: number;
  inlinePreparing: number;
  /** Worker threads of this process terminated UNSTOPPED_MS ago or more that have not ended (see #stop). */
  unstopped: number;
}

/**
 * How the pool treats a policy now (what an operator sees as portcullis_policy_standing):
 * `untried` until one of its review calls answers, `distrusted` for a while after a call of
 * it was stopped or slow (it runs on fewer workers, alone, and is not waited behind),
 * `costly` while its calls take over COSTLY_MICROS (alone, judged by its own backlog), and
 * `normal`.
 */
export type PolicyStanding = 'normal' | 'costly' | 'distrusted' | 'untried';

export class SandboxPool {
  readonly size: number;
  #slots: Slot[] = [];
  #queue: Job[] = [];
  #specs = new Map<string, SandboxSpec>();
  readonly #loading = new Map<string, Promise<void>>();
  #nextId = 1;
  #restarts = 0;
  #closed = false;
  /** Issue 15: the context cache's current state, sent to every worker before anything else. */
  #contextSnapshot: (() => ContextChange[]) | undefined;

  readonly #loadTimeoutMs: number;
  readonly #probationMs: number;
  readonly #reliefIdleMs: number;
  readonly #maxHostCalls: number | undefined;
  /** Round-robin between policies: when each policy last had a call started. */
  #served = new Map<string, number>();
  #turn = 0;
  /** Policies that got a worker replaced (deadline, crash): they always run alone. */
  #solo = new Set<string>();
  /**
   * Policies whose last call ended with its worker replaced, until one of their calls answers,
   * and policies none of whose review calls has answered yet (see #untrusted): they run on at
   * most all workers but one, even when nothing else waits (their calls wait for each other,
   * and past their deadline fail as usual), and their queued calls are not work that other
   * policies' calls wait behind (round-robin starts those first), so they count neither in
   * #queuedQuick / #queuedCostly nor in #waited. Red team: a policy looping to its deadline on three calls at
   * once held both workers, and every other policy's calls waited out their deadlines or were
   * refused as overload.
   */
  #suspect = new Set<string>();
  /** Policies a review call (validate, mutate) of which has answered from its worker. */
  #answered = new Set<string>();
  /**
   * Policies a call of which was stopped: until when they stay untrusted even after answering,
   * and how many stops started a probation. Red team: a policy that answered one review and
   * then looped on three at once took both workers again, every time.
   */
  #probation = new Map<string, { strikes: number; until: number }>();
  /** Policies a call of which was slow (see SLOW_SHARE): until when they count as untrusted. */
  #slow = new Map<string, number>();
  /** How many queued calls are an untrusted policy's (Job.suspect). */
  #suspectQueued = 0;
  /** Each policy's last call, in µs of worker time. */
  #cost = new Map<string, number>();
  /** How long each policy's fastest load took in a worker (µs), its start function included (see SLOW_LOAD_MS). */
  #loadMicros = new Map<string, number>();
  /**
   * The least worker CPU time a load of each policy took (µs): what the inline lane judges a
   * policy by. Its wall time on a busy machine (70 ms for a 2 ms load, beside six busy
   * processes) kept a policy out of the lane for its whole life.
   */
  #loadCpuMicros = new Map<string, number>();
  /**
   * The queued calls counted as work ahead (not an untrusted policy's), and the sum of their #cost
   * as counted when each was queued: quick calls together, costly ones per policy, each by its
   * class when queued (a policy whose class changes does not move its backlog).
   */
  #queuedQuick = { calls: 0, micros: 0 };
  #queuedCostly = new Map<string, { calls: number; micros: number }>();
  /** Policies now costly (see COSTLY_MICROS): in above it, out below half of it, so a cost near the mark does not flip. */
  #costlyKeys = new Set<string>();
  /** How long the calls last sent to a worker had waited in the queue (ms); 0 once it is empty. */
  #waited = 0;
  /** What each review's first call found ahead of it: its other calls are judged the same. */
  #aheadOf = new WeakMap<object, Ahead>();
  /** Which worker positions hold each policy. */
  #placement = new Map<string, Set<number>>();
  /** Workers each policy loaded from now on gets (see plan()). */
  #instances: number;
  #nextHome = 0;
  /** Where #spreadHeld looks first for a worker, in turn. */
  #nextSpread = 0;
  #dispatchQueued = false;
  /** When the pending dispatch was asked for (performance.now()). */
  #dispatchAskedAt = 0;
  /**
   * One worker more than `size`, added while every worker is held by a call that has already
   * run long (a loop to its deadline, a slow policy) and calls of other policies wait: the red
   * team's two looping policies (one already stopped, one trusted until its first loop) held both
   * workers for a deadline, and good reviews failed waiting. It runs only calls of policies not
   * seen to misbehave, and goes once it has been idle for RELIEF_IDLE_MS with the workers free.
   */
  #relief: Slot | undefined;
  #reliefIdleSince = 0;
  /**
   * Since when the relief worker has loads to do and no calls (it reads a load only after the
   * calls before it): one whose loads take longer than a load may is retired, and its policies
   * left out of relief workers for RELIEF_REFUSED_MS, so that no worker is started only to load
   * them again every deadline.
   */
  #reliefLoading = 0;
  #reliefRefused = new Map<string, number>();
  #heldTimer: NodeJS.Timeout | undefined;
  /** Cheap core policies called in this thread while the workers are idle (inline-lane.ts). */
  readonly #inline: InlineLane | undefined;

  constructor(
    size = Math.max(2, availableParallelism()),
    options: {
      loadTimeoutMs?: number; probationMs?: number; reliefIdleMs?: number; inline?: boolean;
      /** Host calls an instance may make in its life (import-wrappers.ts MAX_HOST_CALLS_PER_INSTANCE). */
      maxHostCalls?: number;
      /** Told once per sandbox why the inline lane no longer takes it. */
      onInlineLeave?: (key: string, reason: string) => void;
    } = {},
  ) {
    this.size = size;
    this.#inline = options.inline === false ? undefined : new InlineLane(undefined, options.onInlineLeave, options.maxHostCalls);
    this.#maxHostCalls = options.maxHostCalls;
    this.#loadTimeoutMs = options.loadTimeoutMs ?? LOAD_TIMEOUT_MS;
    this.#probationMs = options.probationMs ?? PROBATION_MS;
    this.#reliefIdleMs = options.reliefIdleMs ?? RELIEF_IDLE_MS;
    this.#instances = size;
    for (let i = 0; i < size; i++) this.#slots.push(this.#spawn(i));
  }

  get stats(): PoolStats {
    const busy = this.#slots.filter((s) => s.batches.length > 0).length;
    return {
      size: this.size, workers: this.#slots.length, busy, queued: this.#queue.length,
      loading: this.#slots.filter((s) => s.loads.size > 0).length, restarts: this.#restarts,
      inlineCalls: this.#inline?.calls ?? 0, inlineOut: this.#inline?.out ?? 0,
      inlineReady: this.#inline?.ready ?? 0, inlinePreparing: this.#inline?.preparing ?? 0, unstopped: unstoppedThreads(),
    };
  }

  /** Why a policy is no longer called inline, if it was refused there (tests, diagnostics). */
  inlineOut(key: string): string | undefined {
    return this.#inline?.outReason(key);
  }

  standing(key: string): PolicyStanding {
    if (this.#distrusted(key)) return 'distrusted';
    if (!this.#answered.has(key)) return 'untried';
    return this.#costly(key) ? 'costly' : 'normal';
  }

  /**
   * Says how many policies are about to be loaded, which sets how many workers each gets (see
   * INSTANCE_BUDGET); `instances` overrides it. Policies already loaded keep their placement.
   */
  plan(policies: number, instances?: number): number {
    const fit = policies * this.size <= INSTANCE_BUDGET ? this.size : Math.max(1, Math.floor(INSTANCE_BUDGET / Math.max(1, policies)));
    this.#instances = Math.min(this.size, Math.max(1, instances ?? fit));
    return this.#instances;
  }

  /** How long the policy's fastest load took in a worker, in ms, its start function included (undefined: none yet). */
  loadTimeOf(key: string): number | undefined {
    return millis(this.#loadMicros.get(key));
  }

  /** How many workers hold the policy (0: not loaded). */
  instancesOf(key: string): number {
    return this.#placement.get(key)?.size ?? 0;
  }

  /**
   * Loads a sandbox in the workers placed to hold it; rejects with the first error. One worker
   * goes first: a module that hangs or crashes while instantiating then costs one worker, not
   * all. A key names everything the sandbox is made from, so a key already loaded (or loading)
   * is not loaded again: the answer is whether this call made it (false: someone else holds it,
   * and only they may unload it).
   */
  async load(spec: SandboxSpec): Promise<boolean> {
    const pending = this.#loading.get(spec.key);
    if (pending) {
      await pending;
      return false;
    }
    if (this.#specs.has(spec.key)) return false;
    const loading = this.#load(spec);
    this.#loading.set(spec.key, loading);
    try {
      await loading;
      return true;
    } finally {
      this.#loading.delete(spec.key);
    }
  }

  async #load(spec: SandboxSpec): Promise<void> {
    this.#specs.set(spec.key, spec);
    const homes = this.#place(spec.key);
    const [first, ...rest] = [...homes].map((i) => this.#slots[i]!);
    let error = await this.#loadInto(first!, spec, true);
    if (error === undefined && this.#specs.get(spec.key) === spec) {
      // Slots replaced meanwhile already received it; load only into those that have not.
      const others = rest.filter((slot) => this.#slots.includes(slot));
      error = (await Promise.all(others.map((slot) => this.#loadInto(slot, spec)))).find((e) => e !== undefined);
    }
    if (error !== undefined) {
      this.unload(spec.key);
      throw new PortcullisError('SANDBOX_LOAD_FAILED', error);
    }
  }

  /** Issue 15: workers keep a replica of the context cache; this sends its state to each, now and on every restart. */
  attachContext(snapshot: () => ContextChange[]): void {
    this.#contextSnapshot = snapshot;
    for (const slot of this.#slots) for (const change of snapshot()) this.#post(slot, change);
  }

  /** Issue 15: one change to the context cache, for every worker's replica. */
  broadcastContext(change: ContextChange): void {
    for (const slot of this.#slots) this.#post(slot, change);
  }

  /** The worker positions for a policy: kept on reload while the planned count is unchanged. */
  #place(key: string): Set<number> {
    const before = this.#placement.get(key);
    if (before && before.size === this.#instances) return before;
    const homes = new Set<number>();
    for (let i = 0; i < this.#instances; i++) homes.add((this.#nextHome + i) % this.size);
    this.#nextHome = (this.#nextHome + this.#instances) % this.size;
    this.#placement.set(key, homes);
    for (const i of before ?? []) if (!homes.has(i)) this.#post(this.#slots[i]!, { type: 'unload', key });
    return homes;
  }

  /**
   * A policy was stopped in worker `index`: every other policy that lives only there gets a
   * second worker, since while the stopped one loops there again (it may, on all workers but
   * one of its own) they would have nowhere else to run. Red team: 36 policies, one worker
   * each; one looping call at a time failed 58% of every other policy's calls.
   */
  #spreadFrom(index: number, culprit: string): void {
    if (this.size < 2) return;
    const other = this.#slots[(index + 1) % this.size]!;
    for (const [key, homes] of this.#placement) {
      if (key === culprit || homes.size !== 1 || !homes.has(index)) continue;
      const spec = this.#specs.get(key);
      if (!spec) continue;
      // Calls go there once it has loaded: a worker takes none while it loads (see #dispatch).
      homes.add(other.index);
      void this.#loadInto(other, spec);
    }
  }

  /** A policy the pool no longer has may go anywhere: the worker answers that it is not loaded. */
  #holds(slot: Slot, key: string): boolean {
    if (slot.relief) return slot.relief.has(key) && this.#reliefRuns(slot, key);
    return this.#placement.get(key)?.has(slot.index) ?? true;
  }

  unload(key: string): void {
    this.#inline?.drop(key);
    this.#served.delete(key);
    this.#costlyKeys.delete(key);
    this.#placement.delete(key);
    this.#solo.delete(key);
    this.#suspect.delete(key);
    this.#answered.delete(key);
    this.#probation.delete(key);
    this.#slow.delete(key);
    this.#cost.delete(key);
    this.#loadMicros.delete(key);
    this.#loadCpuMicros.delete(key);
    if (!this.#specs.delete(key)) return;
    this.#relief?.relief?.delete(key);
    for (const slot of this.#slots) this.#post(slot, { type: 'unload', key });
  }

  /**
   * `waitMs`: how long the call may wait for a worker, by default its deadline. A review's caller
   * gives less when the apiserver would have given up before a later start could finish.
   * `judged`: the caller asked refusals() for this call's review in the same turn, and this call
   * was not refused there; it is not judged again (by then its review's other calls are queued,
   * and a costly call judged behind them could be refused alone while they run: review helper).
   */
  call(key: string, fn: GuestFunction, input: CallInput, timeoutMs: number, waitMs = timeoutMs, judged = false): Promise<CallResult> {
    if (this.#closed) return Promise.reject(new PortcullisError('SANDBOX_CLOSED', 'the sandbox pool is shut down'));
    const group = typeof input === 'string' ? undefined : input.envelope;
    if (!judged) {
      // The calls of one review see the work queued ahead of the review, not of each other: a
      // review is taken whole or refused whole, since running half of it is work thrown away.
      // A costly policy's call is judged alone, by its own backlog (see refusals()).
      const shared = group !== undefined && !this.#costly(key);
      let ahead = shared ? this.#aheadOf.get(group) : undefined;
      if (ahead === undefined) {
        ahead = this.#ahead(key);
        if (shared) this.#aheadOf.set(group, ahead);
      }
      const refused = refusal(ahead, Math.min(waitMs, timeoutMs));
      if (refused) return Promise.resolve(refused);
    }
    const started = performance.now();
    // The inline lane is looked at only while no worker is busy: under load, never.
    const spec = this.#inline && (fn === 'validate' || fn === 'mutate') && this.#workersIdle() ? this.#specs.get(key) : undefined;
    if (spec && this.#inline!.fits(spec, timeoutMs, this.standing(key) === 'normal', millis(this.#loadCpuMicros.get(key)))) {
      if (this.#inline!.claim(key)) {
        // Run after the review's other calls are queued and dispatched (two microtasks on, behind
        // the dispatch those calls scheduled): the workers start on them while this one runs here.
        const dispatched = new Promise<void>((resolve) => queueMicrotask(() => queueMicrotask(resolve)));
        return dispatched.then(() => {
          // The review's other calls went to the workers: this one goes with them. Inline, it
          // would add a metered guest's time to the main thread while they run (10 mixed
          // policies back to back: whole evaluation 0.82 -> 1.28 ms once TypeScript went inline).
          if (group !== undefined && this.#callsOf(group) > 0) {
            this.#inline!.release();
            return undefined;
          }
          return this.#inline!.call(spec, fn, input, timeoutMs);
        }).then((answer) => {
          const totalMicros = Math.round((performance.now() - started) * 1000);
          if (answer) {
            // What a call costs is what predicts the queue under overload: learnt from inline calls
            // too (a little above a worker's: the copy is metered), or a policy answered inline
            // until a burst had no cost known, and the burst queued to expire instead of being refused.
            if (this.#specs.has(key)) this.#cost.set(key, costAfter(this.#cost.get(key), answer.guestMicros));
            return { ...answer, totalMicros };
          }
          // Not answered inline: a worker runs it, in the time left.
          const spent = performance.now() - started;
          return this.#queueCall(key, fn, input, timeoutMs, Math.max(0, Math.min(waitMs, timeoutMs) - spent), group, started);
        });
      }
      this.#wantInline(spec, group);
    }
    return this.#queueCall(key, fn, input, timeoutMs, Math.min(waitMs, timeoutMs), group, started);
  }

  /**
   * Asks the lane to make this policy's instance only where the lane would take its calls: a
   * call that is its review's only one (a review's several calls go to the workers together, see
   * call()), on a quiet main thread (InlineLane.want). Making one costs CPU off the main
   * thread: the metering thread, a niced compile trial in a child process, V8 compiling the copy.
   * Asked on every call, 10 mixed policies made ten copies the lane never used, and a saturating
   * load's first idle moment set it off while the load ran (the benchmark saw other processes
   * take 0.33 core during the 1 TypeScript policy's saturation run).
   */
  #wantInline(spec: SandboxSpec, group: object | undefined): void {
    const inline = this.#inline!;
    if (group === undefined) {
      inline.want(spec);
      return;
    }
    // Once the review's other calls are queued (the same two microtasks as the claim above).
    queueMicrotask(() => queueMicrotask(() => {
      if (this.#callsOf(group) <= 1) inline.want(spec);
    }));
  }

  /** How many calls of this review are queued or in a worker. */
  #callsOf(group: object): number {
    let count = this.#queue.reduce((n, job) => n + (job.group === group ? 1 : 0), 0);
    for (const slot of this.#slots) for (const batch of slot.batches) for (const job of batch.jobs) if (job.group === group) count++;
    return count;
  }

  /** Nothing queued, no worker running or loading anything: a call inline delays nobody's. */
  #workersIdle(): boolean {
    return this.#queue.length === 0 && this.#slots.every((slot) => slot.batches.length === 0 && slot.loads.size === 0);
  }

  #queueCall(
    key: string, fn: GuestFunction, input: CallInput, timeoutMs: number, wait: number, group: object | undefined, started: number,
  ): Promise<CallResult> {
    return new Promise((resolve) => {
      this.#enqueue({
        id: this.#nextId++, requeued: 0, key, fn, input, timeoutMs, waitMs: wait, started, group,
        cost: 0, costly: false, suspect: false, resolve,
      });
      // Dispatch once the event loop has read the sockets that were ready with this one: the
      // reviews they carried then share one message, and the worker is woken once for them. A
      // post to a sleeping worker costs the main thread 13-19 µs here (bench/wake-cost.ts), and
      // the main thread bounds one quick policy's throughput: alternating the two in one process
      // every 3 s (one AS policy, 16 connections), this answered 5% more reviews than a dispatch
      // in a microtask after each review (mean of 10 windows; 10 mixed policies: the same). A
      // lone review waits for nothing: the turn has no other socket to read. A long turn (under
      // overload it runs hundreds of requests) does not hold the calls back: see pump().
      if (!this.#dispatchQueued) {
        this.#dispatchQueued = true;
        this.#dispatchAskedAt = performance.now();
        setImmediate(() => {
          this.#dispatchQueued = false;
          this.#dispatch();
        });
      }
    });
  }

  /**
   * Reads the workers' answers that have arrived, now, and hands them their next calls. The
   * event loop reads them only between its rounds of sockets: under overload a round runs
   * hundreds of requests (each parsed, most refused), and the workers sat idle with their
   * answers unread while the queue their idleness made refused review after review (the overload
   * benchmark: workers busy a third of the time, 15% of the saturation rate allowed). Each
   * review calls this as it starts (server/admission.ts). A read finding nothing costs a few µs per worker (2-3%
   * of the main thread's time per request), so a worker is read only when its progress says it
   * finished its first batch, or while it loads. Calls queued more than PUMP_DISPATCH_MS ago
   * and not yet dispatched (their turn is still running) are handed out too.
   */
  pump(): void {
    const now = performance.now();
    if (this.#dispatchQueued && now - this.#dispatchAskedAt >= PUMP_DISPATCH_MS) {
      this.#dispatchAskedAt = now;
      this.#dispatch();
    }
    for (const slot of this.#slots) {
      const batch = slot.batches[0];
      if (batch ? ((slot.progress.seq() - (batch.first + batch.jobs.length)) | 0) < 0 : slot.loads.size === 0) continue;
      for (const message of unread(slot.replies)) {
        this.#onMessage(slot, message);
        // An answer can replace the worker (a late call): its successor's answers are for later.
        if (!this.#slots.includes(slot)) break;
      }
    }
  }

  /**
   * The answer a call with this deadline would get at once because of overload, or undefined
   * when it would be queued. Lets a review refuse itself before building its input.
   */
  refusal(key: string, timeoutMs: number): CallResult | undefined {
    return refusal(this.#ahead(key), timeoutMs);
  }

  /**
   * refusal() for each call of one review: the calls of quick policies are refused together
   * when any of them is (running half of them is work thrown away); a costly policy's call
   * alone, by its own backlog, so that its overload fails only it, per its own failurePolicy.
   */
  refusals(calls: { key: string; timeoutMs: number }[]): (CallResult | undefined)[] {
    const free = this.#freeSlots();
    const answers = calls.map(({ key, timeoutMs }) => refusal(this.#ahead(key, free), timeoutMs));
    const quickRefusal = answers.find((answer, i) => answer !== undefined && !this.#costly(calls[i]!.key));
    return quickRefusal ? answers.map((answer, i) => (this.#costly(calls[i]!.key) ? answer : answer ?? quickRefusal)) : answers;
  }

  /**
   * What a call queued now would find ahead of it: the queued work, in ms per worker, by each
   * policy's last cost; and how long the calls last started had waited. The first predicts; the
   * second is measured, and catches what the prediction misses: policies whose calls turned
   * slow, workers that get less than a core each.
   */
  #ahead(key: string, free = this.#freeSlots()): Ahead {
    // Nothing is ahead of a call that a loaded, idle worker holding its policy would start now:
    // whatever is queued waits for other workers (its own policy's cap, placement). Red team:
    // while one worker was held by a looping policy, calls of policies the other, idle, worker
    // holds were refused as overload, by the waits of calls only the held worker could run.
    if (free.some((slot) => this.#holds(slot, key))) return { queuedMs: 0, waitedMs: 0 };
    // The measured wait is that of quick calls (see #start): a costly policy's calls wait for its
    // own backlog, which the prediction counts against it alone.
    return { queuedMs: this.#queuedAhead(key) / this.size / 1000, waitedMs: this.#queue.length === this.#suspectQueued ? 0 : this.#waited };
  }

  /**
   * The queued work (µs) that would start before a call of `key` queued now. Quick calls go in
   * batches of whole reviews, in order, so all of theirs is ahead of a quick call; costly ones
   * (see #companions) go alone, taking turns with those batches round-robin, so a quick call
   * finds about one of each costly policy's per batch it waits for, and a costly call all of
   * its own policy's backlog and as many turns of the others'. Red team: a policy taking ~0.1 s a
   * call (under the slow mark), 50 reviews at once: its backlog was counted against every
   * policy, and reviews it did not even match were refused. With quick policies alone (the
   * overload benchmark) this is the whole queue, as before.
   */
  #queuedAhead(key: string): number {
    const quick = this.#queuedQuick;
    const turns = this.#costly(key) ? (this.#queuedCostly.get(key)?.calls ?? 0) + 1 : 1 + Math.floor(quick.calls / MAX_BATCH);
    let micros = quick.micros;
    for (const [other, { calls, micros: queued }] of this.#queuedCostly) {
      micros += other === key || calls <= turns ? queued : queued * (turns / calls);
    }
    return micros;
  }

  #costly(key: string): boolean {
    return this.#costlyKeys.has(key);
  }

  /** Loaded, idle workers that nothing queued (not yet dispatched, or a burst in one turn) could take first. */
  #freeSlots(): Slot[] {
    return this.#slots.filter((slot) => slot.batches.length === 0 && slot.loads.size === 0 && !this.#queuedFor(slot));
  }

  /** Whether a trusted call in the scheduler's window could go to this worker. */
  #queuedFor(slot: Slot): boolean {
    for (let i = 0; i < Math.min(this.#queue.length, WINDOW); i++) {
      const job = this.#queue[i]!;
      if (!job.suspect && this.#holds(slot, job.key)) return true;
    }
    return false;
  }

  async close(): Promise<void> {
    this.#closed = true;
    this.#inline?.close();
    clearTimeout(this.#heldTimer);
    for (const job of this.#queue.splice(0)) job.resolve(fault(job, 'worker', 'the sandbox pool shut down'));
    this.#queuedQuick = { calls: 0, micros: 0 };
    this.#queuedCostly.clear();
    this.#suspectQueued = 0;
    await Promise.all(this.#slots.map((slot) => {
      const jobs = inflight(slot);
      this.#idle(slot);
      for (const job of jobs) job.resolve(fault(job, 'worker', 'the sandbox pool shut down'));
      slot.replies.close();
      return this.#stop(slot);
    }));
  }

  /**
   * Terminates a worker's thread; resolves once it has ended, or after UNSTOPPED_MS if it has
   * not. V8 stops a guest only where its code looks for interrupts, and a guest that never
   * looks outlives terminate(): its thread spins on at 100% of a core, for good (red team: a
   * loop of large memory.fill calls, before interrupts.ts). Such a thread is counted in
   * stats.unstopped, which /healthz reports, so that the kubelet restarts the pod; and the CLI
   * waits for the threads being stopped at exit (cli/main.ts): Node waits for every thread.
   */
  #stop(slot: Slot): Promise<void> {
    const ended = slot.worker.terminate().then(() => undefined, () => undefined);
    stopping(ended);
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<void>((resolve) => { timer = setTimeout(resolve, UNSTOPPED_MS).unref(); });
    return Promise.race([ended, late]).finally(() => clearTimeout(timer));
  }

  #spawn(index: number): Slot {
    // Linear memories are capped per module; this caps the worker's own JS heap (jco glue,
    // strings lifted out of guests) so a runaway there kills this worker, not the host.
    const progress = new Progress();
    const { port1: replies, port2: replyPort } = new MessageChannel();
    // worker.ts in the checkout, worker.js in the installed package: the same folder as this file.
    const worker = new Worker(new URL(`./worker${extname(fileURLToPath(import.meta.url))}`, import.meta.url), {
      stdout: false, stderr: false, resourceLimits: { maxOldGenerationSizeMb: 512 },
      workerData: { progress: progress.buffer, replies: replyPort, maxHostCalls: this.#maxHostCalls }, transferList: [replyPort],
    });
    const slot: Slot = { worker, replies, batches: [], seq: 0, timer: undefined, progress, loads: new Map(), index };
    for (const change of this.#contextSnapshot?.() ?? []) worker.postMessage(change); // issue 15: before any call
    replies.on('message', (message: FromWorker) => this.#onMessage(slot, message));
    worker.on('error', (error: Error) => this.#replace(slot, `its sandbox worker failed: ${error.message}`));
    worker.on('exit', () => {
      if (!this.#closed && this.#slots.includes(slot)) this.#replace(slot, 'its sandbox worker exited unexpectedly');
    });
    return slot;
  }

  /**
   * `probe`: the module's first load anywhere, under the load deadline. Once it has loaded in
   * one worker it is known to finish, so loading it into others (and into replacement workers,
   * which may be slow while the machine is overloaded) is not timed: dropping a policy that is
   * merely slow to load would turn its calls into failures.
   */
  #loadInto(slot: Slot, spec: SandboxSpec, probe = false): Promise<string | undefined> {
    return new Promise((resolve) => {
      // A start function that never returns holds the worker's only thread: only terminating it stops it.
      // The worker reads the load message only once the batches it has end (each call of them
      // within its deadline, so by two of the longest each at worst): that wait is not the module's fault.
      const jobs = inflight(slot);
      const wait = jobs.length === 0 ? 0 : 2 * slot.batches.length * Math.max(...jobs.map((job) => job.timeoutMs));
      slot.loads.set(spec.key, { done: resolve, timer: undefined, probe: probe ? { spec, wait } : undefined });
      this.#post(slot, { type: 'load', spec });
      this.#armLoad(slot);
    });
  }

  /**
   * Starts the deadline of the load the worker does now, when it is a first load. A worker loads
   * one policy at a time, in the order posted (worker.ts): timed from the post, a first load
   * queued behind another policy's slow start function would be blamed for its wait.
   */
  #armLoad(slot: Slot): void {
    const head: PendingLoad | undefined = slot.loads.values().next().value;
    if (!head?.probe || head.timer !== undefined) return;
    const { spec, wait } = head.probe;
    head.timer = setTimeout(() => this.#loadExpired(slot, spec), this.#loadTimeoutMs + wait);
  }

  #loadExpired(slot: Slot, spec: SandboxSpec): void {
    if (!slot.loads.has(spec.key)) return;
    // Forget the policy first, so the replacement worker does not run the same start function.
    this.#specs.delete(spec.key);
    this.#replace(slot, `did not finish instantiating (its start function included) within ${seconds(this.#loadTimeoutMs)}`);
  }

  #post(slot: Slot, message: ToWorker): void {
    slot.worker.postMessage(message);
  }

  #dispatch(): void {
    this.#handOut();
    this.#watchHeld();
  }

  #handOut(): void {
    // A worker still loading policies would make a call wait behind instantiation, on its clock.
    const idle = this.#slots.filter((slot) => slot.batches.length === 0 && slot.loads.size === 0);
    for (const [i, slot] of idle.entries()) {
      const job = this.#next(slot);
      if (!job) continue;
      this.#start(slot, [job, ...this.#companions(slot, job, idle.length - i)]);
    }
    // Every worker busy and calls still waiting: workers get their next batches now, behind the
    // ones they run, so each goes on as soon as one ends instead of waiting for the main thread
    // to read its answer and send more. Under overload the main thread's turns (reading and
    // answering hundreds of requests) grew to 60 ms, and the workers waited idle for half the
    // time. Only while the queue holds more than full batches for every worker: with less, the
    // calls arriving meanwhile would join a later, larger batch (a message per review cost 16%
    // of the throughput at saturation). And only behind quick batches: a slow or suspect policy
    // holds up its own calls, not batches that another worker could start sooner.
    for (let taken = true; taken;) {
      taken = false;
      for (const slot of this.#slots) {
        if (this.#queue.length < MAX_BATCH * this.size) return;
        if (slot.batches.length === 0 || slot.batches.length >= MAX_BATCHES || slot.loads.size > 0) continue;
        if (!slot.batches.every((batch) => batch.jobs.every((job) => this.#quick(job)))) continue;
        const job = this.#next(slot);
        if (!job) continue;
        this.#start(slot, [job, ...this.#companions(slot, job, 1)]);
        taken = true;
      }
    }
  }

  /** While calls wait or a relief worker is there, look again in HELD_CHECK_MS. */
  #watchHeld(): void {
    if (this.#heldTimer !== undefined || this.#closed || (this.#queue.length === 0 && !this.#relief)) return;
    this.#heldTimer = setTimeout(() => {
      this.#heldTimer = undefined;
      this.#answerAllLate();
      this.#spreadHeld();
      this.#relieve();
      this.#watchHeld();
    }, HELD_CHECK_MS);
    this.#heldTimer.unref();
  }

  /** Adds a relief worker when every worker is held and other calls wait; retires it once it is not needed. */
  #relieve(): void {
    if (this.#closed) return;
    const holding = this.#holdingKeys();
    const held = holding !== undefined;
    const relief = this.#relief;
    if (relief) {
      const now = performance.now();
      if (relief.batches.length > 0 || relief.loads.size === 0) this.#reliefLoading = now;
      // Its policies loaded elsewhere, so are known to finish loading, but need not do so twice.
      else if (now - this.#reliefLoading > this.#loadTimeoutMs) {
        for (const key of relief.loads.keys()) this.#reliefRefused.set(key, now + RELIEF_REFUSED_MS);
        return this.#retireRelief();
      }
      if (held) {
        for (const key of holding) relief.holding!.add(key);
        // New policies waiting while still held: it gets them too (it takes calls once loaded).
        this.#giveRelief(relief);
        this.#reliefIdleSince = 0;
      } else if (relief.batches.length > 0 || relief.loads.size > 0) {
        this.#reliefIdleSince = 0;
      } else if (this.#reliefIdleSince === 0) {
        this.#reliefIdleSince = now;
      } else if (now - this.#reliefIdleSince >= this.#reliefIdleMs) {
        this.#retireRelief();
      }
      return;
    }
    if (!held || ![...this.#waitingKeys()].some((key) => this.#reliefMayLoad(key, holding))) return;
    const slot = this.#spawn(this.size);
    slot.relief = new Set();
    slot.holding = holding;
    this.#relief = slot;
    this.#reliefIdleSince = 0;
    this.#reliefLoading = performance.now();
    this.#slots.push(slot);
    this.#giveRelief(slot);
  }

  /** Loads into the relief worker the policies of waiting calls it does not have yet. */
  #giveRelief(slot: Slot): void {
    const keys = slot.relief!;
    for (const key of this.#waitingKeys()) {
      const spec = this.#specs.get(key);
      if (!spec || keys.has(key) || !this.#reliefMayLoad(key, slot.holding!)) continue;
      keys.add(key);
      void this.#loadInto(slot, spec).then((error) => {
        if (error !== undefined) keys.delete(key);
        this.#dispatch();
      });
    }
  }

  /** Policies with calls in the scheduler's window that a relief worker may run (not seen to misbehave). */
  #waitingKeys(): Set<string> {
    const keys = new Set<string>();
    for (let i = 0; i < Math.min(this.#queue.length, WINDOW); i++) {
      const { key } = this.#queue[i]!;
      if (!this.#distrusted(key)) keys.add(key);
    }
    return keys;
  }

  /**
   * When every worker (the relief aside) is running a call that has run past SLOW_SHARE of its
   * deadline (what would make its policy slow had it answered), or is loading a slow loader
   * (see SLOW_LOAD_MS), those calls' and loads' policies; else undefined. Quick calls never hold
   * a worker that long, so a pool merely overloaded gets no relief worker (it would only add
   * threads to the same cores); a worker loading only quick loaders is not held (it will be
   * free soon).
   */
  #holdingKeys(): Set<string> | undefined {
    const now = clock();
    const keys = new Set<string>();
    for (const slot of this.#slots) {
      if (slot.relief) continue;
      const holding = this.#heldBy(slot, now);
      if (!holding) return undefined;
      for (const key of holding) keys.add(key);
    }
    return keys;
  }

  /** The policies holding this worker (see #holdingKeys), or undefined when it is not held. */
  #heldBy(slot: Slot, now: number): string[] | undefined {
    if (slot.batches.length === 0) {
      const slow = [...slot.loads.keys()].filter((key) => this.#slowLoad(key));
      return slow.length > 0 ? slow : undefined;
    }
    const { seq, since } = slot.progress.read();
    const running = runningCall(slot, seq);
    if (!running || now - since < running.job.timeoutMs * SLOW_SHARE) return undefined;
    return [running.job.key];
  }

  /**
   * A trusted policy in fewer workers than the pool, with calls waiting while every worker
   * holding it is held, gets a worker that is not (a permanent home, like #spreadFrom's), so
   * its calls do not wait out another policy's long call while a worker sits idle. Red team:
   * with instancesPerPolicy 1, a new policy looping on its first call held its only worker for
   * its deadline, and the good policies placed there failed waiting beside an idle worker.
   * At most one such load per worker per check, round the workers: a worker takes no call while
   * it loads (review helper: 30 policies moved into one worker at once stalled its own calls).
   */
  #spreadHeld(): void {
    if (this.#queue.length === 0) return;
    const now = clock();
    const held = new Map<Slot, string[] | undefined>();
    const heldBy = (slot: Slot) => {
      if (!held.has(slot)) held.set(slot, this.#heldBy(slot, now));
      return held.get(slot);
    };
    const given = new Set<Slot>();
    for (const key of this.#waitingKeys()) {
      const homes = this.#placement.get(key);
      const spec = this.#specs.get(key);
      if (!homes || !spec || homes.size >= this.size || this.#untrusted(key) || this.#slowLoad(key)) continue;
      const slots = [...homes].map((i) => this.#slots[i]!);
      // Not a policy holding its own workers: another worker would only be held by it too.
      if (!slots.every((slot) => heldBy(slot)?.includes(key) === false)) continue;
      const free = (slot: Slot) => !slot.relief && !given.has(slot) && !homes.has(slot.index) && heldBy(slot) === undefined;
      const start = this.#nextSpread++ % this.size;
      const target = [...this.#slots.slice(start), ...this.#slots.slice(0, start)].find(free);
      if (!target) continue;
      given.add(target);
      homes.add(target.index);
      void this.#loadInto(target, spec).then((error) => {
        if (error !== undefined && this.#specs.get(key) === spec) this.#placement.get(key)?.delete(target.index);
        this.#dispatch();
      });
    }
  }

  /** Not holding the workers, not being loaded by the pool, not a slow loader, not left out after a relief's slow load. */
  #reliefMayLoad(key: string, holding: Set<string>): boolean {
    return !holding.has(key) && !this.#loading.has(key) && !this.#slowLoad(key) && (this.#reliefRefused.get(key) ?? 0) <= performance.now();
  }

  #slowLoad(key: string): boolean {
    return (this.#loadMicros.get(key) ?? 0) >= SLOW_LOAD_MS * 1000;
  }

  /** A relief worker runs no call of a policy seen to misbehave, nor of one whose calls held the workers. */
  #reliefRuns(slot: Slot, key: string): boolean {
    return !slot.holding!.has(key) && !this.#distrusted(key);
  }

  #retireRelief(): void {
    const slot = this.#relief;
    if (!slot) return;
    this.#relief = undefined;
    this.#slots.splice(this.#slots.indexOf(slot), 1);
    // Not retired while it runs calls (see #relieve); should it be, they go back in line.
    const jobs = inflight(slot);
    this.#idle(slot);
    for (const job of jobs.reverse()) this.#enqueue(job, true);
    for (const { done, timer } of slot.loads.values()) {
      clearTimeout(timer);
      done();
    }
    slot.loads.clear();
    slot.replies.close();
    void this.#stop(slot);
  }

  /** A call that may share a message with other reviews' and have a batch wait behind it: not solo, and its policy's last call was quick. */
  #quick(job: Job): boolean {
    return !this.#solo.has(job.key) && !this.#untrusted(job.key) && (this.#cost.get(job.key) ?? 0) <= SHARE_MAX_MICROS;
  }

  #start(slot: Slot, jobs: Job[]): void {
    const now = performance.now();
    let waited = 0;
    for (const job of jobs) waited = Math.max(waited, now - job.started);
    // A suspect's call waited for its own calls (its cap), not for the pool, and a costly one for
    // its own backlog (see #queuedAhead): others are not judged by them. Review helper: a quick
    // policy with nothing recent of its own was refused by a costly one's waits.
    if (!jobs[0]!.suspect && !jobs[0]!.costly) this.#waited = this.#queue.length === this.#suspectQueued ? 0 : waited;
    const batch: Batch = { id: jobs[0]!.id, first: slot.seq, jobs };
    slot.seq = (slot.seq + jobs.length) | 0;
    slot.batches.push(batch);
    if (slot.batches.length === 1) {
      // Its first call's deadline runs from now, should the worker be slow to start it.
      slot.progress.mark(batch.first);
      this.#arm(slot, shortest(jobs, 0));
    }
    const origin = clock() - performance.now();
    this.#post(slot, {
      type: 'call', batch: batch.id, first: batch.first,
      calls: jobs.map(({ id, key, fn, input, started, waitMs }) => ({ id, key, fn, input, notAfter: origin + started + waitMs })),
    });
  }

  /**
   * The queued calls that go with `leader` to one worker. Its review's calls first: when `free`
   * workers are idle they are shared out between them (latency); when only one is, they all go
   * together. Then, while the message holds less than this worker's share of the queue, whole
   * reviews from the queue in order (throughput under load: fewer messages, fewer wake-ups).
   * The per-policy worker cap of #next does not apply: companions ride on the worker the leader
   * took, and applying it would split reviews into single calls while another batch (which
   * holds every policy of its review) runs. Solo policies never share a message.
   */
  #companions(slot: Slot, leader: Job, free: number): Job[] {
    // Nor, until one of its reviews has answered, does a policy share: it might loop (red team).
    if (this.#solo.has(leader.key) || this.#untrusted(leader.key)) return [];
    const now = performance.now();
    // (Late ones are #next's to answer.)
    const eligible = (job: Job) => !this.#solo.has(job.key) && !this.#untrusted(job.key) && now - job.started < job.waitMs && this.#holds(slot, job.key);
    // A costly policy (see COSTLY_MICROS) shares no message, not even with its own review's
    // calls: they would wait for it, and be as late as its queue. Red team: a policy taking
    // ~0.1 s a call carried its reviews' good calls in its batches, so a review only good
    // policies matched waited as long as its backlog, and was refused as overload.
    if (this.#costly(leader.key)) return [];
    // A slow policy would hold up other reviews' calls: it shares a message with its own review only.
    const quick = (job: Job) => (this.#cost.get(job.key) ?? 0) <= SHARE_MAX_MICROS;
    const own: number[] = [];
    const window = Math.min(this.#queue.length, WINDOW);
    if (leader.group !== undefined) {
      for (let i = 0; i < window; i++) {
        const job = this.#queue[i]!;
        if (job.group === leader.group && eligible(job) && !this.#costly(job.key)) own.push(i);
      }
    }
    // Split a review between idle workers only when nothing else waits: with other reviews
    // queued, every worker has whole reviews to run, and halves only mean more round trips.
    const split = own.length === this.#queue.length ? Math.max(1, free) : 1;
    const taken = own.slice(0, Math.min(MAX_BATCH - 1, Math.ceil((own.length + 1) / split) - 1));
    const share = Math.min(MAX_BATCH, Math.ceil((this.#queue.length + 1) / this.size));
    if (taken.length === own.length && taken.length + 1 < share && quick(leader) && own.every((i) => quick(this.#queue[i]!))) {
      const chosen = new Set(taken);
      const groups = new Map<object | number, number[]>();
      for (let i = 0; i < window; i++) {
        const job = this.#queue[i]!;
        if (chosen.has(i) || (leader.group !== undefined && job.group === leader.group) || !eligible(job)) continue;
        const key = job.group ?? -i - 1; // a call with no review is a group of its own
        const members = groups.get(key);
        if (members) members.push(i);
        else groups.set(key, [i]);
      }
      for (const members of groups.values()) {
        if (taken.length + 1 + members.length > share) break;
        if (!members.every((i) => quick(this.#queue[i]!))) continue;
        taken.push(...members);
      }
      taken.sort((a, b) => a - b);
    }
    const jobs = this.#takeAll(taken);
    for (const job of jobs) this.#served.set(job.key, ++this.#turn);
    return jobs;
  }

  /**
   * Whether a worker other than `slot` has loaded its policies and runs no distrusted call: the
   * caps are per policy, so without this two looping (or slow) policies held both workers. Not
   * for policies merely new: a new benign policy's first call would wait for a new looping one.
   */
  #spareBesides(slot: Slot): boolean {
    return this.#slots.some((other) => other !== slot && !other.relief && other.loads.size === 0 && inflight(other).every((job) => !this.#distrusted(job.key)));
  }

  /**
   * Suspect, on probation, slow, or not yet seen to answer a review (a policy that loops on every
   * review loads and answers `metadata` like any other, so its first burst of reviews could hold
   * every worker).
   */
  #untrusted(key: string): boolean {
    return !this.#answered.has(key) || this.#distrusted(key);
  }

  /** Seen to loop, crash or be slow: suspect, on probation, or slow. */
  #distrusted(key: string): boolean {
    if (this.#suspect.has(key)) return true;
    const until = Math.max(this.#probation.get(key)?.until ?? 0, this.#slow.get(key) ?? 0);
    return until > 0 && until > performance.now();
  }

  /** A call of this policy was stopped: a stop outside probation starts a longer one, within it extends it. */
  #strike(key: string): void {
    const now = performance.now();
    const last = this.#probation.get(key);
    const strikes = last === undefined ? 1 : last.until > now ? last.strikes : last.strikes + 1;
    const until = now + Math.min(PROBATION_MAX_MS, this.#probationMs * 2 ** (strikes - 1));
    this.#probation.set(key, { strikes, until: Math.max(until, last?.until ?? 0) });
  }

  #enqueue(job: Job, front = false): void {
    job.suspect = this.#untrusted(job.key);
    job.cost = job.suspect ? 0 : this.#cost.get(job.key) ?? 0;
    job.costly = !job.suspect && this.#costly(job.key);
    if (job.suspect) {
      this.#suspectQueued++;
    } else if (!job.costly) {
      this.#queuedQuick.calls++;
      this.#queuedQuick.micros += job.cost;
    } else {
      const queued = this.#queuedCostly.get(job.key);
      if (queued) {
        queued.calls++;
        queued.micros += job.cost;
      } else {
        this.#queuedCostly.set(job.key, { calls: 1, micros: job.cost });
      }
    }
    if (front) this.#queue.unshift(job);
    else this.#queue.push(job);
  }

  #take(index: number): Job {
    const [job] = this.#queue.splice(index, 1);
    this.#dequeued(job!);
    return job!;
  }

  /** Removes the calls at these (ascending) indices in one pass over the queue. */
  #takeAll(indices: number[]): Job[] {
    if (indices.length === 0) return [];
    const jobs = indices.map((i) => this.#queue[i]!);
    const taken = new Set(jobs);
    let kept = indices[0]!;
    for (let i = kept; i < this.#queue.length; i++) {
      const job = this.#queue[i]!;
      if (!taken.has(job)) this.#queue[kept++] = job;
    }
    this.#queue.length = kept;
    for (const job of jobs) this.#dequeued(job);
    // Emptied without a call started (its late calls answered): what the last calls started had
    // waited says nothing about the next ones. Left, it refused the first calls of the next burst.
    if (this.#queue.length === this.#suspectQueued) this.#waited = 0;
    return jobs;
  }

  #dequeued(job: Job): void {
    if (job.suspect) {
      this.#suspectQueued--;
      return;
    }
    const queued = job.costly ? this.#queuedCostly.get(job.key) : this.#queuedQuick;
    if (!queued) return;
    queued.calls--;
    queued.micros = queued.calls <= 0 ? 0 : Math.max(0, queued.micros - job.cost);
    if (job.costly && queued.calls <= 0) this.#queuedCostly.delete(job.key);
  }

  /** How many workers other than `except` are running (or have in their batches) a call of each policy. */
  #busy(except: Slot): Map<string, number> {
    const busy = new Map<string, number>();
    for (const slot of this.#slots) {
      if (slot === except) continue;
      // Workers, not calls: a batch holding a policy ten times occupies one worker.
      for (const key of new Set(inflight(slot).map((job) => job.key))) busy.set(key, (busy.get(key) ?? 0) + 1);
    }
    return busy;
  }

  /**
   * The next call to start: round-robin between policies (the queued call of the policy served
   * longest ago), preferring policies that occupy fewer than all workers but one, so a second
   * policy's call is never stuck behind one policy's flood. Calls that waited past their
   * deadline are answered, not started.
   */
  #next(slot: Slot, capped = true): Job | undefined {
    // The worker the call would go to is not counted: a call queued behind its running batch
    // occupies no other worker.
    const busy = this.#busy(slot);
    let best = -1;
    const now = performance.now();
    // Late calls are taken out in one pass afterwards: one splice each made overload quadratic
    // in the queue's length on the main thread (4.5% of it in the overload profile).
    const late: number[] = [];
    // Asked only when a distrusted call is in line (rare): is another worker left for the others?
    let spare: boolean | undefined;
    // With policies in fewer than every worker, a worker that finds nothing of its own in the
    // window looks on: the calls of the policies only it holds may all be behind it (a burst
    // for another worker filled the window, and this one sat idle while its calls expired).
    const end = this.#instances < this.size ? this.#queue.length : Math.min(this.#queue.length, WINDOW);
    for (let i = 0; i < end && (i < WINDOW || best < 0); i++) {
      const job = this.#queue[i]!;
      if (now - job.started >= job.waitMs) {
        late.push(i);
        continue;
      }
      if (!this.#holds(slot, job.key)) continue;
      const instances = this.instancesOf(job.key) || this.size;
      // A suspect policy never takes every worker, even when nothing else waits: what arrives
      // while it runs to its deadline again must find a worker free; and not the last one that
      // can run anything now (one being replaced is reloading its policies, red team).
      const untrusted = this.#untrusted(job.key);
      if (this.size > 1 && this.#distrusted(job.key) && !(spare ??= this.#spareBesides(slot))) continue;
      const cap = untrusted ? suspectWorkers(instances) : capped && instances > 1 ? instances - 1 : instances;
      // Not on the relief worker: it is there for calls the held workers hold up, and their
      // batch-mates stuck behind the held call counted as those policies' busy instances. Red
      // team: a trusted policy looping in batches with good calls got a relief worker that ran
      // nothing, and the good calls waited out the deadline.
      if (!slot.relief && (busy.get(job.key) ?? 0) >= cap) continue;
      if (best < 0 || (this.#served.get(job.key) ?? 0) < (this.#served.get(this.#queue[best]!.key) ?? 0)) best = i;
    }
    if (late.length > 0) {
      if (best >= 0) best -= late.filter((i) => i < best).length;
      this.#answerLate(late, now);
      // A window of late calls only: look again behind them. Giving up here would leave the rest
      // of the queue with idle workers and nothing left to wake the scheduler (found at 4x load).
      if (best < 0) return this.#next(slot, capped);
    }
    // Work-conserving: when only policies at their share are waiting, one of them may take the last worker.
    if (best < 0) return capped && this.#queue.length > 0 ? this.#next(slot, false) : undefined;
    const job = this.#take(best);
    this.#served.set(job.key, ++this.#turn);
    return job;
  }

  /** Answers the queued calls at `indices`, whose wait has run out, as not started. */
  #answerLate(indices: number[], now: number): void {
    for (const job of this.#takeAll(indices)) {
      job.resolve(fault(job, 'deadline', job.waitMs < job.timeoutMs
        ? `waited ${Math.round(now - job.started)} ms for a sandbox; started now, it could not finish before the apiserver's timeout; not started`
        : `waited ${Math.round(now - job.started)} ms for a sandbox, past its ${seconds(job.timeoutMs)} deadline; not started`));
    }
  }

  /**
   * Answers every queued call whose wait has run out. #next does so only when a worker asks for
   * work: with every worker held or reloading (red team: a policy whose start function spins 5 s,
   * reloaded into each replaced worker), calls waited 6-9 s past their 2 s deadline, and the
   * answers came after the apiserver's own timeout.
   */
  #answerAllLate(): void {
    const now = performance.now();
    const late: number[] = [];
    for (const [i, job] of this.#queue.entries()) if (now - job.started >= job.waitMs) late.push(i);
    if (late.length > 0) this.#answerLate(late, now);
  }

  #onMessage(slot: Slot, message: FromWorker): void {
    if (this.#settle(slot, message, true)) this.#dispatch();
  }

  /**
   * Applies one message of `slot`'s worker; true when it freed a worker or a policy. `check`:
   * look at the next batch's deadline now (not while the worker is being replaced).
   */
  #settle(slot: Slot, message: FromWorker, check: boolean): boolean {
    if (message.type === 'loaded') {
      const pending = slot.loads.get(message.key);
      slot.loads.delete(message.key);
      // The fastest load seen: a start function runs the same each time (no clock, no settings),
      // so a slower one was the machine's doing (workers run at a lower priority; review helper:
      // one busy process made loads 10-14 times slower), and must not make a policy a slow loader.
      if (this.#specs.has(message.key)) {
        keepLeast(this.#loadMicros, message.key, message.micros);
        keepLeast(this.#loadCpuMicros, message.key, message.cpuMicros);
      }
      clearTimeout(pending?.timer);
      this.#armLoad(slot);
      pending?.done(message.error);
      return true;
    }
    // Answers come in the order the batches were posted; one for a batch no longer here (its
    // worker was replaced meanwhile) is dropped.
    if (slot.batches[0]?.id !== message.batch) return false;
    const { jobs } = slot.batches.shift()!;
    clearTimeout(slot.timer);
    slot.timer = undefined;
    // The next batch may have been running for a while: check it now.
    if (check && slot.batches.length > 0) this.#expire(slot);
    const now = performance.now();
    for (const [i, job] of jobs.entries()) {
      const reply: CallReply = message.replies[i] ?? { ok: false, fault: 'trap', message: 'the sandbox worker gave no answer', logs: [], spentMicros: 0 };
      if (this.#specs.has(job.key)) {
        const cost = costAfter(this.#cost.get(job.key), reply.spentMicros);
        this.#cost.set(job.key, cost);
        if (cost > COSTLY_MICROS) this.#costlyKeys.add(job.key);
        else if (cost < COSTLY_MICROS / 2) this.#costlyKeys.delete(job.key);
        if (reply.spentMicros > job.timeoutMs * 1000 * SLOW_SHARE) this.#slow.set(job.key, now + SLOW_HOLD_MS);
      }
      // The worker has no instance of this policy (it was replaced or reloaded meanwhile): while the
      // pool still has the policy, this is no answer about the request, so the call goes back in line.
      if (!reply.ok && reply.fault === 'unloaded' && this.#specs.has(job.key) && job.requeued < REQUEUE_LIMIT) {
        job.requeued++;
        this.#enqueue(job, true);
        continue;
      }
      // Answered from inside its worker (a trap or a cap included): it no longer holds workers to its deadline.
      if (reply.ok || reply.fault !== 'late') {
        this.#suspect.delete(job.key);
        if (job.fn === 'validate' || job.fn === 'mutate') this.#answered.add(job.key);
      }
      const totalMicros = Math.round((now - job.started) * 1000);
      job.resolve(reply.ok
        ? { ok: true, output: reply.output, guestMicros: reply.guestMicros, totalMicros, logs: reply.logs, ...(reply.compact ? { compact: true } : {}) }
        : { ok: false, fault: reply.fault === 'late' ? 'deadline' : reply.fault, message: reply.message, totalMicros, logs: reply.logs });
    }
    return true;
  }

  #idle(slot: Slot): void {
    clearTimeout(slot.timer);
    slot.batches = [];
    slot.timer = undefined;
  }

  #arm(slot: Slot, ms: number): void {
    clearTimeout(slot.timer);
    slot.timer = setTimeout(() => this.#expire(slot), Math.max(1, ms));
  }

  /** The deadline check: the running call outlived its own deadline, or wait until it would. */
  #expire(slot: Slot): void {
    if (slot.batches.length === 0 || !this.#slots.includes(slot)) return;
    const { seq, since } = slot.progress.read();
    const running = runningCall(slot, seq);
    if (!running) {
      // All done: the answers are on their way; should they never come, the last call's deadline ends the wait.
      return this.#arm(slot, inflight(slot).at(-1).timeoutMs);
    }
    const { job, later } = running;
    const elapsed = clock() - since;
    // A later call may have a shorter deadline than what is left of this one: look again by then,
    // or a quick call with a long deadline would let a spinning batch-mate run on past its own.
    if (elapsed < job.timeoutMs) return this.#arm(slot, Math.min(job.timeoutMs - elapsed, later));
    this.#replace(slot, `exceeded its ${seconds(job.timeoutMs)} CPU deadline`, 'deadline');
  }

  /** Terminates a worker (stuck or dead), fails the call it was running, and puts a fresh worker in its place. */
  #replace(slot: Slot, reason: string, kind: CallFault = 'worker'): void {
    const index = this.#slots.indexOf(slot);
    if (index < 0 || this.#closed) return;
    // What the worker answered before it was stopped or died is answered: its answers can still be
    // unread on its channel (a timer fires before the loop reads messages; Node drains a worker's
    // parentPort at exit, not this channel). Unread, the calls were run again, and with no call
    // running, the last one answered was blamed for the worker (review of the pump change).
    for (const message of unread(slot.replies)) this.#settle(slot, message, false);
    this.#restarts++;
    // A relief worker is not replaced: the pool adds another if every worker is still held.
    const fresh = slot.relief ? undefined : this.#spawn(index);
    if (fresh) this.#slots[index] = fresh;
    else {
      this.#slots.splice(index, 1);
      this.#relief = undefined;
    }
    // Loads that were under way in the old worker carry on in the new one; only a policy the pool
    // has dropped (the one whose load expired) is told the reason.
    const pending = new Map(slot.loads);
    for (const { timer } of pending.values()) clearTimeout(timer);
    slot.loads.clear();
    void this.#stop(slot);
    slot.replies.close();
    const jobs = inflight(slot);
    // The call that was running is the one at fault (the last one, when all had ended); the
    // others of its worker's batches are put back in line with a fresh wait, since nothing they
    // did is kept.
    const culprit = runningCall(slot, slot.progress.read().seq)?.job ?? jobs.at(-1);
    this.#idle(slot);
    if (culprit) {
      if (this.#specs.has(culprit.key)) {
        this.#solo.add(culprit.key);
        this.#suspect.add(culprit.key);
        this.#strike(culprit.key);
        if (fresh) this.#spreadFrom(index, culprit.key);
      }
      culprit.resolve(fault(culprit, kind, reason));
      for (const job of jobs.filter((j) => j !== culprit).reverse()) {
        if (job.requeued >= REQUEUE_LIMIT) {
          job.resolve(fault(job, 'worker', `its sandbox worker was replaced while it waited (another policy ${reason})`));
          continue;
        }
        job.requeued++;
        job.started = performance.now();
        this.#enqueue(job, true);
      }
    }
    for (const spec of fresh ? this.#specs.values() : []) {
      if (!this.#holds(fresh!, spec.key)) continue;
      const waiting = pending.get(spec.key);
      // A first load that was still under way keeps its deadline in the new worker.
      void this.#loadInto(fresh!, spec, waiting?.probe !== undefined).then((error) => waiting?.done(error));
    }
    for (const [key, { done }] of pending) if (!fresh || !this.#specs.has(key)) done(reason);
    this.#dispatch();
  }
}

interface Ahead {
  queuedMs: number;
  waitedMs: number;
}

function refusal({ queuedMs, waitedMs }: Ahead, timeoutMs: number): CallResult | undefined {
  if (queuedMs < timeoutMs * QUEUE_SHARE && waitedMs < timeoutMs * WAIT_SHARE) return undefined;
  const why = queuedMs >= timeoutMs * QUEUE_SHARE
    ? `about ${Math.round(queuedMs)} ms of work queued ahead; a call finds at most ${QUEUE_SHARE * 100}%`
    : `the calls ahead waited ${Math.round(waitedMs)} ms for a sandbox; a call waits at most ${WAIT_SHARE * 100}%`;
  return { ok: false, fault: 'deadline', logs: [], message: `not started: the sandboxes are overloaded (${why} of its ${seconds(timeoutMs)} deadline)` };
}

/**
 * A policy's cost after one more call: smoothed, since a call's wall time also counts the time its
 * worker was descheduled (per-thread CPU time has the kernel tick's resolution on some hosts), and
 * one unlucky call made a quick policy look slow, unfit to share a message or have work queued behind it.
 */
/** µs as ms, if any. */
function millis(micros: number | undefined): number | undefined {
  return micros === undefined ? undefined : micros / 1000;
}

/** Keeps the least value seen for `key`. */
function keepLeast(map: Map<string, number>, key: string, value: number | undefined): void {
  if (value !== undefined) map.set(key, Math.min(value, map.get(key) ?? Infinity));
}

function costAfter(before: number | undefined, micros: number): number {
  return before === undefined ? micros : Math.round(before * 0.75 + micros * 0.25);
}

/** The messages already on `port`, read now rather than when the event loop gets to them. */
function* unread(port: MessagePort): Generator<FromWorker> {
  for (let read = receiveMessageOnPort(port); read !== undefined; read = receiveMessageOnPort(port)) yield read.message as FromWorker;
}

function inflight(slot: Slot): Job[] {
  return slot.batches.length === 1 ? slot.batches[0]!.jobs : slot.batches.flatMap((batch) => batch.jobs);
}

/**
 * The call that number `seq` of the worker's sequence names, and the shortest deadline among the
 * calls after it; undefined when the worker ran them all.
 */
function runningCall(slot: Slot, seq: number): { job: Job; later: number } | undefined {
  for (const [b, batch] of slot.batches.entries()) {
    const offset = (seq - batch.first) | 0;
    if (offset < 0 || offset >= batch.jobs.length) continue;
    let later = shortest(batch.jobs, offset + 1);
    for (const next of slot.batches.slice(b + 1)) later = Math.min(later, shortest(next.jobs, 0));
    return { job: batch.jobs[offset]!, later };
  }
  return undefined;
}

/** The shortest deadline among a batch's calls from `from` on (Infinity when none). */
function shortest(jobs: Job[], from: number): number {
  let ms = Infinity;
  for (let i = from; i < jobs.length; i++) ms = Math.min(ms, jobs[i]!.timeoutMs);
  return ms;
}

/** The most workers a suspect policy's calls may occupy at once: all but one, when there are two. */
function suspectWorkers(instances: number): number {
  return instances > 1 ? instances - 1 : 1;
}

function seconds(ms: number): string {
  return ms >= 1000 ? `${ms / 1000}s` : `${ms}ms`;
}

function fault(job: Job, kind: CallFault, message: string): CallResult {
  return { ok: false, fault: kind, message, totalMicros: Math.round((performance.now() - job.started) * 1000), logs: [] };
}
