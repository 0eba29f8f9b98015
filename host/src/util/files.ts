// Small helpers every layer shares: where Portcullis caches things on disk, how it writes there,
// and content digests.
import { createHash, randomUUID } from 'node:crypto';
import { constants } from 'node:fs';
import { mkdir, open, rename, rm, utimes, writeFile, type FileHandle } from 'node:fs/promises';
import { homedir } from 'node:os';
import { dirname, join, resolve } from 'node:path';

/** The root of every on-disk cache (pulled modules, transpiled components). */
export function cacheDir(): string {
  // Empty counts as unset: it meant the current folder, which then received the cache (and keys).
  return process.env.PORTCULLIS_CACHE || join(homedir(), '.cache', 'portcullis');
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

/**
 * Reads `path` to its end, or throws `tooLarge()` once more than `maxBytes` arrive (whatever its
 * size said). For a path the caller judged a regular file: opened without blocking and judged
 * again through the handle, so that a FIFO swapped in since is refused, not waited on.
 */
export async function readAtMost(path: string, maxBytes: number, tooLarge: () => Error): Promise<Uint8Array> {
  const file = await open(path, constants.O_RDONLY | constants.O_NONBLOCK);
  try {
    const info = await file.stat();
    if (!info.isFile()) throw new Error(`${path} is no longer a regular file (it was replaced while being read)`);
    return await readHandleAtMost(file, info.size, maxBytes, tooLarge);
  } finally {
    await file.close();
  }
}

/**
 * Reads into one buffer of the size the file said it has, then checks that nothing follows; a
 * file that grew meanwhile (or says 0, as in /proc) is read on in chunks. Reading every file in
 * 1 MiB chunks and joining them took 170 ms for the ten policies of the cold-start benchmark,
 * against 35 ms for readFile: each fresh chunk and copy is new memory to fault in.
 */
async function readHandleAtMost(file: FileHandle, size: number, maxBytes: number, tooLarge: () => Error): Promise<Uint8Array> {
  // Never pooled: the bytes own their ArrayBuffer, as callers that transfer or hash them expect.
  const first = Buffer.allocUnsafeSlow(Math.min(size, maxBytes));
  let total = 0;
  while (total < first.length) {
    const { bytesRead } = await file.read(first, total, first.length - total, null);
    // Shorter than it said (cut meanwhile): copied, so that the bytes still own their buffer.
    if (bytesRead === 0) return new Uint8Array(first.subarray(0, total));
    total += bytesRead;
  }
  const chunks: Buffer[] = [first];
  for (;;) {
    // The first look past the end is small enough to come from Buffer's pool: for a file that
    // did not grow, it reads nothing.
    const chunk = Buffer.allocUnsafe(Math.min(chunks.length === 1 ? 4095 : 1 << 20, Math.max(1, maxBytes + 1 - total)));
    const { bytesRead } = await file.read(chunk, 0, chunk.length, null);
    if (bytesRead === 0) break;
    total += bytesRead;
    if (total > maxBytes) throw tooLarge();
    chunks.push(chunk.subarray(0, bytesRead));
  }
  return chunks.length === 1 ? new Uint8Array(first.buffer, 0, total) : new Uint8Array(Buffer.concat(chunks, total));
}

/**
 * A file someone pointed the host or the CLI at, whole: refused as readRegularFile refuses it (a
 * FIFO, a device such as /dev/zero, more than `maxBytes`). A FIFO as the configuration held
 * every reload, and the exit, forever; /dev/zero took 700 MB before "Invalid string length" (red
 * team 5). The error's message says only why, for the caller to say what the file was for.
 */
export async function readPointedFile(path: string, maxBytes: number): Promise<Buffer> {
  try {
    const bytes = await readRegularFile(path, maxBytes);
    return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    const refused = (error as { why?: string }).why;
    const why = code === 'ENOENT' ? 'no such file'
      : refused === 'is not a regular file' ? 'it is not a regular file (a FIFO or a device?)'
      : refused !== undefined ? `it ${refused}`
      : (error as Error).message;
    throw Object.assign(new Error(why), { code });
  }
}

/**
 * A file the host keeps or is pointed at (the OCI cache, a docker config), read only if it is a
 * regular file of at most `maxBytes`: a FIFO there held a pull forever, and one linked to
 * /dev/zero grew the host to 7.7 GB (red team). Opened without blocking, so a FIFO is seen, not
 * waited on; judged and read through one handle, so it cannot be swapped in between.
 */
export async function readRegularFile(path: string, maxBytes: number): Promise<Uint8Array> {
  const file = await open(path, constants.O_RDONLY | constants.O_NONBLOCK);
  try {
    const info = await file.stat();
    const refused = (why: string) => Object.assign(new Error(`${path} ${why}`), { code: 'EREFUSED_FILE', why });
    if (info.isDirectory()) throw refused('is a directory');
    if (!info.isFile()) throw refused('is not a regular file');
    if (info.size > maxBytes) throw refused(`is ${info.size} bytes, more than the ${maxBytes} expected`);
    return await readHandleAtMost(file, info.size, maxBytes, () => refused(`is more than the ${maxBytes} bytes expected`));
  } finally {
    await file.close();
  }
}
