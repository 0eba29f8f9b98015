// Where policy bytes come from: a path or file:// URL is read from disk; an oci:// reference
// is pulled (and cached) by the OCI client in ../oci, loaded only when first needed.
import { lstat, readdir, readlink, stat } from 'node:fs/promises';
import { basename, dirname, isAbsolute } from 'node:path';
import type { Stats } from 'node:fs';
import { fileURLToPath } from 'node:url';
import type * as Fetcher from '../oci/fetcher.ts';
import { readAtMost } from '../util/files.ts';
import type { RegistryOptions } from '../oci/options.ts';
import type { PolicyConfig } from '../config/types.ts';
import { unscoped } from '../config/selectors.ts';

export type { RegistryOptions };

/**
 * The name a policy gets from its module when none is given: the file's, or the repository's
 * (`oci://reg/team/p:v1` and `…/p@sha256:…` are "p", as a configuration would name them;
 * newcomer: the CLI named it "p:v1").
 */
export function policyNameOf(module: string): string {
  const last = module.replace(/^.*[\\/]/, '');
  return module.startsWith('oci://') ? last.replace(/[@:].*$/, '') : last.replace(/\.wasm$/, '');
}

/**
 * Why `serve` should not start: unscoped policies (config/selectors.ts) whose module is a path that
 * does not exist. Their rules were to come from the module, so their webhooks would fail every
 * request they are sent (newcomer: a typo in a path denied ConfigMap creates and Pod deletes cluster-wide). One whose
 * entry scopes it fails only what it covers, and is served failed as before (a module that
 * appears later is loaded by the file watcher). undefined when there is none.
 */
export async function missingModules(policies: readonly PolicyConfig[]): Promise<string | undefined> {
  const missing: string[] = [];
  for (const { name, module } of policies.filter(unscoped)) {
    if (!isAbsolute(module)) continue; // oci:// (config paths are made absolute when loaded)
    const problem = await lstat(module).then(
      (info) => info.isSymbolicLink()
        ? stat(module).then(() => undefined, async () => `is a link to ${await readlink(module).catch(() => '?')}, which does not exist`)
        : undefined,
      (error: NodeJS.ErrnoException) => error.code === 'ENOENT' ? 'does not exist' : undefined,
    );
    if (problem === undefined) continue;
    const near = await readdir(dirname(module)).then((files) => files.filter((f) => f.endsWith('.wasm')).slice(0, 5), (error: NodeJS.ErrnoException) => error.code);
    const hint = near === 'ENOENT' ? `; its folder ${dirname(module)} does not exist either`
      : Array.isArray(near) && near.length > 0 && !near.includes(basename(module)) ? `; that folder has ${near.join(', ')}` : '';
    missing.push(`policy "${name}": its module ${module} ${problem}${hint}`);
  }
  if (missing.length === 0) return undefined;
  return `${missing.join('; ')}. Fix the path, or build the policy first: the host does not start with a module path that does not exist ` +
    'for a policy whose entry has no rules, match or selectors (its webhooks would fail every request they are sent)';
}

/**
 * Reads a policy module; a file larger than `maxBytes` is refused before it is read. oci://
 * references are pulled with `registries` (from the configuration or the CLI's flags; the
 * OCI layer adds its environment fallbacks).
 */
export async function readModule(reference: string, maxBytes = Infinity, registries: RegistryOptions = { insecure: [] }): Promise<Uint8Array> {
  const scheme = /^([a-z][a-z0-9+.-]*):\/\//i.exec(reference)?.[1]?.toLowerCase();
  if (scheme === 'oci') {
    const { fetchOciModule } = oci ??= await import('../oci/fetcher.ts');
    const registry = reference.slice('oci://'.length).split('/')[0] ?? '';
    try {
      // The limit is applied before and while downloading, not after (red team: a 1 GiB layer
      // was read whole, cached, and only then refused by the sandbox's size check).
      const bytes = await fetchOciModule(reference, { ...registries, ...(Number.isFinite(maxBytes) ? { maxModuleBytes: maxBytes } : {}) });
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
    const info = await stat(path);
    // A FIFO, a device or a socket says size 0 and may never end: /dev/zero filled gigabytes,
    // and a FIFO held the load (and every reload after it) forever (red team).
    if (!info.isFile()) throw new Error(`${path} is not a regular file (a ${kindOf(info)}); a policy module must be a file`);
    const tooLarge = (size?: number) => new Error(`${path} is ${size === undefined ? 'larger than' : `${Math.round((size / 2 ** 20) * 10) / 10} MiB, above`} limits.maxModuleMiB (${maxBytes / 2 ** 20} MiB)`);
    if (info.size > maxBytes) throw tooLarge(info.size);
    // Read no more than the limit allows, whatever the size said (a file that grows, or one in
    // /proc that says 0).
    return await readAtMost(path, maxBytes, tooLarge);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') throw new Error(`${path} does not exist`);
    if (code === 'EISDIR') throw new Error(`${path} is a directory, not a .wasm file`);
    if (code === 'EACCES') throw new Error(`${path} is not readable`);
    throw error;
  }
}

// Loaded with the first oci:// module: a host with none never loads undici.
let oci: typeof Fetcher | undefined;

/** Ends the registry requests under way (shutdown): a stalled registry must not keep the process alive. */
export function abandonModuleFetches(): void {
  oci?.abandonRegistryRequests();
}

function kindOf(info: Stats): string {
  if (info.isDirectory()) return 'directory';
  if (info.isFIFO()) return 'FIFO';
  if (info.isCharacterDevice() || info.isBlockDevice()) return 'device';
  if (info.isSocket()) return 'socket';
  return 'special file';
}
