// The transpile cache under concurrent loads from a cold start, and what it shares.
import { mkdtemp, readdir, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { evaluatePolicy } from '../../host/src/evaluate/evaluate.ts';
import { SandboxPool } from '../../host/src/sandbox/pool.ts';
import { prepareSandbox } from '../../host/src/sandbox/prepare.ts';
import { DEFAULT_LIMITS } from '../../host/src/config/limits.ts';
import { readFile } from 'node:fs/promises';
import { input, load, wasm } from '../helpers/policies.ts';

let pool: SandboxPool;
let cache: string;
beforeAll(async () => {
  cache = await mkdtemp(join(tmpdir(), 'portcullis-cache-'));
  process.env.PORTCULLIS_CACHE = cache;
  pool = new SandboxPool(2);
});
afterAll(async () => {
  delete process.env.PORTCULLIS_CACHE;
  await pool.close();
});

it('loads many copies of one component at once from an empty cache', async () => {
  const loaded = await Promise.all(Array.from({ length: 6 }, (_, i) => load(pool, `numbers-${i}`, { file: 'numbers' })));
  const outcomes = await Promise.all(loaded.map((p) => evaluatePolicy(pool, p, 'validate', input({ object: { spec: { numbers: [500] } } }))));
  expect(outcomes.map((o) => o.status)).toEqual(Array(6).fill('denied'));
  // One transpile from an empty cache: ~12 s here, more on a loaded machine.
}, 60_000);

it('shares the glue and the QuickJS runtime between different TypeScript policies', async () => {
  const a = await prepareSandbox('a', new Uint8Array(await readFile(wasm('numbers'))), DEFAULT_LIMITS, false);
  const b = await prepareSandbox('b', new Uint8Array(await readFile(wasm('require-labels'))), DEFAULT_LIMITS, false);
  expect(a.glue).toBe(b.glue);
  const shared = Object.keys(a.modules).filter((name) => a.modules[name] === b.modules[name]);
  expect(shared.length).toBeGreaterThan(Object.keys(a.modules).length / 2);
  expect((await readdir(join(cache, 'transpiled', 'glue'))).length).toBe(1);
});

it('transpiles again when a cache entry is damaged', async () => {
  const cores = await readdir(join(cache, 'transpiled', 'cores'));
  for (const core of cores) await writeFile(join(cache, 'transpiled', 'cores', core), 'damaged');
  const policy = await load(pool, 'numbers-after-damage', { file: 'show-auth' });
  expect((await evaluatePolicy(pool, policy, 'validate', input())).status).toBe('allowed');
});
