// A policy pinned by `digest:` loads only from bytes of that digest, and the refusal says which
// digest the field means (outsider: the manifest digest `push` prints was pasted there).
import { afterAll, expect, it } from 'vitest';
import { parseConfig } from '../../host/src/config/load.ts';
import { loadPolicySet } from '../../host/src/policy/policy-set.ts';
import { SandboxPool } from '../../host/src/sandbox/pool.ts';
import { sha256 } from '../../host/src/util/files.ts';
import { readFile } from 'node:fs/promises';
import { wasm } from '../helpers/policies.ts';

const pool = new SandboxPool(1);
afterAll(() => pool.close());

it('loads a module of the pinned digest and refuses another, saying what the digest is of', async () => {
  const file = wasm('no-delete');
  const right = `sha256:${sha256(await readFile(file))}`;
  const wrong = `sha256:${'0'.repeat(64)}`;
  const config = parseConfig(`policies:\n  - { name: ok, module: ${file}, digest: "${right}" }\n  - { name: bad, module: ${file}, digest: "${wrong}" }`, '/tmp/c.yaml');
  const set = await loadPolicySet(pool, config);
  const [ok, bad] = set.entries;
  expect(ok!.loaded).toBeDefined();
  expect(bad!.loaded).toBeUndefined();
  expect(bad!.error?.message).toBe(`policy "bad" could not be loaded: its module ${file} has digest ${right}, not the pinned ${wrong}; refusing it`);
});
