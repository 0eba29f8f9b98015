// Keeps the cluster's ValidatingWebhookConfiguration and MutatingWebhookConfiguration in step
// with the served policies: on becoming the leader, on every reload, on certificate rotation
// and periodically (to undo drift such as a deleted configuration). Only objects labelled as
// ours are modified; a failed API call is retried with backoff and never touches serving.
import type {
  AdmissionregistrationV1Api,
  V1MutatingWebhookConfiguration,
  V1ValidatingWebhookConfiguration,
} from '@kubernetes/client-node';
import type { WebhooksConfig } from '../config/types.ts';
import { errorMessage, PortcullisError } from '../errors.ts';
import type { Logger } from '../util/log.ts';
import {
  buildConfigurations,
  checkManagedName,
  configuredNamespace,
  excludedNamespaces,
  hostNamespace,
  MANAGED_BY_LABEL,
  MANAGED_BY_VALUE,
  ignoredButFailing,
  persistentOnly,
  type DesiredConfigurations,
  type ManagedPolicy,
} from './build.ts';
import {
  callOptions,
  ForeignObjectError,
  KubeApiError,
  kubeCall,
  mergePatchOptions,
  statusOf,
  type KubeClients,
  type Resource,
} from './kube.ts';
import { CaBundle } from './ca-bundle.ts';
import { LeaderElector } from './lease.ts';
import { nextBackoff, retry } from './retry.ts';

/** Which installation (its Lease, namespace/name) manages a configuration. */
export const INSTALLATION_ANNOTATION = 'portcullis.dev/installation';

/** How often a leader that is not ready yet looks again before registering its webhooks. */
const READY_POLL_MS = 1000;

export interface WebhookManagerOptions {
  clients: KubeClients;
  log: Logger;
  /** The current webhooks section (it follows reloads; `managed` and `namespace` are fixed at start). */
  webhooks: () => WebhooksConfig;
  policies: () => readonly ManagedPolicy[];
  /** PEM the apiserver should trust for our serving certificate; absent without TLS. */
  caBundle?: string;
  identity?: string;
  env?: NodeJS.ProcessEnv;
  /** Re-apply this often while leading (undoes manual edits and deletions). Default 60 s. */
  resyncMs?: number;
  /** Told after each successful sync, with the performance.now() at which it read the desired state. */
  onSynced?: (started: number) => void;
  /**
   * Whether the host is fit to be put in front of the cluster, and if not why. Until it is, no
   * configuration is written: a leader whose context caches could not sync (RBAC missing)
   * registered its Fail webhooks anyway, and every request they covered was denied with
   * "retry shortly" until a person fixed RBAC (red team).
   */
  ready?: () => { ready: boolean; why?: string };
  /** Deadline of one API request. Default 10 s. */
  requestTimeoutMs?: number;
  /** How long a rotated-out CA stays in caBundle beside the new one. Default 5 min. */
  caOverlapMs?: number;
  /** How long certificate rotation waits for the new CA to be published. Default 30 s. */
  caPublishTimeoutMs?: number;
}

type Kind = 'ValidatingWebhookConfiguration' | 'MutatingWebhookConfiguration';
type Result = 'created' | 'updated' | 'unchanged' | 'deleted' | 'absent' | 'foreign';
type AnyConfiguration = V1ValidatingWebhookConfiguration | V1MutatingWebhookConfiguration;

const MAX_BACKOFF_MS = 60_000;

export class WebhookManager {
  readonly name: string;
  /** The host's namespace: holds the Lease, and is excluded from every webhook. */
  readonly namespace: string;
  readonly #installation: string;
  readonly #o: WebhookManagerOptions;
  readonly #log: Logger;
  readonly #elector: LeaderElector | undefined;
  readonly #timeoutMs: number;
  readonly #ca: CaBundle;
  #stopping = false;
  #started = false;
  #pending = false;
  #running: Promise<void> | undefined;
  #backoffMs = 0;
  #retryTimer: NodeJS.Timeout | undefined;
  #resyncTimer: NodeJS.Timeout | undefined;
  /** Kinds whose same-named foreign configuration was already reported. */
  readonly #foreignReported = new Set<string>();
  #overlapTimer: NodeJS.Timeout | undefined;
  #warnedName = false;
  #waitingReady = false;
  /** Stopping as the Lease's holder though no longer leading: this replica removes what a leader would have (see #lastOneOut). */
  #lastOut = false;
  #syncFailed = false;
  /** The policy set of the last sync that succeeded while ready: what is registered. */
  #applied: readonly ManagedPolicy[] | undefined;

