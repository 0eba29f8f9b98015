// Where policy bytes come from: a path or file:// URL is read from disk; an oci:// reference
// is pulled (and cached) by the OCI client in ../oci, loaded only when first needed.
import { readFile, stat } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';

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

let registries: RegistryOptions = { insecure: [] };

/** Set once at start (serve, run) from the configuration's `registries`. */
export function configureRegistries(options: RegistryOptions): void {
  registries = options;
}

/** Reads a policy module; a file larger than `maxBytes` is refused before it is read. */
export async function readModule(reference: string, maxBytes = Infinity): Promise<Uint8Array> {
  const scheme = /^([a-z][a-z0-9+.-]*):\/\//i.exec(reference)?.[1]?.toLowerCase();
  if (scheme === 'oci') {
    const { fetchOciModule } = await import('../oci/fetcher.ts');
    const registry = reference.slice('oci://'.length).split('/')[0] ?? '';
    try {
      const bytes = await fetchOciModule(reference, registries);
      registries.onPull?.(registry, 'ok');
      return bytes;
    } catch (error) {
      registries.onPull?.(registry, 'failed');
      throw error;
    }
  }
  if (scheme && scheme !== 'file') throw new Error(`"${scheme}://" is not a supported module location (use a path, file:// or oci://)`);
  const path = scheme === 'file' ? fileURLToPath(reference) : reference;
  try {
    const { size } = await stat(path);
    if (size > maxBytes) {
      throw new Error(`${path} is ${Math.round((size / 2 ** 20) * 10) / 10} MiB, above limits.maxModuleMiB (${maxBytes / 2 ** 20} MiB)`);
    }
    return new Uint8Array(await readFile(path));
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') throw new Error(`${path} does not exist`);
    if (code === 'EISDIR') throw new Error(`${path} is a directory, not a .wasm file`);
    if (code === 'EACCES') throw new Error(`${path} is not readable`);
    throw error;
  }
}
