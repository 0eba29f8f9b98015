// The set of policies a server evaluates, loaded from one configuration. A reload builds a
// new set beside the current one and swaps them in one assignment: a review holds the set it
// started with until it answers, and the old set's sandboxes are unloaded only once every
// review that holds it has finished.
import type { Mode } from '@portcullis/sdk';
import type { Config, PolicyConfig } from '../config/types.ts';
import { errorMessage, PolicyLoadError, PortcullisError } from '../errors.ts';
import type { SandboxPool } from '../sandbox/pool.ts';
import { sha256 } from '../util/files.ts';
import { loadPolicy, refusedPolicyFacts, unloadIfCreated } from './load.ts';
import type { LoadedPolicy } from './loaded.ts';
import { readModule, type RegistryOptions } from './source.ts';

export interface PolicyEntry {
  config: PolicyConfig;
  modes: Mode[];
  /** Present when the policy loaded; otherwise `error` says why it did not. */
  loaded?: LoadedPolicy;
  /** Kept as the typed error so /readyz and metrics can say which code made it fail. */
  error?: PortcullisError;
}

export class PolicySet {
  readonly entries: PolicyEntry[];
  readonly byName: Map<string, PolicyEntry>;
  #holders = 0;
  #onDrained: (() => void)[] = [];

  constructor(entries: PolicyEntry[]) {
    this.entries = entries;
    this.byName = new Map(entries.map((e) => [e.config.name, e]));
  }

  get failed(): PolicyEntry[] {
    return this.entries.filter((e) => !e.loaded);
  }

  hold(): void {
    this.#holders++;
  }

  release(): void {
    if (--this.#holders === 0) for (const done of this.#onDrained.splice(0)) done();
  }

  drained(): Promise<void> {
    return this.#holders === 0 ? Promise.resolve() : new Promise((resolve) => this.#onDrained.push(resolve));
  }

  keys(): Set<string> {
    return new Set(this.entries.flatMap((e) => (e.loaded ? [e.loaded.key] : [])));
  }
}

/** Loads every policy of a configuration in parallel; one policy's failure does not stop the rest. */
export async function loadPolicySet(pool: SandboxPool, config: Config, registries: RegistryOptions = config.registries): Promise<PolicySet> {
  // Issue 14: how many workers each policy gets depends on how many there are (pool.ts, placement).
  pool.plan(config.policies.length, config.instancesPerPolicy > 0 ? config.instancesPerPolicy : undefined);
  const entries = await Promise.all(config.policies.map((policy) => loadEntry(pool, policy, registries)));
  return new PolicySet(entries);
}

async function loadEntry(pool: SandboxPool, config: PolicyConfig, registries: RegistryOptions): Promise<PolicyEntry> {
  try {
    let bytes: Uint8Array;
    try {
      bytes = await readModule(config.module, config.limits.maxModuleMiB * 2 ** 20, registries);
    } catch (error) {
      throw new PolicyLoadError(config.name, errorMessage(error), { cause: error });
    }
    if (config.digest && `sha256:${sha256(bytes)}` !== config.digest) {
      // Outsider: the digest `portcullis push` prints for the reference (the manifest's) was pasted here.
      const manifest = config.module.startsWith('oci://')
        ? ' (`digest:` pins the .wasm file\'s own sha256, as `portcullis inspect` prints it, not the manifest digest `portcullis push` prints)' : '';
      throw new PolicyLoadError(config.name, `its module ${config.module} has digest sha256:${sha256(bytes)}, not the pinned ${config.digest}${manifest}; refusing it`);
    }
    const loaded = await loadPolicy(pool, { ...config }, bytes);
    const modes = config.modes ?? loaded.modes;
    const missing = modes.filter((m) => !loaded.modes.includes(m));
    if (missing.length > 0) {
      unloadIfCreated(pool, loaded);
      throw new PolicyLoadError(config.name, `it is configured to ${missing.join(' and ')} but the module only supports ${loaded.modes.join(', ')}`);
    }
    // Rules the file leaves out come from the module: a configuration entry can be just
    // name + module + settings.
    const rules = loaded.info?.rules;
    const effective = config.rulesGiven === false && rules ? { ...config, rules } : config;
    return { config: effective, modes, loaded };
  } catch (error) {
    const failure = error instanceof PortcullisError ? error : new PolicyLoadError(config.name, errorMessage(error), { cause: error });
    // Refused settings: the module said what it does, so it fails only the requests it would see.
    const facts = refusedPolicyFacts(error);
    const effective = config.rulesGiven === false && facts?.rules ? { ...config, rules: facts.rules } : config;
    return { config: effective, modes: config.modes ?? facts?.modes ?? ['validate', 'mutate'], error: failure };
  }
}

/** A policy (or one mode of it) that a reload removed but that is still answered for a while. */
interface Retiring {
  entry: PolicyEntry;
  /** performance.now() of the swap that removed it. */
  since: number;
}

/**
 * Holds the current set and swaps in new ones. A reload that removes a policy, or one of its
 * modes, does not stop answering it at once: the apiserver keeps calling its webhook until it
 * sees the webhook's removal, and a 404 then fails requests of a `Fail` webhook. Such entries
 * retire (and their sandboxes go) once a webhook sync that started after the reload has
 * succeeded, or after a grace period.
 */
export class PolicyRegistry {
  #current: PolicySet;
  readonly #pool: SandboxPool;
  readonly #retiring = new Map<string, Retiring>();
  /**
   * Sets being loaded (see loading()), and the sandboxes left unused meanwhile: they go once
   * no set is loading. A loading set may share a sandbox with a set that drains meanwhile (a
   * reload back to settings an older, still-draining set has): red team, a config change and
   * its revert 1.5 s apart, beside a looping policy that kept the older set held; its drain
   * unloaded the sandbox the reverted set was about to serve, and every call of that policy
   * then failed as not loaded, until the next reload.
   */
  #loading = 0;
  readonly #deferred = new Set<string>();
  /**
   * Sets swapped out whose reviews still run: their sandboxes stay until they drain, whatever
   * another set's drain or a refused reload's discard decides (review: A, then B with the same
   * sandbox, then C without it; B drained before A and unloaded what A's reviews still called).
   */
  readonly #draining = new Set<PolicySet>();

