// Leader election on a coordination.k8s.io/v1 Lease, as client-go does it: the holder renews
// every leaseDuration/3; a candidate takes over once it has seen the same record unchanged for
// a whole leaseDuration (measured on its own clock, so clock skew between replicas does not
// matter); every write carries the resourceVersion it read, so two candidates can never both
// think they won. A holder that cannot renew for 2/3 of the duration stops leading before
// anyone else may take over. Every write to the cluster goes through fence(), which checks,
// immediately before the write, that the last successful renewal is younger than the renew
// deadline on this process's monotonic clock: a replica that was paused (SIGSTOP, a long GC, a
// frozen VM) resumes past its deadline and writes nothing until it has renewed again.
import { hostname } from 'node:os';
import { randomBytes } from 'node:crypto';
import { V1MicroTime, type CoordinationV1Api, type V1Lease } from '@kubernetes/client-node';
import { errorMessage, PortcullisError } from '../errors.ts';
import type { Logger } from '../util/log.ts';
import { MANAGED_BY_LABEL, MANAGED_BY_VALUE } from './build.ts';
import { callOptions, kubeCall, statusOf, type Operation } from './kube.ts';
import { retry } from './retry.ts';

export interface LeaderElectorOptions {
  api: CoordinationV1Api;
  /** The apiserver URL, for messages. */
  server: string;
  name: string;
  namespace: string;
  identity?: string;
  leaseDurationSeconds: number;
  log: Logger;
  onStartedLeading: () => void;
  /** Called when leadership is lost (not on a voluntary release). */
  onStoppedLeading: () => void;
  /**
   * Whether this replica may take the lease now (default: always). A replica that is not fit to
   * register webhooks must not take it: it would hold it, register nothing, and keep a ready
   * replica from leading (red team: one broken policy in a rollout left no policy enforced).
   * A leader that stops being fit keeps renewing: handing the lease back and forth would flap.
   */
  eligible?: () => boolean;
  /** Wall clock, for the times written into the Lease. */
  now?: () => number;
  /** Monotonic clock (ms), for every local deadline: it keeps counting while the process is stopped. */
  monotonic?: () => number;
}

/** A write refused because this replica is not (or no longer surely) the leader. */
export class NotLeaderError extends PortcullisError {
  constructor(what: string) {
    super('NOT_LEADER', `not writing ${what}: this replica is not the leader, or has not renewed its lease within the renew deadline; ` +
      'the current leader manages the configurations');
  }
}

/** Unique per process: two replicas on one node (or two tests on one machine) must differ. */
export function defaultIdentity(env: NodeJS.ProcessEnv = process.env): string {
  return `${env.POD_NAME || hostname()}_${randomBytes(4).toString('hex')}`;
}

export class LeaderElector {
  readonly identity: string;
  readonly #o: LeaderElectorOptions;
  readonly #now: () => number;
  readonly #mono: () => number;
  #leader = false;
  #timer: NodeJS.Timeout | undefined;
  #halted = false;
  #tick: Promise<void> | undefined;
  /** The last record seen and when it was first seen with that resourceVersion. */
  #observed: { resourceVersion: string; at: number } | undefined;
  #lastRenew = 0;
  #lastError: string | undefined;
  /** Set by a round that saw another holder with a live lease. */
  #lostTo: string | undefined;
  /** The holder a follower last said it waits for (said once per holder). */
  #toldHolder: string | undefined;
  #toldIneligible = false;

  constructor(options: LeaderElectorOptions) {
    this.#o = options;
    this.identity = options.identity ?? defaultIdentity();
    this.#now = options.now ?? Date.now;
    this.#mono = options.monotonic ?? (() => performance.now());
  }

  /** Leading, and the last renewal is younger than the renew deadline right now (not as of the last round). */
  get isLeader(): boolean {
    return this.#leader && this.#mono() - this.#lastRenew < this.renewDeadlineMs;
  }

  /**
   * The one way to write to the cluster as the leader: runs `write` only if this replica is the
   * leader at this instant, else throws NotLeaderError. A write already sent cannot be called
   * back; every later one is checked again.
   */
  async fence<T>(what: string, write: () => Promise<T>): Promise<T> {
    if (!this.isLeader) throw new NotLeaderError(what);
    return write();
  }