  constructor(options: WebhookManagerOptions) {
    const webhooks = options.webhooks();
    if (!webhooks.managed) throw new TypeError('webhook management is off (webhooks.managed is not set)');
    checkManagedName(webhooks.managed);
    this.#o = options;
    this.#log = options.log;
    this.name = webhooks.managed;
    this.namespace = hostNamespace(webhooks, options.env);
    this.#installation = `${this.namespace}/${this.name}`;
    this.#timeoutMs = options.requestTimeoutMs ?? 10_000;
    this.#ca = new CaBundle(options.caBundle);
    this.#elector = webhooks.leaderElection
      ? new LeaderElector({
        api: options.clients.coordination, server: options.clients.server, name: this.name, namespace: this.namespace,
        ...(options.identity ? { identity: options.identity } : {}), leaseDurationSeconds: webhooks.leaseDurationSeconds, log: options.log,
        onStartedLeading: () => this.#onLeading(),
        onStoppedLeading: () => this.#onDeposed(),
        eligible: () => options.ready?.().ready ?? true,
      })
      : undefined;
  }

  get identity(): string | undefined {
    return this.#elector?.identity;
  }

  /**
   * While leading: the last sync failed, or it waits for the host to be ready. Red team: a failing
   * sync (stale or missing webhooks) was visible only in the log.
   */
  get syncFailing(): boolean {
    return this.isLeader && (this.#syncFailed || this.#waitingReady);
  }

  /** Whether this replica may write configurations now (checked again before every write). */
  get isLeader(): boolean {
    return this.#elector ? this.#elector.isLeader : this.#started;
  }

  /**
   * Every write to the cluster goes through here: webhook configurations, and the certificate
   * Secret on rotation. With leader election, the lease is checked immediately before the write
   * (LeaderElector.fence); without it, this replica is the only writer.
   */
  async fence<T>(what: string, write: () => Promise<T>): Promise<T> {
    if (!this.#elector) return write();
    // Last one out: the Lease is read again before each write, so a replica that took over
    // meanwhile (it syncs its own set) is not overwritten.
    if (this.#lastOut) {
      if (!(await this.#elector.stillOurs())) {
        throw new KubeApiError({ verb: 'patch', resource: 'validatingwebhookconfigurations', name: this.name }, undefined, `not writing ${what}: another replica holds the lease now; leaving it to that one`, false);
      }
      return write();
    }
    if (!this.#elector.isLeader) {
      throw new KubeApiError({ verb: 'patch', resource: 'validatingwebhookconfigurations', name: this.name }, undefined,
        `not writing ${what}: not the leader any more (or not renewed within the renew deadline); leaving it to the leader`, false);
    }
    return this.#elector.fence(what, write);
  }

  /** Returns at once: the apiserver may be unreachable for a while, serving must not wait. */
  start(): void {
    if (this.#started) return;
    this.#started = true;
    const webhooks = this.#o.webhooks();
    this.#log.info('managing webhook configurations', {
      name: this.name, mode: webhooks.singleWebhook ? 'single webhook' : 'one webhook per policy', apiserver: this.#o.clients.server,
      excludeNamespaces: this.#excluded(webhooks), leaderElection: Boolean(this.#elector), lease: this.#elector ? `${this.namespace}/${this.name}` : null,
    });
    if (!this.#ca.current) this.#log.warn('serving without TLS: the apiserver only calls HTTPS webhooks, so the managed webhooks cannot reach this host');
    for (const { mode, policies } of ignoredButFailing(this.#o.policies(), webhooks)) {
      this.#log.warn('single webhook: these failurePolicy Ignore policies share a Fail webhook, so while this host is down the requests only they cover are refused too; narrow their rules, or use one webhook per policy', {
        webhook: `${mode}.${this.name}`, policies,
      });
    }
    // The fallback is right in a Pod of the default namespace, and a surprise anywhere else
    // (a host run by hand, with a url): it silently leaves "default" unguarded (newcomer pass).
    if (configuredNamespace(webhooks, this.#o.env) === undefined) {
      this.#log.warn('webhooks.namespace is not set, so this host takes "default" as its own namespace and no managed webhook covers it; set webhooks.namespace to the namespace this host runs in', { excludeNamespaces: this.#excluded(webhooks) });
    }
    if (this.#elector) this.#elector.start();
    else this.#onLeading();
  }

  /** Re-apply soon (coalesced with any sync already running); used on reload. */
  requestSync(reason: string): void {
    if (this.#stopping || !this.isLeader) return;
    const managed = this.#o.webhooks().managed;
    if (managed !== this.name && !this.#warnedName) {
      this.#warnedName = true;
      this.#log.warn('webhooks.managed changed in the configuration; it takes effect on restart', { current: this.name, configured: managed ?? null });
    }
    this.#log.debug('webhook configurations: sync requested', { reason });
    this.#pending = true;
    this.#kick();
  }

  #kick(): void {
    if (this.#running) return;
    // A request that arrives while the last round is finishing is picked up here, not lost.
    this.#running = this.#drain().finally(() => {
      this.#running = undefined;
      if (this.#pending && !this.#stopping && this.isLeader) this.#kick();
    });
  }

  /**
   * Applies the desired configurations once, now; throws what failed. For tests and rotation.
   * While the host is not ready it re-applies only what the last sync registered (with the
   * current CA): a CA rotation took this path around the readiness check and registered an
   * unready host's Fail webhooks (re-test of the red team's F3).
   */
  async syncNow(): Promise<void> {
    await this.#running;
    const ready = this.#o.ready?.().ready ?? true;
    const policies = ready ? this.#o.policies() : this.#applied;
    if (policies === undefined) return; // nothing registered yet, so no CA to publish
    await this.#apply(this.#build(policies));
    if (ready) this.#applied = policies;
  }

  /**
   * Called with a new serving CA before the server presents a certificate it signs. The leader
   * publishes caBundle = new + previous CA (so connections and apiserver caches on either side
   * of the switch verify) and returns once the apiserver has it; a follower waits until it
   * sees the leader's update. Gives up after caPublishTimeoutMs: holding on to a certificate
   * that is being replaced (perhaps because it expires) is not safer.
   */
  async publishCa(pem: string): Promise<boolean> {
    const overlapMs = this.#o.caOverlapMs ?? 5 * 60_000;
    if (!this.#ca.rotate(pem, overlapMs)) return true;
    clearTimeout(this.#overlapTimer);
    this.#overlapTimer = setTimeout(() => this.requestSync('CA overlap ended'), overlapMs + 100);
    this.#overlapTimer.unref();
    try {
      await retry(async () => {
        if (this.isLeader) {
          await this.syncNow();
          this.#log.info('webhook configurations: published the new serving CA', { name: this.name });
        } else if (!await this.#published(pem)) {
          throw new Error('the leader has not published it yet');
        }
      }, {
        // Every failure may clear: the leader publishes, the apiserver comes back.
        retryable: () => true, deadline: Date.now() + (this.#o.caPublishTimeoutMs ?? 30_000), firstDelayMs: 250, maxDelayMs: 5_000,
        stopped: () => this.#stopping,
      });
      return true;
    } catch (error) {
      this.#log.error('webhook configurations: the new serving CA could not be published in time; the apiserver may reject the new certificate until it is',
        { name: this.name, message: errorMessage(error) });
      return false;
    }
  }

  /**
   * On graceful exit: as the leader, remove the webhooks of non-persistent policies (and delete
   * a configuration left empty), then release the Lease so another replica takes over at once.
   */
  async stop({ timeoutMs = 10_000 }: { timeoutMs?: number } = {}): Promise<void> {
    if (this.#stopping) return;
    this.#stopping = true;
    for (const timer of [this.#retryTimer, this.#resyncTimer, this.#overlapTimer]) clearTimeout(timer);
    await this.#running;
    await this.#elector?.halt();
    if (!this.isLeader && this.#elector) this.#lastOut = await this.#lastOneOut();
    if (this.isLeader || this.#lastOut) {
      try {
        // Shutdown has a grace period: retry only what can clear up within it.
        const results = await retry(async () => {
          // Renewals stopped with halt(), so past the renew deadline this host is no leader, though
          // nobody may have taken over: the Lease says (red team: the apiserver away for seconds at
          // the exit, and the configurations were left behind 5 s into the 10 s, blamed on a new
          // leader there was not).
          if (this.#elector && !this.isLeader && !this.#lastOut) this.#lastOut = await this.#stillOursAtExit();
          try {
            return await this.#apply(this.#desired(true));
          } catch (error) {
            if (statusOf(error) !== 422) throw error;
            // The apiserver refused the persistent webhooks as this host would write them (a
            // value it checks and the host's configuration checks do not). Left in place, the
            // non-persistent ones would call a host that is gone: they are taken out of what is
            // registered, and the persistent ones stay as the apiserver last accepted them.
            this.#log.warn('webhook configurations: the apiserver refused them as this host would leave them; removing the webhooks of non-persistent policies from what is registered instead',
              { name: this.name, message: errorMessage(error) });
            return this.#apply(this.#desired(true), true);
          }
        }, {
          retryable: (error) => error instanceof KubeApiError && error.transient, deadline: Date.now() + timeoutMs, firstDelayMs: 250, maxDelayMs: 2_000,
        });
        // A configuration another installation owns was left alone, not cleaned up: not "removed".
        this.#log.info(results.includes('foreign')
          ? 'webhook configurations: removed the webhooks of non-persistent policies where ours; a same-named configuration another installation owns was left alone'
          : 'webhook configurations: removed the webhooks of non-persistent policies', { name: this.name, validating: results[0], mutating: results[1] });
      } catch (error) {
        // A host that never registered any (the apiserver unreachable all along) has none of its
        // own to leave: an earlier run's may still be there (newcomer: told to remove webhooks
        // that were never created).
        this.#log.error(this.#applied === undefined
          ? 'webhook configurations: could not reach the apiserver on exit; this host registered none, but one an earlier run left stays until removed by hand (or by this host next time it stops)'
          : 'webhook configurations: could not remove the webhooks on exit; remove them by hand if the host is not coming back',
        { name: this.name, message: errorMessage(error) });
      }
    }
    this.#lastOut = false;
    await this.#elector?.release();
    this.#started = false;
  }

  /** True while the Lease is still this host's; throws (not retried) once another replica holds it. */
  async #stillOursAtExit(): Promise<boolean> {
    if (await this.#elector!.stillOurs()) return true;
    throw new PortcullisError('NOT_LEADER', `another replica holds the lease ${this.namespace}/${this.name} now; leaving the configurations to it`);
  }

  /**
   * A replica that is not the leader leaves the configurations to the one that is. But a host
   * that lost its lease because its own renewals failed (denied by a webhook, say), with no
   * other replica taking over, is still the Lease's holder, and nobody else would remove them:
   * it left webhooks with failurePolicy Fail that pointed at nothing, and the cluster refused
   * what they covered (outsider run on 1.20). Only that case: a Lease free or held by another
   * replica, even one that looks expired, is left to the replicas still running (red team: a
   * follower judging expiry by its own clock removed a live leader's webhooks).
   */
  async #lastOneOut(): Promise<boolean> {
    try {
      if (await this.#elector!.stillOurs()) {
        this.#log.warn('webhook configurations: this host still holds the lease but could not renew it, and no replica took over; removing the webhooks of non-persistent policies as the last one out', { name: this.name, lease: `${this.namespace}/${this.name}` });
        return true;
      }
      this.#log.info('webhook configurations: left to the replicas still running', { name: this.name });
    } catch (error) {
      this.#log.error(this.#applied === undefined
        ? 'webhook configurations: could not reach the apiserver on exit; this host registered none, but one an earlier run or another replica left stays until removed by hand'
        : 'webhook configurations: could not read the lease to tell whether another replica leads; left the webhooks in place: remove them by hand if no host is coming back',
      { name: this.name, lease: `${this.namespace}/${this.name}`, message: errorMessage(error) });
    }
    return false;
  }

  #onLeading(): void {
    if (this.#stopping) return;
    this.#backoffMs = 0;
    this.requestSync('became leader');
    void this.#checkVersion();
    const resyncMs = this.#o.resyncMs ?? this.#o.webhooks().resyncSeconds * 1000;
    clearInterval(this.#resyncTimer);
    this.#resyncTimer = setInterval(() => this.requestSync('resync'), resyncMs);
    this.#resyncTimer.unref();
  }

  #onDeposed(): void {
    clearInterval(this.#resyncTimer);
    clearTimeout(this.#retryTimer);
    this.#pending = false;
  }

  async #drain(): Promise<void> {
    while (this.#pending && !this.#stopping && this.isLeader) {
      this.#pending = false;
      clearTimeout(this.#retryTimer);
      const readiness = this.#o.ready?.() ?? { ready: true };
      if (!readiness.ready) {
        if (!this.#waitingReady) this.#log.warn('not registering webhooks until this host is ready', { name: this.name, why: readiness.why ?? 'not ready' });
        this.#waitingReady = true;
        this.#retryTimer = setTimeout(() => this.requestSync('waiting until ready'), READY_POLL_MS);
        this.#retryTimer.unref();
        return;
      }
      if (this.#waitingReady) this.#log.info('ready; registering webhooks', { name: this.name });
      this.#waitingReady = false;
      try {
        const started = performance.now();
        const policies = this.#o.policies();
        const results = await this.#apply(this.#build(policies));
        this.#applied = policies;
        this.#backoffMs = 0;
        // Not retried (a person must act), but failing all the same: the configuration that
        // covers these requests is another installation's (red team: a dead host's Fail webhooks
        // refused every Pod while portcullis_webhook_sync_failing said 0).
        this.#syncFailed = results.includes('foreign');
        this.#o.onSynced?.(started);
      } catch (error) {
        this.#syncFailed = true;
        const retryable = error instanceof KubeApiError ? error.retryable : false;
        this.#log.error('webhook configurations: sync failed', {
          name: this.name, message: errorMessage(error),
          ...(retryable ? { retryInSeconds: Math.round(this.#nextBackoff() / 1000) } : { retry: 'on the next reload or resync' }),
        });
        if (retryable) {
          this.#retryTimer = setTimeout(() => this.requestSync('retry'), this.#backoffMs);
          this.#retryTimer.unref();
        }
      }
    }
  }

  #nextBackoff(): number {
    this.#backoffMs = nextBackoff(this.#backoffMs, MAX_BACKOFF_MS);
    return this.#backoffMs;
  }

  #excluded(webhooks: WebhooksConfig): string[] {
    // The Lease's namespace stays excluded even if a reload names another one.
    return [...new Set([this.namespace, ...excludedNamespaces(webhooks, this.#o.env)])].sort();
  }

  #desired(final: boolean): DesiredConfigurations {
    return this.#build(final ? persistentOnly(this.#o.policies()) : this.#o.policies());
  }

  #build(policies: readonly ManagedPolicy[]): DesiredConfigurations {
    const webhooks = this.#o.webhooks();
    const ca = this.#ca.bundle();
    return buildConfigurations({ name: this.name, policies, webhooks, ...(ca ? { caBundle: ca } : {}), excludeNamespaces: this.#excluded(webhooks) });
  }

  /** `asRegistered`: keep the registered copies of the desired webhooks (by name), rather than writing them (exit fallback). */
  async #apply(desired: DesiredConfigurations, asRegistered = false): Promise<[Result, Result]> {
    // Both kinds are attempted even if one fails (a foreign validating configuration must not
    // keep the mutating one stale); the first failure is rethrown.
    const outcomes = await Promise.allSettled([
      this.#applyOne('ValidatingWebhookConfiguration', desired.validating, asRegistered),
      this.#applyOne('MutatingWebhookConfiguration', desired.mutating, asRegistered),
    ]);
    // A same-named configuration someone else owns is left alone and reported once, plainly: it
    // is no reason to retry (a person must act), nor to hold up the other kind or a CA rotation.
    const results = outcomes.map((o, i) => {
      if (o.status === 'fulfilled') return o.value;
      if (!(o.reason instanceof ForeignObjectError)) return o;
      const kind = i === 0 ? 'ValidatingWebhookConfiguration' : 'MutatingWebhookConfiguration';
      if (!this.#foreignReported.has(kind)) {
        this.#foreignReported.add(kind);
        this.#log.error('webhook configurations: a configuration with our name belongs to someone else; not touching it', {
          kind, name: this.name, message: errorMessage(o.reason),
        });
      }
      return 'foreign' as const;
    });
    const failed = results.find((r): r is PromiseRejectedResult => typeof r === 'object');
    if (failed) throw failed.reason;
    return results as [Result, Result];
  }

  async #applyOne(kind: Kind, desired: AnyConfiguration, asRegistered: boolean): Promise<Result> {
    // A conflict means someone wrote between our read and write: read again, a few times.
    const result = await retry(() => this.#applyOnce(kind, desired, asRegistered), { retryable: (error) => statusOf(error) === 409, attempts: 3 });
    const fields = { kind, name: this.name, webhooks: (desired.webhooks ?? []).map((w) => w.name) };
    if (result === 'unchanged' || result === 'absent') this.#log.debug(`webhook configuration ${result}`, fields);
    else this.#log.info(`webhook configuration ${result}`, fields);
    return result;
  }

  async #applyOnce(kind: Kind, desired: AnyConfiguration, asRegistered: boolean): Promise<Result> {
    const ops = this.#operations(kind);
    if (!this.isLeader && !this.#lastOut) throw new KubeApiError({ verb: 'patch', resource: ops.resource, name: this.name }, undefined, 'not the leader any more; leaving the configurations to the new leader', false);
    let current: AnyConfiguration | undefined;
    try {
      current = await ops.get();
    } catch (error) {
      if (statusOf(error) !== 404) throw error;
    }
    if (current && current.metadata?.labels?.[MANAGED_BY_LABEL] !== MANAGED_BY_VALUE) throw new ForeignObjectError(kind, this.name, `${MANAGED_BY_LABEL}=${MANAGED_BY_VALUE}`);
    // Two installations with one `managed` name (another namespace: a staging copy, a move) each
    // led their own Lease and rewrote the configuration in turn, each un-excluding the other's
    // namespace (red team). The first to write it owns it; one written before this annotation
    // existed is adopted.
    const theirs = current?.metadata?.annotations?.[INSTALLATION_ANNOTATION];
    if (theirs !== undefined && theirs !== this.#installation) {
      throw new ForeignObjectError(kind, this.name, `${MANAGED_BY_LABEL}=${MANAGED_BY_VALUE}`, { theirs, ours: this.#installation });
    }
    const resourceVersion = current?.metadata?.resourceVersion ?? '';
    const wanted = new Set((desired.webhooks ?? []).map((w) => w.name));
    const webhooks = asRegistered && current ? (current.webhooks ?? []).filter((w) => wanted.has(w.name)) : desired.webhooks ?? [];
    // An empty configuration is pointless and, for a reader, misleading: none means none.
    if (webhooks.length === 0) {
      if (!current) return 'absent';
      await ops.delete(resourceVersion);
      return 'deleted';
    }
    const annotations = { [INSTALLATION_ANNOTATION]: this.#installation };
    if (!current) {
      await ops.create({ ...desired, metadata: { ...desired.metadata, annotations: { ...desired.metadata?.annotations, ...annotations } } });
      return 'created';
    }
    // A merge patch replaces the webhooks list as a whole, which is what removes the webhooks
    // of deleted policies; the resourceVersion makes it fail (409) if the object changed since
    // we checked that it is ours.
    const metadata = { resourceVersion, labels: { [MANAGED_BY_LABEL]: MANAGED_BY_VALUE }, annotations };
    const patched = await ops.patch({ metadata, webhooks });
    return patched.metadata?.resourceVersion === resourceVersion ? 'unchanged' : 'updated';
  }

  #operations(kind: Kind) {
    const api: AdmissionregistrationV1Api = this.#o.clients.admission;
    const { server } = this.#o.clients;
    const name = this.name;
    const validating = kind === 'ValidatingWebhookConfiguration';
    const resource: Resource = validating ? 'validatingwebhookconfigurations' : 'mutatingwebhookconfigurations';
    const options = callOptions(this.#timeoutMs);
    const patchOptions = mergePatchOptions(this.#timeoutMs);
    const op = (verb: 'get' | 'create' | 'patch' | 'delete') => ({ verb, resource, name });
    const preconditions = (resourceVersion: string) => ({ preconditions: { resourceVersion } });
    return {
      resource,
      get: (): Promise<AnyConfiguration> => kubeCall(op('get'), server, () => (validating ? api.readValidatingWebhookConfiguration({ name }, options) : api.readMutatingWebhookConfiguration({ name }, options))),
      create: (body: AnyConfiguration): Promise<AnyConfiguration> => this.fence(`${resource} ${name}`, () => kubeCall(op('create'), server, () => (validating
        ? api.createValidatingWebhookConfiguration({ body: body }, options)
        : api.createMutatingWebhookConfiguration({ body: body }, options)))),
      patch: (body: object): Promise<AnyConfiguration> => this.fence(`${resource} ${name}`, () => kubeCall(op('patch'), server, () => (validating
        ? api.patchValidatingWebhookConfiguration({ name, body }, patchOptions)
        : api.patchMutatingWebhookConfiguration({ name, body }, patchOptions)))),
      delete: (resourceVersion: string): Promise<unknown> => this.fence(`${resource} ${name}`, () => kubeCall(op('delete'), server, () => (validating
        ? api.deleteValidatingWebhookConfiguration({ name, body: preconditions(resourceVersion) }, options)
        : api.deleteMutatingWebhookConfiguration({ name, body: preconditions(resourceVersion) }, options)))),
    };
  }

  /** Whether every existing managed webhook already trusts `pem` (a follower's view of rotation). */
  async #published(pem: string): Promise<boolean> {
    for (const kind of ['ValidatingWebhookConfiguration', 'MutatingWebhookConfiguration'] as const) {
      let current: AnyConfiguration;
      try {
        current = await this.#operations(kind).get();
      } catch (error) {
        if (statusOf(error) === 404) continue;
        throw error;
      }
      if (!(current.webhooks ?? []).every((hook) => CaBundle.trusts(hook.clientConfig.caBundle, pem))) return false;
    }
    return true;
  }

  /**
   * Before 1.21 namespaces do not carry kubernetes.io/metadata.name, so the NotIn exclusion
   * excludes nothing until someone labels them: say so once, where an operator looks.
   */
  async #checkVersion(): Promise<void> {
    try {
      const info = await this.#o.clients.version.getCode(callOptions(this.#timeoutMs));
      const known = kubernetesVersion(info);
      if (!known || (known.major === 1 && known.minor < 21)) {
        const which = known ? 'Kubernetes before 1.21' : `This apiserver does not say its version (${info.gitVersion || 'none'}); if it is before 1.21, it`;
        this.#log.warn(`${which} does not label namespaces with kubernetes.io/metadata.name: label the excluded namespaces yourself (or with portcullis.dev/ignore=true), or the managed webhooks cover them too; those already labelled are left out`, {
          version: info.gitVersion, excludeNamespaces: this.#excluded(this.#o.webhooks()),
        });
      }
    } catch {
      // Only advice; the version endpoint being unreachable is reported by the sync itself.
    }
  }
}

/**
 * The apiserver's major.minor: from its major/minor fields, or else from its gitVersion (builds
 * from source may leave the fields empty); undefined when neither says (v0.0.0 is no version).
 */
export function kubernetesVersion(info: { major?: string; minor?: string; gitVersion?: string }): { major: number; minor: number } | undefined {
  const major = Number.parseInt(info.major ?? '', 10);
  const minor = Number.parseInt(info.minor ?? '', 10); // "27+" on some providers
  if (major > 0 && minor >= 0) return { major, minor };
  const git = /^v(\d+)\.(\d+)\./.exec(info.gitVersion ?? '');
  if (!git || git[1] === '0') return undefined;
  return { major: Number(git[1]), minor: Number(git[2]) };
}

/**
 * After a sync that removed a webhook succeeded, how long its policy is still answered: the
 * apiserver sees configuration changes through a watch, typically within a second.
 */