  constructor(pool: SandboxPool, initial: PolicySet) {
    this.#pool = pool;
    this.#current = initial;
  }

  get current(): PolicySet {
    return this.#current;
  }

  /** Names of the policies still answered after a reload removed them (for /readyz and logs). */
  get retiring(): string[] {
    return [...this.#retiring.keys()];
  }

  /** The entry that answers `/<mode>/<name>`: the current one, else one that is retiring. */
  lookup(name: string, mode: Mode): PolicyEntry | undefined {
    const entry = this.#current.byName.get(name);
    if (entry && entry.modes.includes(mode)) return entry;
    return this.#retiring.get(`${mode}/${name}`)?.entry;
  }

  /** Makes `next` current; the old set's sandboxes not used by `next` go once it drains and retires. */
  swap(next: PolicySet): void {
    const previous = this.#current;
    this.#current = next;
    const since = performance.now();
    for (const entry of previous.entries) {
      if (!entry.loaded) continue;
      const successor = next.byName.get(entry.config.name);
      for (const mode of entry.modes) {
        const key = `${mode}/${entry.config.name}`;
        if (successor?.modes.includes(mode)) this.#retiring.delete(key);
        else this.#retiring.set(key, { entry, since });
      }
    }
    this.#draining.add(previous);
    void previous.drained().then(() => {
      this.#draining.delete(previous);
      this.#unloadUnused(previous.keys());
    });
  }

  /**
   * Marks a set being loaded until the returned function is called, after the set was swapped
   * in or discarded: until then no sandbox is unloaded, since the set may share it.
   */
  loading(): () => void {
    this.#loading++;
    let ended = false;
    return () => {
      if (ended) return;
      ended = true;
      if (--this.#loading > 0) return;
      const keys = [...this.#deferred];
      this.#deferred.clear();
      this.#unloadUnused(keys);
    };
  }

  /** Stops answering what reloads removed before `before` (a performance.now() time). */
  retire(before = Infinity): void {
    const gone = new Set<string>();
    for (const [key, { entry, since }] of this.#retiring) {
      if (since >= before) continue;
      this.#retiring.delete(key);
      if (entry.loaded) gone.add(entry.loaded.key);
    }
    this.#unloadUnused(gone);
  }

  /** Discards a set that was loaded but never made current. */
  discard(set: PolicySet): void {
    this.#unloadUnused(set.keys());
  }

  #unloadUnused(keys: Iterable<string>): void {
    if (this.#loading > 0) {
      for (const key of keys) this.#deferred.add(key);
      return;
    }
    const keep = this.#current.keys();
    for (const { entry } of this.#retiring.values()) if (entry.loaded) keep.add(entry.loaded.key);
    for (const set of this.#draining) for (const key of set.keys()) keep.add(key);
    for (const key of keys) if (!keep.has(key)) this.#pool.unload(key);
  }
}
