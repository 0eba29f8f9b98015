// The on-disk cache: blobs (manifests and layers) stored by digest under blobs/sha256/<hex>,
// and index.json mapping "registry/repo:tag" to the manifest digest last seen for it. It is
// what lets the host start when the registry is down. Every read is re-hashed, so a damaged
// cache file is a miss, never a wrong policy.
import { createHash } from 'node:crypto';
import { join } from 'node:path';
import { atomicWrite, readRegularFile, touch } from '../util/files.ts';
import { DIGEST } from './reference.ts';

/** index.json: a line per tag; far more tags than any host loads. */
const MAX_INDEX_BYTES = 16 * 2 ** 20;

export class BlobCache {
  readonly dir: string;
  /** Serialises index updates within this process; across processes the last writer wins. */
  #indexWrite: Promise<void> = Promise.resolve();

  constructor(dir: string) {
    this.dir = dir;
  }

  /** The blob, if cached whole: a regular file of at most `maxBytes` (its descriptor's size, or a manifest's cap) that hashes to `digest`. */
  async getBlob(digest: string, maxBytes: number): Promise<Uint8Array | undefined> {
    if (!DIGEST.test(digest)) return undefined;
    try {
      const path = this.#blobPath(digest);
      const bytes = await readRegularFile(path, maxBytes);
      if (sha256Digest(bytes) !== digest) return undefined;
      void touch(path);
      return bytes;
    } catch {
      return undefined;
    }
  }

  async putBlob(digest: string, bytes: Uint8Array): Promise<void> {
    if (!DIGEST.test(digest) || sha256Digest(bytes) !== digest) throw new Error(`refusing to cache bytes under a digest they do not have (${digest})`);
    await atomicWrite(this.#blobPath(digest), bytes);
  }

  async getTag(key: string): Promise<string | undefined> {
    const digest = (await this.#readIndex())[key];
    return typeof digest === 'string' && DIGEST.test(digest) ? digest : undefined;
  }

  setTag(key: string, digest: string): Promise<void> {
    const write = this.#indexWrite.then(async () => {
      const index = await this.#readIndex();
      if (index[key] === digest) return;
      index[key] = digest;
      await atomicWrite(join(this.dir, 'index.json'), new TextEncoder().encode(`${JSON.stringify(index, null, 2)}\n`));
    });
    this.#indexWrite = write.catch(() => {});
    return write;
  }

  async #readIndex(): Promise<Record<string, string>> {
    try {
      const index = JSON.parse(Buffer.from(await readRegularFile(join(this.dir, 'index.json'), MAX_INDEX_BYTES)).toString('utf8')) as unknown;
      return index && typeof index === 'object' && !Array.isArray(index) ? (index as Record<string, string>) : {};
    } catch {
      return {};
    }
  }

  #blobPath(digest: string): string {
    return join(this.dir, 'blobs', 'sha256', digest.slice('sha256:'.length));
  }
}

export function sha256Digest(bytes: Uint8Array): string {
  return `sha256:${createHash('sha256').update(bytes).digest('hex')}`;
}

