// serve's start check for module paths that do not exist (policy/source.ts missingModules).
import { mkdir, mkdtemp, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { missingModules } from '../../host/src/policy/source.ts';
import type { PolicyConfig } from '../../host/src/config/types.ts';

let dir: string;
beforeAll(async () => { dir = await mkdtemp(join(tmpdir(), 'portcullis-missing-')); });
afterAll(() => rm(dir, { recursive: true, force: true }));

const entry = (name: string, module: string, scope: Partial<PolicyConfig> = {}) =>
  ({ name, module, rules: [], match: [], ...scope }) as unknown as PolicyConfig;

it('names a dangling link as such, and says nothing of a module that exists, an oci:// one, or one its entry scopes', async () => {
  await mkdir(join(dir, 'p'));
  await writeFile(join(dir, 'p', 'here.wasm'), 'x');
  await symlink(join(dir, 'p', 'gone.wasm'), join(dir, 'p', 'link.wasm'));
  expect(await missingModules([entry('here', join(dir, 'p', 'here.wasm')), entry('remote', 'oci://r.example/p:v1')])).toBeUndefined();
  expect(await missingModules([entry('scoped', join(dir, 'p', 'nope.wasm'), { objectSelector: { matchLabels: { a: 'b' } } })])).toBeUndefined();
  const message = await missingModules([entry('linked', join(dir, 'p', 'link.wasm'))]);
  expect(message).toMatch(new RegExp(`^policy "linked": its module ${join(dir, 'p', 'link.wasm')} is a link to ${join(dir, 'p', 'gone.wasm')}, which does not exist\\. Fix the path`));
});
