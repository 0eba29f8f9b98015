// Small helpers every layer shares: where Portcullis caches things on disk, how it writes there,
// and content digests.
import { createHash, randomUUID } from 'node:crypto';
import { mkdir, rename, rm, utimes, writeFile } from 'node:fs/promises';
import { homedir } from 'node:os';
import { dirname, join, resolve } from 'node:path';

/** The root of every on-disk cache (pulled modules, transpiled components). */
export function cacheDir(): string {
  return process.env.PORTCULLIS_CACHE ?? join(homedir(), '.cache', 'portcullis');
}

/**
 * Marks a cache file used now (its modification time): the cache is pruned by it, least
 * recently used first (cache/prune.ts). Never fails: a read-only cache is pruned by no one.
 */
export function touch(path: string): Promise<void> {
  const now = new Date();
  touched.set(resolve(path), now.getTime());
  return utimes(path, now, now).catch(() => undefined);
}

/**
 * When this process last marked each cache file used (epoch ms), by absolute path: pruning
 * trusts this over the file's time, which the write above may not have changed yet.
 */
const touched = new Map<string, number>();

export function touchedAt(path: string): number | undefined {
  return touched.get(resolve(path));
}

/** The file was pruned: its use is forgotten (the map holds only files that exist). */
export function forgetTouch(path: string): void {
  touched.delete(resolve(path));
}

export function sha256(bytes: Uint8Array): string {
  return createHash('sha256').update(bytes).digest('hex');
}

/** Readers (other processes included) see the old file or the new one, never half of one. */
export async function atomicWrite(path: string, bytes: Uint8Array | string): Promise<void> {
  await mkdir(dirname(path), { recursive: true });
  const temp = `${path}.${randomUUID()}.tmp`;
  try {
    await writeFile(temp, bytes);
    await rename(temp, path);
    touched.set(resolve(path), Date.now());
  } catch (error) {
    await rm(temp, { force: true });
    throw error;
  }
}
