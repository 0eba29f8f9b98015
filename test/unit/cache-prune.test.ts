// The on-disk cache's budget: least recently used files go first, never what the current
// policy set used or anything used within the grace period, and nothing outside the folders.
import { mkdir, mkdtemp, readdir, rm, stat, symlink, utimes, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, expect, it } from 'vitest';
import { cacheFolders, PRUNE_GRACE_MS, pruneCache } from '../../host/src/cache/prune.ts';
import { touch } from '../../host/src/util/files.ts';

const MiB = 2 ** 20;
const HOUR = 60 * 60 * 1000;
let dir: string;
let now: number;

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), 'portcullis-prune-'));
  now = Date.now();
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

/** A file of `mib` MiB under the cache folder, last used `hoursAgo` hours ago. */
async function file(path: string, mib: number, hoursAgo: number): Promise<string> {
  const full = join(dir, path);
  await mkdir(join(full, '..'), { recursive: true });
  await writeFile(full, Buffer.alloc(mib * MiB));
  const at = new Date(now - hoursAgo * HOUR);
  await utimes(full, at, at);
  return full;
}

async function left(): Promise<string[]> {
  const names = await readdir(dir, { recursive: true, withFileTypes: true });
  return names.filter((e) => e.isFile() || e.isSymbolicLink()).map((e) => join(e.parentPath, e.name).slice(dir.length + 1)).sort();
}

it('removes nothing while the cache is within its budget', async () => {
  await file('oci/blobs/sha256/a', 1, 500);
  await file('transpiled/cores/b.wasm', 1, 400);
  const result = await pruneCache({ folders: [join(dir, 'oci'), join(dir, 'transpiled')], maxBytes: 2 * MiB, keepSince: now });
  expect(result).toMatchObject({ removedFiles: 0, keptBytes: 2 * MiB, overBudget: false });
  expect(await left()).toEqual(['oci/blobs/sha256/a', 'transpiled/cores/b.wasm']);
});

it('removes the least recently used files first, until the cache is within its budget', async () => {
  await file('oci/blobs/sha256/oldest', 2, 300);
  await file('transpiled/cores/older.wasm', 2, 200);
  await file('compile-trials/old-v8', 2, 100);
  await file('transpiled/cores/recent.wasm', 2, 50);
  const folders = ['oci', 'transpiled', 'compile-trials'].map((f) => join(dir, f));
  const result = await pruneCache({ folders, maxBytes: 5 * MiB, keepSince: now });
  expect(result).toMatchObject({ removedFiles: 2, removedBytes: 4 * MiB, keptBytes: 4 * MiB, overBudget: false });
  expect(await left()).toEqual(['compile-trials/old-v8', 'transpiled/cores/recent.wasm']);
});

it('keeps what the current policy set used and what was used within the grace period, and says it is over budget', async () => {
  await file('transpiled/cores/unused.wasm', 3, 72);
  // Loaded 10 hours ago by the set that still serves: touched then, never since.
  await file('transpiled/cores/current.wasm', 3, 9);
  await file('transpiled/cores/draining.wasm', 3, PRUNE_GRACE_MS / HOUR / 2);
  const result = await pruneCache({ folders: [join(dir, 'transpiled')], maxBytes: 1 * MiB, keepSince: now - 10 * HOUR });
  expect(result).toMatchObject({ removedFiles: 1, keptBytes: 6 * MiB, overBudget: true });
  expect(await left()).toEqual(['transpiled/cores/current.wasm', 'transpiled/cores/draining.wasm']);
});

it('counts a use this process marked, whatever the file time says', async () => {
  const used = await file('oci/blobs/sha256/used', 2, 48);
  await file('oci/blobs/sha256/unused', 2, 24);
  await touch(used);
  // The file time set back once touch() has written it (as a failed write would leave it).
  const old = new Date(now - 48 * HOUR);
  await utimes(used, old, old);
  const result = await pruneCache({ folders: [join(dir, 'oci')], maxBytes: 3 * MiB, keepSince: now - 1000 });
  expect(result.removedFiles).toBe(1);
  expect(await left()).toEqual(['oci/blobs/sha256/used']);
});

it('keeps tag indexes, and neither follows nor counts symbolic links', async () => {
  const outside = await mkdtemp(join(tmpdir(), 'portcullis-prune-outside-'));
  try {
    await writeFile(join(outside, 'precious'), Buffer.alloc(4 * MiB));
    await file('oci/index.json', 1, 1000);
    await file('oci/blobs/sha256/old', 1, 1000);
    await symlink(outside, join(dir, 'oci', 'link'));
    const result = await pruneCache({ folders: [join(dir, 'oci')], maxBytes: 0, keepSince: now });
    expect(result).toMatchObject({ removedFiles: 1, keptBytes: 0 });
    expect(await left()).toEqual(['oci/index.json', 'oci/link']);
    expect((await stat(join(outside, 'precious'))).size).toBe(4 * MiB);
  } finally {
    await rm(outside, { recursive: true, force: true });
  }
});

it('takes a folder that does not exist as empty', async () => {
  const result = await pruneCache({ folders: [join(dir, 'nothing-here')], maxBytes: 0, keepSince: now });
  expect(result).toMatchObject({ removedFiles: 0, keptBytes: 0, overBudget: false, truncated: false });
});

it('never prunes the jco glue, which replacement workers import again', async () => {
  await file('transpiled/glue/abc.mjs', 1, 1000);
  await file('transpiled/cores/abc.wasm', 1, 1000);
  const result = await pruneCache({ folders: [join(dir, 'transpiled')], maxBytes: 0, keepSince: now });
  expect(result).toMatchObject({ removedFiles: 1, keptBytes: 0 });
  expect(await left()).toEqual(['transpiled/glue/abc.mjs']);
});

it('prunes nothing when a folder holds more files than the host writes there', async () => {
  for (let i = 0; i < 5; i++) await file(`oci/blobs/sha256/${i}`, 1, 1000);
  const result = await pruneCache({ folders: [join(dir, 'oci')], maxBytes: 0, keepSince: now, maxFiles: 3 });
  expect(result).toMatchObject({ removedFiles: 0, truncated: true });
  expect((await left()).length).toBe(5);
});

it('takes only the blob store of a moved OCI cache, and each folder once', () => {
  const saved = process.env.PORTCULLIS_CACHE;
  process.env.PORTCULLIS_CACHE = join(dir, 'root');
  try {
    const own = ['oci', 'transpiled', 'compile-trials', 'node-compile-cache'].map((f) => join(dir, 'root', f));
    expect(cacheFolders()).toEqual(own);
    // `cacheDir: .` beside a configuration file: its other files are not the cache's.
    expect(cacheFolders(join(dir, 'home'))).toEqual([...own, join(dir, 'home', 'blobs')]);
    // The default OCI folder named explicitly, or a folder inside one already walked.
    expect(cacheFolders(join(dir, 'root', 'oci'))).toEqual(own);
    expect(cacheFolders(join(dir, 'root', 'transpiled', 'x'))).toEqual(own);
  } finally {
    if (saved === undefined) delete process.env.PORTCULLIS_CACHE;
    else process.env.PORTCULLIS_CACHE = saved;
  }
});
