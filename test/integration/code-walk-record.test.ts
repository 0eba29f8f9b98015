// The code walk's pass is recorded in the cache (prepare.ts walkRecord), so that a restart does
// not walk QuickJS again; a record of another revision is not trusted. A file of its own: vitest
// runs each file in a process of its own, so no walk done by another file is remembered here.
import { mkdir, mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { DEFAULT_LIMITS } from '../../host/src/config/limits.ts';
import { loadPolicy } from '../../host/src/policy/load.ts';
import { CODE_WALK_REVISION } from '../../host/src/sandbox/code-walk.ts';
import { capMemory } from '../../host/src/sandbox/memory-cap.ts';
import { SandboxPool } from '../../host/src/sandbox/pool.ts';
import { sha256 } from '../../host/src/util/files.ts';
import { module, RETURN_0 } from '../helpers/wasm.ts';

let pool: SandboxPool;
let cache: string;
const saved = process.env.PORTCULLIS_CACHE;

beforeAll(async () => {
  cache = await mkdtemp(join(tmpdir(), 'portcullis-walk-record-'));
  process.env.PORTCULLIS_CACHE = cache;
  pool = new SandboxPool(1);
});
afterAll(async () => {
  await pool.close();
  if (saved === undefined) delete process.env.PORTCULLIS_CACHE;
  else process.env.PORTCULLIS_CACHE = saved;
  await rm(cache, { recursive: true, force: true });
});

/** A policy whose one function nests `levels` blocks (the walk refuses more than 10,000). */
const nested = (levels: number) => module({
  memories: [{ min: 1 }], exports: [{ name: 'memory', kind: 'memory', index: 0 }, { name: 'validate', kind: 'func', index: 0 }],
  functions: [[...Array.from({ length: levels }, () => [0x02, 0x40]).flat(), ...Array.from({ length: levels }, () => 0x0b), ...RETURN_0]],
});

async function loadBytes(name: string, bytes: Uint8Array) {
  const file = join(cache, `${name}.wasm`);
  await writeFile(file, bytes);
  return loadPolicy(pool, { name, module: file, settings: {}, limits: DEFAULT_LIMITS, failurePolicy: 'Fail', enforcement: 'enforce', isolation: 'reuse' });
}

const records = async () => (await readdir(join(cache, 'compile-trials')).catch(() => [] as string[])).filter((n) => /-walk-\d+$/.test(n));
/** The record is written without waiting for it. */
async function recordsSettled(): Promise<string[]> {
  for (let i = 0; i < 50; i++) {
    const found = await records();
    if (found.length > 0) return found;
    await new Promise((r) => setTimeout(r, 50));
  }
  return records();
}
const hashOf = (bytes: Uint8Array) => sha256(capMemory(bytes, DEFAULT_LIMITS.memoryMiB * 2 ** 20));

it('a module that passes the walk leaves a record of the current revision; one refused leaves none', async () => {
  const shallow = nested(100);
  await loadBytes('shallow', shallow);
  expect(await recordsSettled()).toEqual([`${hashOf(shallow)}-walk-${CODE_WALK_REVISION}`]);
  await expect(loadBytes('deep', nested(20_000))).rejects.toThrow(/nests blocks more than 10000 deep/);
  await new Promise((r) => setTimeout(r, 200));
  expect(await records()).toHaveLength(1);
});

it('a record of the current revision is trusted and a record of another is not', async () => {
  const deep = nested(20_001);
  await mkdir(join(cache, 'compile-trials'), { recursive: true });
  await writeFile(join(cache, 'compile-trials', `${hashOf(deep)}-walk-${CODE_WALK_REVISION + 1}`), '');
  await expect(loadBytes('older', deep)).rejects.toThrow(/nests blocks more than 10000 deep/);
  await writeFile(join(cache, 'compile-trials', `${hashOf(deep)}-walk-${CODE_WALK_REVISION}`), '');
  // Not walked: whatever V8 and the compile trial make of it, the walk's refusal is not the answer.
  const outcome = await loadBytes('recorded', deep).then(() => 'loaded', (error: Error) => error.message);
  expect(outcome).not.toMatch(/nests blocks/);
});
