// Small helpers every layer shares: where Portcullis caches things on disk, how it writes there,
// and content digests.
import { createHash, randomUUID } from 'node:crypto';
import { mkdir, rename, rm, writeFile } from 'node:fs/promises';
import { homedir } from 'node:os';
import { dirname, join } from 'node:path';

/** The root of every on-disk cache (pulled modules, transpiled components). */
export function cacheDir(): string {
  return process.env.PORTCULLIS_CACHE ?? join(homedir(), '.cache', 'portcullis');
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
  } catch (error) {
    await rm(temp, { force: true });
    throw error;
  }
}
