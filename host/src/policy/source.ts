// Where policy bytes come from: a path or file:// URL here; oci:// references are resolved
// by the registry fetcher when it is configured (see fetchers registered below).
import { readFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';

export type ModuleFetcher = (reference: string) => Promise<Uint8Array>;

const fetchers = new Map<string, ModuleFetcher>();

/** Lets another module (the OCI client) serve a URL scheme such as "oci:". */
export function registerFetcher(scheme: string, fetcher: ModuleFetcher): void {
  fetchers.set(scheme, fetcher);
}

export async function readModule(reference: string): Promise<Uint8Array> {
  const scheme = /^([a-z][a-z0-9+.-]*):\/\//i.exec(reference)?.[1]?.toLowerCase();
  if (scheme && scheme !== 'file') {
    const fetcher = fetchers.get(scheme);
    if (!fetcher) throw new Error(`no fetcher for "${scheme}://" references (use a file path or file:// URL)`);
    return fetcher(reference);
  }
  const path = scheme === 'file' ? fileURLToPath(reference) : reference;
  try {
    return new Uint8Array(await readFile(path));
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') throw new Error(`${path} does not exist`);
    if (code === 'EISDIR') throw new Error(`${path} is a directory, not a .wasm file`);
    if (code === 'EACCES') throw new Error(`${path} is not readable`);
    throw error;
  }
}
