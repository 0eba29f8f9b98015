// A running Portcullis server: sandbox pool, current policy set, HTTP(S) listener, reload on
// file change or SIGHUP, certificate rotation, graceful stop. `portcullis serve` and the
// integration tests both start it through `startServer`.
import { unwatchFile, watchFile, type Stats } from 'node:fs';
import type { Server, ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { isAbsolute } from 'node:path';
import type { Server as HttpsServer } from 'node:https';
import { cacheFolders, PRUNE_MAX_FILES, pruneCache } from '../cache/prune.ts';
import { loadConfigFile } from '../config/load.ts';
import { ContextHub } from '../context/hub.ts';
import type { ClusterContext } from '../context/informers.ts';
import { grantedKinds } from '../context/grants.ts';
import { kindsToCache } from '../context/needs.ts';
import type { Config } from '../config/types.ts';
import { ConfigError, errorMessage } from '../errors.ts';
import { loadPolicySet, PolicyRegistry, PolicySet } from '../policy/policy-set.ts';
import { missingModules, type RegistryOptions } from '../policy/source.ts';
import { PatchMerger } from '../merge/offload.ts';
import { SandboxPool } from '../sandbox/pool.ts';
import type { NamespaceLabels } from '../select/match.ts';
import { unscoped } from '../config/selectors.ts';
import { hostObjects, writesOwnObjects } from '../select/host-objects.ts';
import { hostNamespace } from '../webhooks/build.ts';
import { createServer } from './http.ts';
import { createLogger, type Logger } from '../util/log.ts';
import { SlotList } from '../util/slot-list.ts';
import { mib } from '../util/text.ts';
import { Metrics } from './metrics.ts';
import { listenMetrics, metricsUrl } from './metrics-listener.ts';
import { checkServable, tlsMaterial, watchCertificates, type TlsMaterial, type TlsOrigin } from './tls.ts';
import { terminalHungUp } from '../util/terminal.ts';

function certificateSource(config: Config, origin: TlsOrigin = {}): string {
  const tls = config.server.tls;
  if (tls.mode === 'files') return `files ${tls.certFile}, ${tls.keyFile}${tls.caFile ? `, CA ${tls.caFile}` : ''} (reloaded on change)`;
  if (tls.mode === 'self-signed') {
    const names = tls.hostnames.join(', ');
    if (origin.reusedFrom) return `kept from an earlier start for ${names} (development only; delete ${origin.reusedFrom} for a new one)`;
    const replaced = origin.replaced ? '. It replaced the one kept there (expiring, damaged, or a CA from an earlier build): register the new caBundle (--cadump) wherever the old one was' : '';
    return `generated at start for ${names} (development only)${origin.keptIn ? `; kept in ${origin.keptIn} for the next start${replaced}` : ''}`;
  }
  return tls.mode;
}

export interface StartOptions {
  config: Config;
  log?: Logger;
  /** Watch the config file and reload on change (and on SIGHUP). Default: true when it has a file. */
  watch?: boolean;
  namespaceLabels?: NamespaceLabels;
  /** TLS material obtained by the caller (tls.mode "secret": from the cluster, see certs/). */
  tls?: TlsMaterial;
  /** Where the certificate came from, for the start-up log line. */
  certificateSource?: string;
  /** Without managed webhooks, how long a removed policy is still answered (tests). Default RETIRE_GRACE_MS. */
  retireGraceMs?: number;
  /** The username of the host's own requests to the apiserver (select/host-objects.ts). Default: what its credentials say (webhooks/kube.ts ownUsername). */
  requester?: string;
  /**
   * What the command line sets over the file (serve's flags), for every configuration reloaded
   * too: without it a reload compared the file's values with the flags' and found them changed
   * (--log-level undone, --workers and --port said to wait for a restart at every reload).
   */
  adjust?: (config: Config) => Config;
}

type Listener = (set: PolicySet) => void;

/**
 * How long a replica answers a policy that a reload removed when no successful webhook sync
 * says so sooner (a follower, or webhooks managed by hand): long enough for the leader's sync
 * and the apiserver's watch.
 */
export const RETIRE_GRACE_MS = 30_000;

/**
 * Connections the kernel may hold for the host before it accepts them (capped by
 * net.core.somaxconn, 4096 by default since Linux 5.4). Node's default, 511, overflowed when a
 * caller opened connections in a burst while the main thread was busy: the overload benchmark's
 * 2,048 saw SYNs dropped (a second's retransmit each) and up to 237 connections fail. Go servers,
 * the apiserver among them, listen with somaxconn.
 */
const LISTEN_BACKLOG = 4096;

/**
 * Prunes in one process at most this often (ms). A walk of a developer's shared cache folder
 * (tens of thousands of Node compile-cache files) takes a while, and test runs start hundreds
 * of servers; in a pod the cache grows only by reloads.
 */
const PRUNE_INTERVAL_MS = 10 * 60 * 1000;
/** How often a policy module on disk is looked at for a change (a stat each; the config file: 500 ms). */
const MODULE_POLL_MS = 1000;
let lastPruneAt = -Infinity;

export class PortcullisServer {
  readonly log: Logger;
  readonly pool: SandboxPool;
  /** Combines large patches off the main thread. */
  readonly merger = new PatchMerger();
  readonly registry: PolicyRegistry;
  readonly metrics: Metrics;
  /** Issue 15: the cluster objects policies may read (and namespace labels for the single webhook). */
  readonly context = new ContextHub();
  #cluster: ClusterContext | undefined;
  config: Config;
  tls: TlsMaterial | undefined;
  #server: Server;
  #ready = false;
  /** Leaving: /readyz says 503 and every answer closes its connection (drain, stop). */
  #draining = false;
  /** Requests not yet answered (not a Set: see SlotList). */
  readonly #open = new SlotList<ServerResponse>();
  #retireGraceMs = RETIRE_GRACE_MS;
  #adjust: (config: Config) => Config = (config) => config;
  #stopping: Promise<void> | undefined;
  #cleanups: (() => void)[] = [];
  #reloading: Promise<boolean> | undefined;
  #pruning: Promise<void> = Promise.resolve();
  #pruneTimer: NodeJS.Timeout | undefined;
  #pruneSince = 0;
  #reloadAgain: Promise<boolean> | undefined;
  #metricsServer: Server | undefined;
  #listeners: { reload: Listener[]; tls: ((tls: TlsMaterial) => void | Promise<void>)[] } = { reload: [], tls: [] };

  private constructor(config: Config, log: Logger, tls: TlsMaterial | undefined, pool: SandboxPool, namespaceLabels?: NamespaceLabels, requester?: string) {
    this.config = config;
    this.log = log;
    this.tls = tls;
    this.pool = pool;
    this.registry = new PolicyRegistry(this.pool, new PolicySet([]));
    this.metrics = new Metrics(this.pool);
    const own = hostObjects(config, hostNamespace(config.webhooks), requester);
    if (own?.requester) log.info('the host\'s own Lease and certificate Secret skip the policies when it writes them itself', { username: own.requester });
    else if (own) {
      // It says what gives the username (newcomer: warned at every local start, with no action named).
      log.warn('cannot tell which username the apiserver gives this host (its credentials are not a ServiceAccount token or a client certificate): '
        + 'its own Lease and certificate Secret skip the policies whoever writes them. In a Pod its ServiceAccount token says it; '
        + 'run locally, a kubeconfig with a client certificate or a ServiceAccount token does');
    }
    this.#server = createServer(config.server, tls, {
      registry: this.registry, pool: this.pool, metrics: this.metrics, log, merger: this.merger,
      namespaceLabels: namespaceLabels ?? ((namespace) => this.context.namespaceLabels(namespace)),
      ...(config.server.logAllowedReviews ? { logAllowed: true } : {}),
      ...(config.webhooks.managed ? { allowUnknownPolicies: true } : {}),
      ...(own ? { hostObjects: own } : {}),
      acceptsReviews: () => this.#ready,
      isReady: () => this.#readiness(),
      isAlive: () => this.#liveness(),
    });
    // First of the request listeners, so that the header is set before any answer is written.
    this.#server.prependListener('request', (_req, res) => {
      res.once('close', this.#open.add(res));
      if (this.#draining) res.setHeader('connection', 'close');
    });
  }

  /** The TLS material to serve with, said in the log, and the username the apiserver gives this host. */
  static async #identity(options: StartOptions, log: Logger): Promise<{ tls: TlsMaterial | undefined; requester: string | undefined }> {
    const { config } = options;
    let tls: TlsMaterial | undefined;
    const origin: TlsOrigin = {};
    const mode = config.server.tls.mode;
    if (mode === 'insecure') {
      log.warn('serving plain HTTP (insecure): the apiserver only calls HTTPS webhooks; use this only behind a TLS proxy or for local tests');
    } else if (mode === 'secret') {
      if (!options.tls) throw new ConfigError('tls.mode "secret" needs the certificate from the cluster; start it with `portcullis serve`');
      tls = options.tls;
    } else if (options.tls) {
      tls = options.tls;
    } else {
      tls = await tlsMaterial(config.server.tls, origin);
      const { tls: files } = config.server;
      // The same test a replacement passes (#watchCertificates): served as it is, the apiserver's
      // every call would fail with an x509 error while /readyz said ready.
      if (files.mode === 'files') {
        try {
          checkServable(tls, calledAs(config));
        } catch (error) {
          throw new ConfigError(`server.tls: ${files.certFile} cannot be served to the apiserver: ${errorMessage(error)}`);
        }
      }
    }
    log.info('TLS', { mode, source: options.certificateSource ?? certificateSource(config, origin), clientCertificates: tls?.clientCA ? (tls.requireClientCert ? 'required' : 'optional') : 'off' });
    // Imported only here: the Kubernetes client is a large load, and a host that writes nothing to the cluster never needs it.
    const requester = options.requester ?? (writesOwnObjects(config) ? (await import('../webhooks/kube.ts')).ownUsername() : undefined);
    return { tls, requester };
  }

  static async start(options: StartOptions): Promise<PortcullisServer> {
    const { config } = options;
    const log = options.log ?? createLogger(config.logLevel);
    await checkStartable(config);
    // Started first: the workers boot on other cores while this thread makes the TLS material
    // (loading selfsigned alone takes ~190 ms), instead of after it.
    const pool = new SandboxPool(config.workers > 0 ? config.workers : undefined, {
      // Once per policy and load at most: the lane takes a policy only while it behaves.
      onInlineLeave: (key, reason) => log.info('the inline lane no longer takes this policy; its calls go to the sandbox workers until its module, limits or settings change, or the host restarts', {
        policy: key.slice(0, key.lastIndexOf('@')), sandbox: key, reason,
      }),
    });
    let server: PortcullisServer;
    try {
      const { tls, requester } = await PortcullisServer.#identity(options, log);
      server = new PortcullisServer(config, log, tls, pool, options.namespaceLabels, requester);
    } catch (error) {
      // Without this the sandbox workers would keep the process alive after a failed start.
      await pool.close();
      throw error;
    }
    if (options.retireGraceMs !== undefined) server.#retireGraceMs = options.retireGraceMs;
    if (options.adjust) server.#adjust = options.adjust;
    try {
      await server.#listen();
    } catch (error) {
      // Without this the sandbox workers would keep the process alive after a failed start.
      await server.pool.close();
      await server.merger.close();
      throw new ConfigError(`cannot listen on ${config.server.host}:${config.server.port}: ${errorMessage(error)}`);
    }
    try {
      await server.#ensureContext(config);
    } catch (error) {
      // The socket too: it kept the process alive, listening, after saying it refused to start.
      await server.stop(0);
      throw error;
    }
    if (config.server.metricsPort !== undefined) {
      try {
        const endpoints = { metrics: server.metrics, isReady: () => server.#readiness(), isAlive: () => server.#liveness() };
        server.#metricsServer = await listenMetrics(config.server.host, config.server.metricsPort, endpoints);
        log.info('metrics listening', { url: metricsUrl(server.#metricsServer) });
      } catch (error) {
        await server.stop(0);
        throw new ConfigError(`cannot listen for metrics on ${config.server.host}:${config.server.metricsPort}: ${errorMessage(error)}`);
      }
    }
    const loadStarted = performance.now();
    const loadStartedAt = Date.now();
    // Alive (healthz) while loading; ready (readyz) once every policy has been tried.
    const set = await loadPolicySet(server.pool, config, server.#registries(config));
    server.registry.swap(set);
    server.#reportSet(set);
    server.#ready = true;
    log.info('ready', {
      // Counted as /readyz counts them: configured, of which some failed.
      loadMs: Math.round(performance.now() - loadStarted),
      policies: set.entries.length, loaded: set.entries.length - set.failed.length, failed: set.failed.map((e) => e.config.name),
      ...(config.server.readyWhenAllPoliciesLoaded && set.failed.length > 0 ? { readyz: 'failing until every policy loads (server.readyWhenAllPoliciesLoaded)' } : {}),
    });
    if (options.watch ?? Boolean(config.source)) server.#watchConfig();
    if (config.server.tls.mode === 'files') server.#watchCertificates(config.server.tls);
    server.#pruneCache(loadStartedAt);
    return server;
  }

  get address(): AddressInfo {
    return this.#server.address() as AddressInfo;
  }

  get url(): string {
    const { address, port } = this.address;
    const host = address.includes(':') ? `[${address}]` : address;
    return `${this.tls ? 'https' : 'http'}://${host === '0.0.0.0' ? '127.0.0.1' : host}:${port}`;
  }

  get ready(): boolean {
    return this.#ready;
  }

  /** The metrics listener's base URL (server.metricsPort), if it runs. */
  get metricsUrl(): string | undefined {
    return this.#metricsServer ? metricsUrl(this.#metricsServer) : undefined;
  }

  /**
   * Whether this host may be put in front of the cluster (the webhook manager registers nothing
   * before): its policies loaded (all of them, with readyWhenAllPoliciesLoaded) and its context
   * caches synced. Unlike /readyz it ignores a drain, which is the manager's own business.
   */
  webhookReadiness(): { ready: boolean; why?: string } {
    if (!this.#ready) return { ready: false, why: 'the policies are still loading' };
    const waiting = this.context.waiting();
    if (waiting.length > 0) return { ready: false, why: `the context caches of ${waiting.join(', ')} have not synced (see the context log lines: RBAC?)` };
    const failed = this.registry.current.failed.map((e) => e.config.name);
    if (this.config.server.readyWhenAllPoliciesLoaded && failed.length > 0) return { ready: false, why: `policies failed to load: ${failed.join(', ')}` };
    return { ready: true };
  }

  /**
   * Alive unless a sandbox worker's thread outlived its termination: it spins on a core for
   * good, and only a new process ends it (SandboxPool #stop), so the kubelet's liveness probe
   * is asked for one. Each one was a call already answered as past its deadline.
   */
  #liveness(): { alive: boolean; detail: Record<string, unknown> } {
    const { unstopped } = this.pool.stats;
    if (unstopped === 0) return { alive: true, detail: {} };
    const message = `${unstopped} sandbox worker thread${unstopped === 1 ? '' : 's'} kept running after being stopped at a policy's deadline `
      + '(a guest V8 could not interrupt), each using a CPU core; restart the host to end them';
    return { alive: false, detail: { message } };
  }

  #readiness(): { ready: boolean; detail: Record<string, unknown> } {
    const failed = this.registry.current.failed.map((e) => ({ policy: e.config.name, code: e.error?.code, error: e.error?.message }));
    // Optional: an operator who would rather have no traffic than a policy that is not enforcing.
    // Not ready until every cached context kind has synced (reads before that fail as temporary).
    // Not ready once shutting down (drain): the endpoint goes while the host still answers.
    const ready = this.#ready && !this.#draining && this.context.waiting().length === 0
      && !(this.config.server.readyWhenAllPoliciesLoaded && failed.length > 0);
    return { ready, detail: { policies: this.registry.current.entries.length, failed, ...(this.#cluster ? { context: this.context.store.kinds() } : {}) } };
  }

  /**
   * Starts presenting new TLS material: listeners (the webhook manager) publish its CA first,
   * so the apiserver never sees a certificate it cannot verify. Open connections are kept.
   */
  async useCertificate(material: TlsMaterial, source: string): Promise<void> {
    for (const listener of this.#listeners.tls) await listener(material);
    (this.#server as HttpsServer).setSecureContext({ key: material.key, cert: material.cert, ...(material.clientCA ? { ca: material.clientCA } : {}) });
    this.tls = material;
    this.log.info('TLS certificate reloaded', { source });
  }

  /** The configuration's registries, reporting pulls to this server's log and metrics. */
  #registries(config: Config): RegistryOptions {
    return {
      ...config.registries, log: (level, message, fields) => this.log[level](message, fields),
      onPull: (registry, result) => this.metrics.registryPulls.inc({ registry, result }),
    };
  }

  onReload(listener: Listener): void {
    this.#listeners.reload.push(listener);
  }

  /** Called with new TLS material before the server starts presenting it. */
  onCertificate(listener: (tls: TlsMaterial) => void | Promise<void>): void {
    this.#listeners.tls.push(listener);
  }

  /**
   * Re-reads the configuration file and swaps in the new policy set. Returns false (and keeps
   * the current set serving) when the file is invalid or any policy in it fails to load.
   */
  reload(): Promise<boolean> {
    // Shutting down: its webhooks go with it, and a reload would only say things about a file
    // (newcomer: "configuration reload refused" 0.5 s after "shutting down").
    if (this.#draining) return Promise.resolve(false);
    if (!this.#reloading) {
      this.#reloading = this.#reload().finally(() => (this.#reloading = undefined));
      return this.#reloading;
    }
    // One is under way and may have read the file before this change: run once more after it
    // (requests meanwhile share that one). Joining it lost the change: the file watcher's reload
    // of one edit answered a reload asked for the next, which never ran (flaky test in CI).
    this.#reloadAgain ??= this.#reloading.catch(() => false).then(() => {
      this.#reloadAgain = undefined;
      return this.reload();
    });
    return this.#reloadAgain;
  }

  async #reload(): Promise<boolean> {
    const source = this.config.source;
    if (!source) return false;
    let config: Config;
    try {
      config = this.#adjust(await loadConfigFile(source));
    } catch (error) {
      this.metrics.reloads.inc({ result: 'invalid' });
      this.log.error('configuration reload refused; the current policies keep serving', { file: source, message: errorMessage(error) });
      return false;
    }
    // Server settings wait for a restart, and a changed url waits with them (below): only a
    // reload that keeps the listener can point the webhooks somewhere else now.
    const serverChanged = JSON.stringify(config.server) !== JSON.stringify(this.config.server);
    const elsewhere = serverChanged ? undefined : loopbackElsewhere(config);
    if (elsewhere) {
      this.metrics.reloads.inc({ result: 'invalid' });
      this.log.error('configuration reload refused; the current policies keep serving', { file: source, message: elsewhere });
      return false;
    }
    try {
      await this.#ensureContext(config); // issue 15: informers for newly granted kinds
    } catch (error) {
      this.metrics.reloads.inc({ result: 'invalid' });
      this.log.error('configuration reload refused; the current policies keep serving', { file: source, message: errorMessage(error) });
      return false;
    }
    const doneLoading = this.registry.loading();
    const loadStartedAt = Date.now();
    let set: PolicySet;
    try {
      set = await loadPolicySet(this.pool, config, this.#registries(config));
      if (set.failed.length > 0) {
        this.registry.discard(set);
        this.metrics.reloads.inc({ result: 'failed' });
        for (const entry of set.failed) this.log.error('configuration reload refused; the current policies keep serving', { file: source, policy: entry.config.name, code: entry.error?.code, message: entry.error?.message });
        return false;
      }
      let { webhooks } = config;
      if (serverChanged) {
        // The address the webhooks give the apiserver goes with the listener: changed with it, it
        // would send every call to a port nobody listens on until the restart (red team: a
        // reload of server.port and webhooks.url together refused every Pod create).
        const { url, service } = this.config.webhooks;
        const moved = url !== webhooks.url || JSON.stringify(service) !== JSON.stringify(webhooks.service);
        if (moved) webhooks = { ...webhooks, url, service };
        this.log.warn(moved
          ? 'server settings and the webhooks\' url or service changed in the configuration; both take effect on restart'
          : 'server settings changed in the configuration; they take effect on restart', { file: source });
      }
      // Both were taken silently and neither applied (red team 5: logLevel: error, and info lines went on).
      if (config.logLevel !== this.config.logLevel) {
        // Said under whichever of the two levels shows warnings, so that it is seen both ways.
        const say = () => this.log.warn('log level changed by the configuration', { file: source, from: this.config.logLevel, to: config.logLevel });
        const shownBefore = this.log.enabled('warn');
        if (shownBefore) say();
        this.log.level = config.logLevel;
        if (!shownBefore) say();
      }
      if (config.workers !== this.config.workers) {
        this.log.warn('workers changed in the configuration; it takes effect on restart', { file: source, workers: this.pool.size });
      }
      this.config = { ...config, server: this.config.server, webhooks, workers: this.config.workers };
      this.registry.swap(set);
    } finally {
      doneLoading();
    }
    this.#retireLater();
    this.metrics.reloads.inc({ result: 'ok' });
    this.#reportSet(set);
    this.log.info('configuration reloaded', { file: source, policies: set.entries.map((e) => e.config.name) });
    for (const listener of this.#listeners.reload) listener(set);
    this.#pruneCache(loadStartedAt);
    return true;
  }

  /**
   * Prunes the on-disk cache (cache/prune.ts) in the background, keeping what the policy set
   * loaded since `loadStartedAt` used: at once, or, within PRUNE_INTERVAL_MS of the last prune in
   * this process, once that has passed (the latest set's load start then counts).
   */
  #pruneCache(loadStartedAt: number): void {
    if (this.config.cache.maxMiB === 0 || this.#stopping) {
      clearTimeout(this.#pruneTimer);
      this.#pruneTimer = undefined;
      return;
    }
    this.#pruneSince = loadStartedAt;
    if (this.#pruneTimer) return;
    this.#pruneTimer = setTimeout(() => {
      this.#pruneTimer = undefined;
      lastPruneAt = Date.now();
      // Not while a reload loads: it may be about to read what the prune would take.
      this.#pruning = this.#pruning.then(() => this.#reloading?.catch(() => false)).then(() => this.#prune(this.#pruneSince));
    }, Math.max(0, lastPruneAt + PRUNE_INTERVAL_MS - Date.now()));
    this.#pruneTimer.unref();
  }

  async #prune(keepSince: number): Promise<void> {
    // Read now: a reload meanwhile may have turned pruning off.
    const maxMiB = this.config.cache.maxMiB;
    if (maxMiB === 0 || this.#stopping) return;
    const folders = cacheFolders(this.config.registries.cacheDir);
    try {
      const result = await pruneCache({ folders, maxBytes: maxMiB * 2 ** 20, keepSince });
      const fields = { removedFiles: result.removedFiles, removedMiB: mib(result.removedBytes), keptMiB: mib(result.keptBytes), maxMiB, folders };
      if (result.truncated) this.log.warn(`the cache folders hold more than ${PRUNE_MAX_FILES} files, more than this host writes there; not pruned (is registries.cacheDir a folder of its own?)`, { folders });
      if (result.removedFiles > 0) this.log.info('cache pruned: removed the files used least recently', fields);
      if (result.overBudget) {
        this.log.warn('the cache is still above cache.maxMiB: what the current policies use, or what was used within the last hour, is more; raise cache.maxMiB and the cache volume\'s size', { ...fields, failed: result.failed });
      }
    } catch (error) {
      this.log.warn('cannot prune the cache', { folders, message: errorMessage(error) });
    }
  }

  /**
   * Policies (or modes) a reload removed keep being answered until the apiserver stops calling
   * them: the webhook manager calls this after a sync that started after the reload succeeded.
   */
  retireRemovedPolicies(syncStarted: number, marginMs: number): void {
    if (this.registry.retiring.length === 0) return;
    const timer = setTimeout(() => {
      const before = this.registry.retiring;
      this.registry.retire(syncStarted);
      const retired = before.filter((key) => !this.registry.retiring.includes(key));
      if (retired.length > 0) this.log.info('stopped answering removed policies; their webhooks are gone', { endpoints: retired });
    }, marginMs);
    timer.unref();
  }

  /**
   * Without managed webhooks: retire after a grace period. With them, only a sync that removed
   * the webhooks retires (retireRemovedPolicies), however long that takes: a sync that failed
   * (a rule the apiserver refused, RBAC, an unreachable apiserver) left the removed policies' Fail
   * webhooks registered while the host answered them 404 after 30 s, so every request they
   * covered was denied (red team). A replica that does not lead keeps answering them until restart.
   */
  #retireLater(): void {
    if (this.config.webhooks.managed) return;
    const swapped = performance.now();
    const timer = setTimeout(() => this.registry.retire(swapped + 1), this.#retireGraceMs);
    timer.unref();
  }

  /**
   * The start of a shutdown (SIGTERM). The pod is leaving the Service, but the apiserver keeps
   * using its open keep-alive connections to it, and until every kube-proxy has caught up it may
   * still open new ones here: refusing them would fail those calls (denied, with failurePolicy
   * Fail). For `delayMs` the server goes on accepting and answering, /readyz says 503, and
   * every answer closes its connection, so the apiserver's next call opens one to a replica
   * that stays.
   */
  async drain(delayMs: number): Promise<void> {
    this.#startDraining();
    if (delayMs > 0) await new Promise((resolve) => setTimeout(resolve, delayMs));
  }

  #startDraining(): void {
    if (this.#draining) return;
    this.#draining = true;
    for (const cleanup of this.#cleanups.splice(0)) cleanup();
    // Answers being worked on close their connection too. Idle connections are left open: the
    // apiserver may be writing a call on one as it closes, and it does not retry a POST that
    // met EOF (measured: 2 failed calls of ~100 in the e2e test when they were closed here).
    for (const res of this.#open) if (!res.headersSent) res.setHeader('connection', 'close');
  }

  /**
   * Stops accepting, answers the reviews in flight (and any that arrive on a connection still
   * open; each answer closes its connection) for up to `graceMs`, then shuts the sandboxes.
   */
  stop(graceMs = 20_000): Promise<void> {
    this.#stopping ??= (async () => {
      this.#startDraining();
      clearTimeout(this.#pruneTimer);
      // A prune under way ends before the host says it stopped (it never rejects).
      await this.#pruning;
      const closed = new Promise<void>((resolve) => this.#server.close(() => resolve()));
      this.#metricsServer?.close();
      this.#metricsServer?.closeAllConnections();
      this.#server.closeIdleConnections();
      const deadline = Date.now() + graceMs;
      while (this.#open.size > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
      this.#server.closeAllConnections();
      await closed;
      this.#ready = false;
      await this.#cluster?.stop();
      await this.pool.close();
      await this.merger.close();
    })();
    return this.#stopping;
  }

  /**
   * Issue 15: starts informers for the kinds the configuration needs. The Kubernetes client is
   * imported only here, when some kind is needed: it costs about 1 s and 80 MiB.
   */
  async #ensureContext(config: Config): Promise<void> {
    const kinds = kindsToCache(config);
    if (kinds.length === 0) return;
    // Readiness waits for granted kinds only: without a synced Namespace cache, a namespaceSelector
    // is still safe (the policy is evaluated), so missing namespace RBAC must not keep the host unready.
    this.context.require(grantedKinds(config.policies.map((p) => p.context ?? [])));
    if (!this.#cluster) {
      const { ClusterContext } = await import('../context/informers.ts');
      this.#cluster = new ClusterContext(this.context, (level, message, fields) => this.log[level](message, fields));
      this.context.attach(this.pool);
    }
    this.#cluster.ensure(kinds);
  }

  #listen(): Promise<void> {
    const { host, port } = this.config.server;
    return new Promise((resolve, reject) => {
      this.#server.once('error', reject);
      this.#server.listen({ port, host, backlog: LISTEN_BACKLOG }, () => {
        this.#server.off('error', reject);
        // `url` is where this machine reaches it (127.0.0.1 for every address); `on`, the socket's
        // own address (newcomer: in a Pod, "127.0.0.1" read as unreachable from the Service).
        const { address, port: bound } = this.address;
        this.log.info('listening', { url: this.url, on: `${address.includes(':') ? `[${address}]` : address}:${bound}` });
        resolve();
      });
    });
  }

  #reportSet(set: PolicySet): void {
    this.metrics.policies.set({ state: 'loaded' }, set.entries.length - set.failed.length);
    this.metrics.policies.set({ state: 'failed' }, set.failed.length);
    this.metrics.recordPolicies(set);
    for (const entry of set.failed) {
      // Its rules were to come from a module it could not read: it matches every request.
      this.log.error(unscoped(entry.config)
        ? 'policy not loaded, and it has no rules in the configuration: every request on /validate and /mutate (and on its own webhooks\' /validate/<policy>, /mutate/<policy>) fails per its failurePolicy; give it rules or fix its module'
        : 'policy not loaded; requests it matches fail per its failurePolicy', { policy: entry.config.name, failurePolicy: entry.config.failurePolicy, code: entry.error?.code, message: entry.error?.message });
    }
    for (const entry of set.entries) if (entry.loaded) this.log.info('policy loaded', { policy: entry.config.name, kind: entry.loaded.kind, modes: entry.modes, digest: `sha256:${entry.loaded.digest}` });
  }

  #watchConfig(): void {
    const source = this.config.source!;
    const onChange = () => void this.reload();
    // A closed terminal's SIGHUP is a stop, which `portcullis serve` makes; not a reload.
    const onHangup = () => { if (!terminalHungUp()) onChange(); };
    watchFile(source, { interval: 500 }, onChange);
    process.on('SIGHUP', onHangup);
    // The policies' own files too: a module rebuilt in place is served once written (newcomer:
    // answers stayed old until a SIGHUP, which `npm run serve`'s npm took as a reason to stop).
    // A reload keeps the sandbox of every module whose bytes did not change.
    const modules = new Map<string, (now: Stats, before: Stats) => void>();
    const watchModules = () => {
      const wanted = new Set(this.config.policies.map((p) => p.module).filter((m) => isAbsolute(m)));
      for (const [file, listener] of modules) {
        if (wanted.has(file)) continue;
        unwatchFile(file, listener);
        modules.delete(file);
      }
      for (const file of wanted) {
        if (modules.has(file)) continue;
        const listener = (now: Stats, before: Stats) => { if (now.mtimeMs !== before.mtimeMs || now.size !== before.size) onChange(); };
        watchFile(file, { interval: MODULE_POLL_MS }, listener);
        modules.set(file, listener);
      }
    };
    watchModules();
    this.onReload(watchModules);
    this.#cleanups.push(() => {
      unwatchFile(source, onChange);
      process.off('SIGHUP', onHangup);
      for (const [file, listener] of modules) unwatchFile(file, listener);
      modules.clear();
    });
  }

  #watchCertificates(tls: Extract<Config['server']['tls'], { mode: 'files' }>): void {
    const failed = (error: unknown) => this.log.error('TLS certificate reload failed; keeping the current one', { message: errorMessage(error) });
    // Nothing on this path may end the process: a rejection here once did (red team).
    const stop = watchCertificates(tls, (material) => {
      try {
        checkServable(material, calledAs(this.config));
      } catch (error) {
        return failed(error);
      }
      this.useCertificate(material, `file ${tls.certFile}`).catch(failed);
    }, failed);
    this.#cleanups.push(stop);
  }
}

