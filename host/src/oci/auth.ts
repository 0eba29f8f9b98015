// Who we are to a registry: credentials from a docker config.json (the file `docker login`
// and `oras login` write), and the WWW-Authenticate challenge that says how to present them.
import { errorMessage } from '../errors.ts';
import { readRegularFile } from '../util/files.ts';
import { RegistryError } from './errors.ts';

/** A docker config.json holds a few credentials; megabytes of it are a mistake or an attack. */
const MAX_DOCKER_CONFIG_BYTES = 4 * 2 ** 20;

export interface Credentials {
  username: string;
  password: string;
}

export interface CredentialLookup {
  credentials: Credentials | undefined;
  /** The config file consulted, named in "check your credentials" messages. */
  source: string;
  /** Set when the file defers to credential helpers, which we do not run: said in 401 messages. */
  helpers: boolean;
}

interface DockerConfig {
  auths?: Record<string, { auth?: string; username?: string; password?: string }>;
  credsStore?: string;
  credHelpers?: Record<string, string>;
}

/**
 * Finds credentials for `registry` in a docker config.json. A missing file is "anonymous"
 * unless the user named it explicitly (then it is a mistake worth stopping for).
 */
export async function lookupCredentials(path: string, registry: string, explicit: boolean): Promise<CredentialLookup> {
  let config: DockerConfig;
  try {
    // A regular file of sane size: a FIFO held the pull, /dev/zero grew the host (red team).
    config = JSON.parse(Buffer.from(await readRegularFile(path, MAX_DOCKER_CONFIG_BYTES)).toString('utf8')) as DockerConfig;
  } catch (error) {
    const missing = (error as NodeJS.ErrnoException).code === 'ENOENT';
    if (missing && !explicit) return { credentials: undefined, source: path, helpers: false };
    throw new RegistryError('REGISTRY_UNAUTHORIZED', `cannot use docker config ${path}: ${missing ? 'no such file' : errorMessage(error)}`);
  }
  const helpers = Boolean(config.credsStore || config.credHelpers?.[registry]);
  for (const [key, entry] of Object.entries(config.auths ?? {})) {
    if (!sameRegistry(key, registry) || !entry) continue;
    if (entry.username && entry.password) return { credentials: { username: entry.username, password: entry.password }, source: path, helpers };
    if (entry.auth) {
      const decoded = Buffer.from(entry.auth, 'base64').toString('utf8');
      const colon = decoded.indexOf(':');
      if (colon > 0) return { credentials: { username: decoded.slice(0, colon), password: decoded.slice(colon + 1) }, source: path, helpers };
      throw new RegistryError('REGISTRY_UNAUTHORIZED', `docker config ${path}: the "auth" of ${key} is not base64 of user:password`);
    }
  }
  return { credentials: undefined, source: path, helpers };
}

// `docker login` writes keys as "host", "https://host" or (Docker Hub) "https://index.docker.io/v1/".
function sameRegistry(key: string, registry: string): boolean {
  const host = key.replace(/^[a-z]+:\/\//i, '').replace(/\/.*$/, '').toLowerCase();
  return host === registry || (isDockerHub(host) && isDockerHub(registry));
}

function isDockerHub(host: string): boolean {
  return host === 'docker.io' || host === 'index.docker.io' || host === 'registry-1.docker.io';
}

export function basicAuthorization(credentials: Credentials): string {
  return `Basic ${Buffer.from(`${credentials.username}:${credentials.password}`).toString('base64')}`;
}

export interface Challenge {
  scheme: 'bearer' | 'basic';
  params: Record<string, string>;
}

/** Parses `Bearer realm="…",service="…",scope="…"` (or Basic); other schemes are not ours to answer. */
export function parseChallenge(header: string | string[] | undefined): Challenge | undefined {
  const values = Array.isArray(header) ? header : header ? [header] : [];
  for (const value of values) {
    const match = /^\s*(bearer|basic)\b\s*(.*)$/i.exec(value);
    if (!match) continue;
    const params: Record<string, string> = {};
    for (const [, key, quoted, bare] of match[2]!.matchAll(/([A-Za-z_][\w-]*)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]*))/g)) {
      params[key!.toLowerCase()] = quoted !== undefined ? quoted.replace(/\\(.)/g, '$1') : (bare ?? '');
    }
    return { scheme: match[1]!.toLowerCase() as Challenge['scheme'], params };
  }
  return undefined;
}
