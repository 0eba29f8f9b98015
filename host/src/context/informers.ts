// Watches the granted kinds with @kubernetes/client-node informers and feeds a ContextHub.
// Imported only when some policy has grants (or the single webhook needs namespace labels):
// the Kubernetes client costs about 1 s and 80 MiB to load.
//
// Freshness: an informer lists a kind once, then follows its watch stream, so the cache trails
// the apiserver by the watch latency (milliseconds in a healthy cluster). If the watch breaks,
// the cache keeps serving the last state it saw while the informer re-lists and re-watches
// (client-node backs off up to 30 s; we restart a failed list after RETRY_MS).
import {
  HttpMethod, KubeConfig, KubernetesObjectApi, ListWatch, RequestContext, Watch, type KubernetesListObject, type KubernetesObject,
} from '@kubernetes/client-node';
import { fetch } from 'undici';
import type { JsonObject } from '@portcullis/sdk';
import { errorMessage, PortcullisError } from '../errors.ts';
import type { Fields } from '../util/log.ts';
import { describeGrant, kindKey, type Grant } from './grants.ts';
import type { ContextHub } from './hub.ts';
import { toEntry } from './store.ts';
import { defaultKubeConfigFound } from '../util/kubeconfig.ts';

const RETRY_MS = 5_000;

export class ContextCacheError extends PortcullisError {
  constructor(message: string, options?: { cause?: unknown }) {
    super('CONTEXT_CACHE_FAILED', message, options);
  }
}

export type ContextLog = (level: 'info' | 'warn' | 'error', message: string, fields: Fields) => void;

/** client-node keeps the discovery lookup protected; this exposes it to map a kind to its plural. */
class Discovery extends KubernetesObjectApi {
  async plural(apiVersion: string, kind: string): Promise<{ name: string; namespaced: boolean } | undefined> {
    const resource = await this.resource(apiVersion, kind);
    return resource ? { name: resource.name, namespaced: resource.namespaced } : undefined;
  }
}

interface Running {
  stop(): Promise<void>;
}

export class ClusterContext {
  readonly #hub: ContextHub;
  readonly #log: ContextLog;
  readonly #kc: KubeConfig;
  readonly #api: Discovery;
  #running = new Map<string, Running>();
  #stopped = false;

  constructor(hub: ContextHub, log: ContextLog, kubeconfig?: string) {
    this.#hub = hub;
    this.#log = log;
    this.#kc = new KubeConfig();
    try {
      if (kubeconfig) this.#kc.loadFromFile(kubeconfig);
      else this.#kc.loadFromDefault();
    } catch (error) {
      const why = errorMessage(error);
      throw new ContextCacheError(`cannot load Kubernetes credentials for context grants: ${why}; set KUBECONFIG or run in a Pod`, { cause: error });
    }
    if (!this.#kc.getCurrentCluster() || (!kubeconfig && !defaultKubeConfigFound())) {
      throw new ContextCacheError(
        'policies have context grants but no Kubernetes cluster is configured: set KUBECONFIG, or run in a Pod with a ServiceAccount',
      );
    }
    this.#api = this.#kc.makeApiClient(Discovery);
  }