/** A URL's host as a certificate names it: an IPv6 address without the brackets a URL puts around it. */
function hostOf(url: URL): string {
  return url.hostname.replace(/^\[|\]$/g, '');
}

/** The name the apiserver calls this host by, as the managed webhooks say (none when unmanaged). */
function calledAs(config: Config): string[] {
  const { url, service, managed } = config.webhooks;
  if (!managed) return [];
  if (url) return [hostOf(new URL(url))];
  return service ? [`${service.name}.${service.namespace}.svc`] : [];
}

/**
 * Refuses a configuration that must not start (a ConfigError saying why). `serve` calls it before
 * anything reaches the cluster too: newcomer (session 50), a replica whose port did not match its
 * webhooks.url wrote a new CA into the shared Secret, then refused to start.
 */
export async function checkStartable(config: Config): Promise<void> {
  const refused = loopbackElsewhere(config) ?? await missingModules(config.policies);
  if (refused) throw new ConfigError(refused);
}

/**
 * Why the managed webhooks would call this machine on a port the host does not listen on:
 * `serve --port P` moved the listener and not webhooks.url, and every call the apiserver made
 * was refused, Pods with them, while /readyz said ready (red team). Only a loopback URL is known
 * to be this machine; another name may reach it through a proxy or a Service's port mapping.
 * Port 0 (any free port, tests) has no port to compare.
 */
function loopbackElsewhere(config: Config): string | undefined {
  const { managed, url } = config.webhooks;
  const { port } = config.server;
  if (!managed || !url || port === 0) return undefined;
  const target = new URL(url);
  const host = hostOf(target);
  const loopback = host === 'localhost' || host === '::1' || /^127\.\d+\.\d+\.\d+$/.test(host);
  const called = Number(target.port || 443);
  if (!loopback || called === port) return undefined;
  return `webhooks.url (${url}) sends the apiserver's calls to port ${called} of this machine, but the host listens on port ${port} ` +
    '(server.port or --port): they would all fail, and with them every request a Fail webhook covers. Give both the same port.';
}
