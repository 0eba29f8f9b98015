// A serving host keeps its cache folder within cache.maxMiB once its policies are loaded: stale
// files of earlier policy versions go, what the current policies were loaded from stays.
import { mkdir, mkdtemp, readdir, rm, utimes, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { admissionReview, policyYaml, startServer, type TestServer } from '../helpers/server.ts';

let cache: string;
let server: TestServer;
const MONTH_AGO = new Date(Date.now() - 30 * 24 * 3600 * 1000);

async function stale(path: string, bytes: number): Promise<void> {
  const full = join(cache, path);
  await mkdir(join(full, '..'), { recursive: true });
  await writeFile(full, Buffer.alloc(bytes));
  await utimes(full, MONTH_AGO, MONTH_AGO);
}

beforeAll(async () => {
  cache = await mkdtemp(join(tmpdir(), 'portcullis-prune-serve-'));
  process.env.PORTCULLIS_CACHE = cache;
  await stale('transpiled/cores/0000-stale.wasm', 2 * 2 ** 20);
  await stale('oci/blobs/sha256/0000-stale', 2 ** 20);
  await stale('node-compile-cache/v0-old/entry', 2 ** 20);
  await stale('kept-outside-the-cache-folders', 2 ** 20);
  server = await startServer(`cache: { maxMiB: 1 }\npolicies:\n${policyYaml('require-labels', 'settings: { labels: [team] }')}`);
});
afterAll(async () => {
  await server?.close();
  delete process.env.PORTCULLIS_CACHE;
  await rm(cache, { recursive: true, force: true });
});

it('removes stale files after loading, keeps the current policy\'s, and says the budget is too small for them', async () => {
  for (let i = 0; i < 100 && !server.logs.some((l) => l.includes('above cache.maxMiB')); i++) await new Promise((r) => setTimeout(r, 100));
  const pruned = server.logs.find((l) => l.includes('cache pruned'));
  expect(pruned).toBeDefined();
  expect(JSON.parse(pruned!)).toMatchObject({ level: 'info', removedFiles: 3, removedMiB: 4, maxMiB: 1 });
  expect(server.logs.some((l) => l.includes('"level":"warn"') && l.includes('above cache.maxMiB'))).toBe(true);

  expect(await readdir(join(cache, 'transpiled', 'cores'))).not.toContain('0000-stale.wasm');
  expect(await readdir(join(cache, 'oci', 'blobs', 'sha256')).catch(() => [])).not.toContain('0000-stale');
  expect(await readdir(join(cache, 'node-compile-cache', 'v0-old'))).toEqual([]);
  // Not the cache's: left alone.
  expect(await readdir(cache)).toContain('kept-outside-the-cache-folders');
  // The component the policy was transpiled to, which a replacement worker imports again.
  expect((await readdir(join(cache, 'transpiled', 'glue'))).length).toBe(1);
  expect((await readdir(join(cache, 'transpiled', 'cores'))).length).toBeGreaterThan(5);

  const review = admissionReview({ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'x', labels: {} } });
  const answer = await server.post('/validate', review);
  expect(answer.body.response).toMatchObject({ allowed: false });
});
