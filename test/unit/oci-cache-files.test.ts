// What the host reads from disk for OCI pulls (its cache, a docker config) is read only when it is
// a regular file of sane size: a FIFO held a pull forever, and a cache entry linked to /dev/zero
// grew the host to 7.7 GB (red team).
import { execFileSync } from 'node:child_process';
import { mkdir, mkdtemp, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { expect, it } from 'vitest';
import { lookupCredentials } from '../../host/src/oci/auth.ts';
import { BlobCache, sha256Digest } from '../../host/src/oci/cache.ts';

it('takes a cached blob only from a regular file no larger than expected; a FIFO, a device link or an oversized file is a miss, at once', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'portcullis-cache-files-'));
  const cache = new BlobCache(dir);
  const good = new TextEncoder().encode('a cached blob');
  const digest = sha256Digest(good);
  await cache.putBlob(digest, good);
  expect(await cache.getBlob(digest, good.length)).toEqual(good);
  // Larger than its descriptor says: not read.
  expect(await cache.getBlob(digest, good.length - 1)).toBeUndefined();
  const blobs = join(dir, 'blobs', 'sha256');
  await mkdir(blobs, { recursive: true });
  const fifo = `sha256:${'1'.repeat(64)}`;
  execFileSync('mkfifo', [join(blobs, '1'.repeat(64))]);
  const zero = `sha256:${'2'.repeat(64)}`;
  await symlink('/dev/zero', join(blobs, '2'.repeat(64)));
  const started = performance.now();
  expect(await cache.getBlob(fifo, 2 ** 20)).toBeUndefined();
  expect(await cache.getBlob(zero, 2 ** 20)).toBeUndefined();
  expect(performance.now() - started).toBeLessThan(2_000);
  // The tag index too.
  execFileSync('mkfifo', [join(dir, 'index.json')]);
  expect(await cache.getTag('r/x:v1')).toBeUndefined();
});

it('refuses a docker config that is not a regular file, saying so, instead of waiting on it or reading it without end', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'portcullis-docker-config-'));
  const fifo = join(dir, 'fifo.json');
  execFileSync('mkfifo', [fifo]);
  const zero = join(dir, 'zero.json');
  await symlink('/dev/zero', zero);
  for (const path of [fifo, zero]) {
    await expect(lookupCredentials(path, 'r.example', true)).rejects.toMatchObject({
      code: 'REGISTRY_UNAUTHORIZED', message: `cannot use docker config ${path}: ${path} is not a regular file`,
    });
  }
  // A symlink to a regular file (a mounted Secret's keys are links) is read as before.
  await writeFile(join(dir, 'real.json'), JSON.stringify({ auths: { 'r.example': { username: 'u', password: 'p' } } }));
  await symlink(join(dir, 'real.json'), join(dir, 'linked.json'));
  expect((await lookupCredentials(join(dir, 'linked.json'), 'r.example', true)).credentials).toEqual({ username: 'u', password: 'p' });
});
