// Small helpers every layer shares: where Portcullis caches things on disk, and content digests.
import { createHash } from 'node:crypto';
import { homedir } from 'node:os';
import { join } from 'node:path';

/** The root of every on-disk cache (pulled modules, transpiled components). */
export function cacheDir(): string {
  return process.env.PORTCULLIS_CACHE ?? join(homedir(), '.cache', 'portcullis');
}

export function sha256(bytes: Uint8Array): string {
  return createHash('sha256').update(bytes).digest('hex');
}