  get retryMs(): number {
    return Math.max(200, Math.floor((this.#o.leaseDurationSeconds * 1000) / 3));
  }

  /** Holding longer than this without a successful renewal means someone else may take over soon. */
  get renewDeadlineMs(): number {
    return Math.floor((this.#o.leaseDurationSeconds * 2000) / 3);
  }

  #eligible(): boolean {
    const eligible = this.#o.eligible?.() ?? true;
    if (!eligible && !this.#toldIneligible) this.#o.log.info('leader election: not taking the lease until this host is ready', { lease: `${this.#o.namespace}/${this.#o.name}` });
    this.#toldIneligible = !eligible;
    return eligible;
  }

  start(): void {
    this.#halted = false;
    this.#schedule(0);
  }

  /** One round of acquire-or-renew (exposed for tests; the timer calls it too). */
  async round(): Promise<void> {
    let won = false;
    // A renewal counts from before its request was sent: the lease may have been read at any
    // moment since, so this is the conservative end.
    const sent = this.#mono();
    try {
      won = await this.#tryAcquireOrRenew();
      this.#lastError = undefined;
    } catch (error) {
      // Log each distinct failure once per streak: a down apiserver would otherwise log every
      // few seconds for as long as it is down.
      const message = errorMessage(error);
      if (message !== this.#lastError) this.#o.log.error('leader election: lease request failed', { lease: `${this.#o.namespace}/${this.#o.name}`, message });
      this.#lastError = message;
    }
    // Even while halting, record what the round did: a lease won in the last round must still
    // be released, or the other replica waits it out.
    const quiet = this.#halted;
    // A follower said nothing while it waited (red team: a host restarted after SIGKILL waited
    // ~20 s for its own dead predecessor's lease, its webhooks failing, with no line saying so).
    if (!won && !this.#leader && this.#lostTo !== undefined && this.#lostTo !== this.#toldHolder) {
      this.#o.log.info('leader election: another holder has the lease; waiting until it is released or not renewed for its duration before managing webhook configurations', {
        lease: `${this.#o.namespace}/${this.#o.name}`, holder: this.#lostTo, identity: this.identity, leaseDurationSeconds: this.#o.leaseDurationSeconds,
      });
      this.#toldHolder = this.#lostTo;
    }
    if (won) {
      this.#toldHolder = undefined;
      this.#lastRenew = sent;
      if (!this.#leader) {
        this.#leader = true;
        this.#o.log.info('leader election: became the leader; managing webhook configurations', { lease: `${this.#o.namespace}/${this.#o.name}`, identity: this.identity });
        if (!quiet) this.#o.onStartedLeading();
      }
    } else if (this.#leader && (this.#lostTo !== undefined || this.#mono() - this.#lastRenew >= this.renewDeadlineMs)) {
      this.#leader = false;
      this.#o.log.error('leader election: lost the lease; no longer writing webhook configurations', {
        lease: `${this.#o.namespace}/${this.#o.name}`, identity: this.identity, holder: this.#lostTo ?? null,
      });
      if (!quiet) this.#o.onStoppedLeading();
    }
  }

  async #tryAcquireOrRenew(): Promise<boolean> {
    this.#lostTo = undefined;
    const { api, name, namespace, server } = this.#o;
    const options = callOptions(this.retryMs);
    const op = (verb: Operation['verb']): Operation => ({ verb, resource: 'leases', name, namespace });
    let lease: V1Lease | undefined;
    try {
      lease = await kubeCall(op('get'), server, () => api.readNamespacedLease({ name, namespace }, options));
    } catch (error) {
      if (statusOf(error) !== 404) throw error;
    }
    const now = this.#now();
    const seen = this.#mono();
    if (!lease) {
      if (!this.#eligible()) return false;
      try {
        await kubeCall(op('create'), server, () => api.createNamespacedLease({ namespace, body: this.#record(undefined, now) }, options));
        return true;
      } catch (error) {
        if (statusOf(error) === 409) return false; // another candidate created it first
        throw error;
      }
    }
    const spec = lease.spec ?? {};
    const resourceVersion = lease.metadata?.resourceVersion ?? '';
    if (this.#observed?.resourceVersion !== resourceVersion) this.#observed = { resourceVersion, at: seen };
    const holder = spec.holderIdentity ?? '';
    const duration = (spec.leaseDurationSeconds ?? this.#o.leaseDurationSeconds) * 1000;
    if (holder !== '' && holder !== this.identity && this.#observed.at + duration > seen) {
      this.#lostTo = holder;
      return false;
    }
    if (holder !== this.identity && !this.#eligible()) return false;
    try {
      await kubeCall(op('update'), server, () => api.replaceNamespacedLease({ name, namespace, body: this.#record(lease, now) }, options));
      return true;
    } catch (error) {
      if (statusOf(error) === 409) return false; // someone wrote since we read: not ours this round
      throw error;
    }
  }

  #record(current: V1Lease | undefined, now: number): V1Lease {
    const spec = current?.spec ?? {};
    const ours = spec.holderIdentity === this.identity;
    const time = new V1MicroTime(now);
    return {
      apiVersion: 'coordination.k8s.io/v1',
      kind: 'Lease',
      metadata: {
        name: this.#o.name,
        namespace: this.#o.namespace,
        ...(current?.metadata?.resourceVersion ? { resourceVersion: current.metadata.resourceVersion } : {}),
        labels: { [MANAGED_BY_LABEL]: MANAGED_BY_VALUE },
      },
      spec: {
        holderIdentity: this.identity,
        leaseDurationSeconds: this.#o.leaseDurationSeconds,
        acquireTime: ours && spec.acquireTime ? spec.acquireTime : time,
        renewTime: time,
        leaseTransitions: current ? (spec.leaseTransitions ?? 0) + (ours ? 0 : 1) : 0,
      },
    };
  }

  #schedule(delay: number): void {
    if (this.#halted) return;
    this.#timer = setTimeout(() => {
      this.#tick = this.round().finally(() => {
        this.#tick = undefined;
        this.#schedule(this.retryMs);
      });
    }, delay);
    // The server's socket keeps the process alive; campaigning alone must not.
    this.#timer.unref();
  }

  /**
   * Stops campaigning but keeps the lease if held: the manager still has to clean up the
   * webhook configurations as the leader, then calls release().
   */
  async halt(): Promise<void> {
    this.#halted = true;
    clearTimeout(this.#timer);
    await this.#tick;
  }

  /** Halts, and a leader clears the holder so another replica takes over at its next round. */
  async stop(): Promise<void> {
    await this.halt();
    await this.release();
  }

  /**
   * Whether the Lease, read from the cluster now, still names this replica as its holder: it
   * stopped leading (its renewals failed) and no other replica has taken over. Whether another
   * holder's lease has expired is not judged here: that would compare two machines' clocks, and
   * a leader that crashed a moment ago is still served by the replicas behind the Service.
   * The read is bounded to 3 s: it runs during shutdown. Throws when the Lease cannot be read.
   */
  async stillOurs(): Promise<boolean> {
    const { api, name, namespace, server } = this.#o;
    try {
      const lease = await kubeCall({ verb: 'get', resource: 'leases', name, namespace }, server, () => api.readNamespacedLease({ name, namespace }, callOptions(Math.min(this.retryMs, 3_000))));
      return lease.spec?.holderIdentity === this.identity;
    } catch (error) {
      if (statusOf(error) === 404) return false;
      throw error;
    }
  }

  async release(): Promise<void> {
    if (!this.#leader) return;
    this.#leader = false;
    const { api, name, namespace, server } = this.#o;
    const options = callOptions(this.retryMs);
    try {
      // A conflict means the Lease changed under us (a renewal racing us): read it again.
      await retry(async () => {
        const lease = await kubeCall({ verb: 'get', resource: 'leases', name, namespace }, server, () => api.readNamespacedLease({ name, namespace }, options));
        if (lease.spec?.holderIdentity !== this.identity) return; // already someone else's
        const body: V1Lease = {
          apiVersion: 'coordination.k8s.io/v1',
          kind: 'Lease',
          metadata: {
            name, namespace, ...(lease.metadata?.resourceVersion ? { resourceVersion: lease.metadata.resourceVersion } : {}),
            labels: { [MANAGED_BY_LABEL]: MANAGED_BY_VALUE },
          },
          // leaseDurationSeconds 1, as client-go does: a candidate that only looks at expiry
          // still waits no more than a second.
          spec: { ...lease.spec, holderIdentity: '', leaseDurationSeconds: 1, renewTime: new V1MicroTime(this.#now()) },
        };
        await kubeCall({ verb: 'update', resource: 'leases', name, namespace }, server, () => api.replaceNamespacedLease({ name, namespace, body }, options));
        this.#o.log.info('leader election: released the lease', { lease: `${namespace}/${name}`, identity: this.identity });
      }, { retryable: (error: unknown) => statusOf(error) === 409, attempts: 3 });
    } catch (error) {
      this.#o.log.error('leader election: could not release the lease; another replica takes over once it expires', { lease: `${namespace}/${name}`, message: errorMessage(error) });
    }
  }
}

/**
 * The client declares MicroTime fields as Dates but hands back the apiserver's strings (it has
 * no deserializer for them); accept both.
 */
export function microTimeMs(value: Date | string | undefined): number {
  if (value === undefined) return Number.NaN;
  return value instanceof Date ? value.getTime() : Date.parse(value);
}