  /** Starts an informer for every kind not watched yet. Returns at once; readiness follows the hub. */
  ensure(kinds: readonly Grant[]): void {
    for (const grant of kinds) {
      const key = kindKey(grant.apiVersion, grant.kind);
      if (this.#running.has(key)) continue;
      // Known at once, unsynced: reads get a temporary error and /readyz waits.
      this.#hub.apply({ type: 'context', op: 'reset', kind: key, entries: [], synced: false });
      const running: Running = { stop: async () => {} };
      this.#running.set(key, running);
      void this.#start(grant, key, running);
    }
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    await Promise.all([...this.#running.values()].map((r) => r.stop().catch(() => {})));
  }

  async #start(grant: Grant, key: string, running: Running): Promise<void> {
    const { apiVersion, kind } = grant;
    let resource;
    try {
      resource = await this.#api.plural(apiVersion, kind);
    } catch (error) {
      this.#log('error', 'context: cannot discover a granted kind; retrying', { grant: describeGrant(grant), message: errorMessage(error) });
      return this.#retry(grant, key, running);
    }
    if (!resource) {
      const message = 'context: the cluster does not serve a granted kind; reads of it fail with a temporary error until it does';
      this.#log('error', message, { grant: describeGrant(grant) });
      return this.#retry(grant, key, running);
    }
    const path = `${apiVersion.includes('/') ? '/apis' : '/api'}/${apiVersion}/${resource.name}`;
    const stamp = (object: KubernetesObject): JsonObject => {
      // managedFields are large and no policy needs them; list items also come without kind.
      const copy = JSON.parse(JSON.stringify(object)) as JsonObject;
      const metadata = copy.metadata;
      if (typeof metadata === 'object' && metadata !== null && !Array.isArray(metadata)) delete metadata.managedFields;
      return { ...copy, apiVersion, kind };
    };
    // ListWatch rather than makeInformer: it exposes latestResourceVersion, which tells a real sync from a failed list.
    const informer = new ListWatch(path, new Watch(this.#kc), () => this.#rawList(path), false);
    const upsert = (object: KubernetesObject) => {
      const entry = toEntry(stamp(object));
      if (entry) this.#hub.apply({ type: 'context', op: 'upsert', kind: key, entry });
    };
    informer.on('add', upsert);
    informer.on('update', upsert);
    informer.on('delete', (object) => {
      const meta = object.metadata;
      if (meta?.name) this.#hub.apply({ type: 'context', op: 'delete', kind: key, namespace: meta.namespace ?? '', name: meta.name });
    });
    informer.on('error', (error: unknown) => {
      if (this.#stopped) return;
      const message = 'context: list or watch failed; retrying (reads answer from the last state seen, or fail as temporary before the first sync)';
      this.#log('warn', message, { grant: describeGrant(grant), message: errorMessage(error) });
      setTimeout(() => {
        if (!this.#stopped) void informer.start().then(() => this.#markSynced(informer.latestResourceVersion(), key, grant));
      }, RETRY_MS).unref();
    });
    running.stop = () => informer.stop();
    if (this.#stopped) return;
    await informer.start();
    this.#markSynced(informer.latestResourceVersion(), key, grant);
  }

  /**
   * The informer's list, as the apiserver sent it. KubernetesObjectApi.list would deserialize
   * built-in kinds into client-node's models (timestamps become Dates, unknown fields are
   * dropped), so listed objects would differ from the raw objects the watch delivers.
   */
  async #rawList(path: string): Promise<KubernetesListObject<KubernetesObject>> {
    const context = new RequestContext(`${this.#kc.getCurrentCluster()!.server}${path}`, HttpMethod.GET);
    await this.#kc.applySecurityAuthentication(context);
    const response = await fetch(context.getUrl(), { method: 'GET', headers: context.getHeaders(), dispatcher: context.getDispatcher() });
    if (response.status !== 200) {
      const body = (await response.text()).slice(0, 300);
      const hint = response.status === 403 ? " (RBAC: 'portcullis rbac --config FILE' prints what it needs)" : '';
      throw new ContextCacheError(`listing ${path} answered HTTP ${response.status}${hint}: ${body}`);
    }
    return (await response.json()) as KubernetesListObject<KubernetesObject>;
  }

  #markSynced(resourceVersion: string, key: string, grant: Grant): void {
    // start() also returns after a failed list (it reports the error instead); only a list
    // that produced a resourceVersion makes the cache usable.
    if (resourceVersion === '' || this.#hub.store.synced(grant.apiVersion, grant.kind) === true) return;
    this.#hub.apply({ type: 'context', op: 'synced', kind: key, synced: true });
    const objects = [...this.#hub.store.entries(grant.apiVersion, grant.kind)].length;
    this.#log('info', 'context: cache synced', { grant: describeGrant(grant), objects });
  }

  #retry(grant: Grant, key: string, running: Running): void {
    const timer = setTimeout(() => {
      if (!this.#stopped) void this.#start(grant, key, running);
    }, RETRY_MS);
    timer.unref();
    running.stop = () => Promise.resolve(clearTimeout(timer));
  }
}
