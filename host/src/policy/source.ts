// Where policy bytes come from: a path or file:// URL is read from disk; an oci:// reference
// is pulled (and cached) by the OCI client in ../oci, loaded only when first needed.
import { readFile, stat } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import type { RegistryOptions } from '../oci/options.ts';

export type { RegistryOptions };


/**
 * Reads a policy module; a file larger than `maxBytes` is refused before it is read. oci://
 * references are pulled with `registries` (from the configuration or the CLI's flags; the
 * OCI layer adds its environment fallbacks).
 */
export async function readModule(reference: string, maxBytes = Infinity, registries: RegistryOptions = { insecure: [] }): Promise<Uint8Array> {
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
