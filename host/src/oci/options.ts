// Where the OCI client's settings come from: the configuration's `registries` (or CLI flags),
// then environment fallbacks for commands that have no configuration file (`portcullis run`):
//   PORTCULLIS_INSECURE_REGISTRIES  comma-separated host[:port] allowed over plain HTTP
//   PORTCULLIS_REGISTRY_CA          a PEM file of an extra CA to trust (private registries, tests)
//   DOCKER_CONFIG                   directory of config.json, as for docker itself
import { readFile } from 'node:fs/promises';
import { homedir } from 'node:os';
import { join } from 'node:path';
import { DEFAULT_LIMITS } from '../config/limits.ts';
import { errorMessage } from '../errors.ts';
import { cacheDir } from '../util/files.ts';
import { lookupCredentials } from './auth.ts';
import { RegistryClient, type Timeouts } from './client.ts';
import { RegistryError } from './errors.ts';
import type { OciReference } from './reference.ts';

export interface RegistryOptions {
  /** Registries (host[:port]) that may be reached over plain HTTP. */
  insecure: string[];
  /** A docker config.json with `auths`; default $DOCKER_CONFIG/config.json or ~/.docker/config.json. */
  dockerConfig?: string;
  /** Content-addressed blob cache; default <PORTCULLIS_CACHE or ~/.cache/portcullis>/oci. */
  cacheDir?: string;
  /** Where the OCI client reports what it did (e.g. "registry down, starting from cache"). */
  log?: (level: 'info' | 'warn', message: string, fields?: Record<string, string>) => void;
  /** Told of every oci:// module fetch (served from the cache or pulled), for metrics. */
  onPull?: (registry: string, result: 'ok' | 'failed') => void;
}

/** RegistryOptions plus what only this module and its tests need. */
export type OciOptions = RegistryOptions & {
  /** Extra CA (PEM text) to trust besides the usual roots. */
  ca?: string;
  /** The largest module layer pulled; default limits.maxModuleMiB's default (the CLI has no configuration). */
  maxModuleBytes?: number;
  /** What raises maxModuleBytes, for the message refusing a layer: "limits.maxModuleMiB", a CLI flag. */
  maxModuleSetting?: string;
  /** Whole-request deadlines (client.ts DEFAULT_TIMEOUTS); tests make them short. */
  timeouts?: Timeouts;
};

export interface OciSettings {
  insecure: string[];
  dockerConfig: string;
  /** A config named by the user must exist; the default one may be absent (anonymous). */
  dockerConfigExplicit: boolean;
  cacheDir: string;
  ca: string | undefined;
  log: NonNullable<RegistryOptions['log']>;
  moduleLimit: ModuleLimit;
  timeouts: Timeouts | undefined;
}

export interface ModuleLimit {
  maxBytes: number;
  setting: string;
}

export async function resolveOptions(options: OciOptions, env: NodeJS.ProcessEnv = process.env): Promise<OciSettings> {
  const fromEnv = (env.PORTCULLIS_INSECURE_REGISTRIES ?? '').split(',');
  const caFile = env.PORTCULLIS_REGISTRY_CA;
  let ca = options.ca;
  if (!ca && caFile) {
    try {
      ca = await readFile(caFile, 'utf8');
    } catch (error) {
      throw new RegistryError('REGISTRY_TLS', `cannot read PORTCULLIS_REGISTRY_CA ${caFile}: ${errorMessage(error)}`);
    }
  }
  return {
    insecure: [...options.insecure, ...fromEnv].map(normaliseHost).filter(Boolean),
    dockerConfig: options.dockerConfig ?? join(env.DOCKER_CONFIG ?? join(homedir(), '.docker'), 'config.json'),
    dockerConfigExplicit: options.dockerConfig !== undefined,
    cacheDir: options.cacheDir ?? join(cacheDir(), 'oci'),
    ca,
    timeouts: options.timeouts,
    moduleLimit: { maxBytes: options.maxModuleBytes ?? DEFAULT_LIMITS.maxModuleMiB * 2 ** 20, setting: options.maxModuleSetting ?? 'limits.maxModuleMiB' },
    log: options.log ?? ((level, message) => {
      // Without a logger (portcullis run), a fallback to the cache must still be visible.
      if (level === 'warn') process.stderr.write(`portcullis: warning: ${message}\n`);
    }),
  };
}

/** "host:port" matches itself; a bare "host" in the list matches that host on any port. */
export function isInsecure(settings: OciSettings, registry: string): boolean {
  const host = registry.replace(/:\d+$/, '');
  return settings.insecure.some((entry) => entry === registry || entry === host);
}

export async function openClient(ref: OciReference, settings: OciSettings, actions: 'pull' | 'pull,push'): Promise<RegistryClient> {
  const credentials = await lookupCredentials(settings.dockerConfig, ref.registry, settings.dockerConfigExplicit);
  return new RegistryClient({
    registry: ref.registry, repository: ref.repository, credentials, actions,
    insecure: isInsecure(settings, ref.registry), insecureHost: (host) => isInsecure(settings, host),
    ...(settings.ca ? { ca: settings.ca } : {}), ...(settings.timeouts ? { timeouts: settings.timeouts } : {}),
  });
}

function normaliseHost(entry: string): string {
  return entry.trim().toLowerCase().replace(/^[a-z]+:\/\//, '').replace(/\/.*$/, '');
}
