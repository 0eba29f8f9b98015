// `portcullis build` through the real CLI: what it refuses and how long it may take.
import { access, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { expect, it } from 'vitest';
import { cli } from '../helpers/cli.ts';
import { root } from '../helpers/policies.ts';
import { run } from '../helpers/process.ts';

it('stops a policy whose top-level code never finishes, at its deadline, saying why', async () => {
  const out = join(await mkdtemp(join(tmpdir(), 'portcullis-build-')), 'loop.wasm');
  const started = performance.now();
  const { code, stderr } = await cli(['build', `${root}test/fixtures/build-loop/policy.ts`, '-o', out, '--timeout', '3']);
  expect(code).toBe(1);
  expect(stderr).toMatch(/^portcullis build: could not build policy .*build-loop\/policy\.ts: evaluating its top-level code did not finish within 3s; /);
  expect(performance.now() - started).toBeLessThan(30_000);
}, 60_000);

it('refuses to write a module that exports neither validate nor mutate', async () => {
  const out = join(await mkdtemp(join(tmpdir(), 'portcullis-build-')), 'empty.wasm');
  const { code, stderr } = await cli(['build', `${root}test/fixtures/build-empty/assembly/index.ts`, '-o', out]);
  expect(code).toBe(1);
  expect(stderr).toMatch(/the module exports no "validate" or "mutate" function \(it exports: helper, memory\)/);
  await expect(access(out)).rejects.toThrow();
}, 60_000);

it('builds the same AssemblyScript module from any working folder', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'portcullis-build-'));
  const fromPolicy = await run(process.execPath, [`${root}host/bin/portcullis.js`, 'build', 'assembly/index.ts', '-o', join(dir, 'a.wasm')],
    { cwd: `${root}policies/no-delete` });
  const fromRoot = await cli(['build', 'policies/no-delete/assembly/index.ts', '-o', join(dir, 'b.wasm')]);
  const fromElsewhere = await run(process.execPath, [`${root}host/bin/portcullis.js`, 'build', `${root}policies/no-delete/assembly/index.ts`, '-o', join(dir, 'c.wasm')],
    { cwd: tmpdir() });
  expect([fromPolicy.code, fromRoot.code, fromElsewhere.code]).toEqual([0, 0, 0]);
  const [a, b, c] = await Promise.all(['a', 'b', 'c'].map((n) => readFile(join(dir, `${n}.wasm`))));
  expect(a!.length).toBeGreaterThan(10_000);
  expect(a).toEqual(b);
  expect(a).toEqual(c);
}, 120_000);

it('says what to write when a TypeScript policy has no default export, or an AssemblyScript one does not import the SDK', async () => {
  // Inside the checkout, so @portcullis/sdk resolves from the workspace; .scratch is ignored by git.
  await mkdir(join(root, '.scratch'), { recursive: true });
  const dir = await mkdtemp(join(root, '.scratch', 'build-'));
  try {
    await writeFile(join(dir, 'named.ts'), "import { definePolicy } from '@portcullis/sdk';\nexport const policy = definePolicy({ validate: () => ({ allowed: true }) });\n");
    const named = await cli(['build', join(dir, 'named.ts'), '-o', join(dir, 'named.wasm'), '--no-typecheck']);
    expect(named.code).toBe(1);
    expect(named.stderr).toMatch(/named\.ts: it has no default export: a policy ends with `export default definePolicy\(\{ \.\.\. \}\)`/);
    expect(named.stderr).not.toMatch(/portcullis-entry/);
    // A plain object as the default export, or a policy with no handler: said at build, nothing written.
    await writeFile(join(dir, 'plain.ts'), 'export default { validate() { return { allowed: true }; } };\n');
    const plain = await cli(['build', join(dir, 'plain.ts'), '-o', join(dir, 'plain.wasm'), '--no-typecheck']);
    expect(plain.code).toBe(1);
    expect(plain.stderr).toMatch(/plain\.ts: the default export is not a policy: write `export default definePolicy\(\{ validate\(request\) \{ \.\.\. \} \}\)`/);
    expect(plain.stderr).not.toMatch(/componentize|Failed to evaluate|wasm trap/);
    await writeFile(join(dir, 'empty.ts'), "import { definePolicy } from '@portcullis/sdk';\nexport default definePolicy({});\n");
    // A policy whose nearest package.json (the checkout's) has no "portcullis" field: says so at build.
    await writeFile(join(dir, 'loose.ts'), "import { definePolicy } from '@portcullis/sdk';\nexport default definePolicy({ validate() {} });\n");
    const loose = await cli(['build', join(dir, 'loose.ts'), '-o', join(dir, 'loose.wasm'), '--no-typecheck']);
    expect(loose.code, loose.stderr).toBe(0);
    expect(loose.stderr).toContain(`, no rules (the configuration's rules apply, or else it is sent every namespaced CREATE, UPDATE and DELETE: add "portcullis": { "rules": [...] } there), from ${root}package.json\n`);
    const empty = await cli(['build', join(dir, 'empty.ts'), '-o', join(dir, 'empty.wasm')]);
    expect(empty.code).toBe(1);
    expect(empty.stderr).toMatch(/empty\.ts has neither a validate nor a mutate handler: give definePolicy `validate\(request\)` or `mutate\(request\)`; nothing was written/);
    await expect(readFile(join(dir, 'empty.wasm'))).rejects.toThrow(/ENOENT/);
    await mkdir(join(dir, 'assembly'));
    await writeFile(join(dir, 'assembly/index.ts'), 'export function validate(): i32 {\n  return 0;\n}\n');
    const bare = await cli(['build', join(dir, 'assembly/index.ts'), '-o', join(dir, 'bare.wasm')]);
    expect(bare.code).toBe(1);
    expect(bare.stderr).toMatch(/the entry file must import from '@portcullis\/sdk\/assembly'/);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}, 120_000);

it('says the SDK is missing when an AssemblyScript policy\'s folder has none in reach, as a TypeScript build does', async () => {
  // Newcomer: the CLI installed elsewhere, a policy folder without node_modules: a Node stack
  // trace about json-as/transform, naming neither the SDK nor what to install.
  const dir = await mkdtemp(join(tmpdir(), 'portcullis-build-nosdk-'));
  await mkdir(join(dir, 'assembly'));
  await writeFile(join(dir, 'assembly/index.ts'), "import { Context, Result, handleValidate } from '@portcullis/sdk/assembly';\n" +
    'function check(ctx: Context): Result { return Result.allow(); }\nexport function validate(): i32 { return handleValidate(check); }\n');
  const { code, stderr } = await cli(['build', join(dir, 'assembly/index.ts'), '-o', join(dir, 'a.wasm')]);
  expect(code).toBe(1);
  expect(stderr).toContain("cannot find module '@portcullis/sdk' (its assembly/ folder) in a node_modules folder above the source: install the SDK in the policy's project");
  expect(stderr).not.toMatch(/^\s+at /m);
}, 60_000);

it('shows an AssemblyScript policy\'s compile errors without the compiler\'s notes on the SDK\'s own code', async () => {
  // Newcomer: four "INFO AS210: Expression is never 'null'" in the SDK surrounded every error.
  await mkdir(join(root, '.scratch'), { recursive: true });
  const dir = await mkdtemp(join(root, '.scratch', 'build-'));
  try {
    await mkdir(join(dir, 'assembly'));
    await writeFile(join(dir, 'assembly/index.ts'), "import { Context, Result, handleValidate } from '@portcullis/sdk/assembly';\n" +
      "function check(ctx: Context): Result { const n: i32 = ctx.label('x'); ctx.patch.set<string>(['metadata', 'labels', 'a'], 'b'); return Result.allow(); }\n" +
      'export function validate(): i32 { return handleValidate(check); }\n');
    const { code, stderr } = await cli(['build', join(dir, 'assembly/index.ts'), '-o', join(dir, 'a.wasm')]);
    expect(code).toBe(1);
    expect(stderr).toContain("ERROR TS2322: Type '~lib/string/String | null' is not assignable to type 'i32'.");
    expect(stderr).not.toContain('AS210');
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}, 60_000);

it('says what is missing or wrong on its command line, in its own words (outsider)', async () => {
  const cases: [string[], RegExp][] = [
    [['build', 'policies/numbers/policy.ts'], /^portcullis build: give -o FILE\.wasm, where to write the policy \(e\.g\. -o policy\.wasm\)\n/],
    [['build', 'src/polcy.ts', '-o', 'x.wasm'], /^portcullis build: src\/polcy\.ts does not exist\n/],
    [['build', 'policies/numbers/policy.ts', '-o'], /^portcullis build: --out needs a value\n/],
    [['build', '--bogus', 'policies/numbers/policy.ts'], /^portcullis build: unknown option --bogus\n/],
  ];
  for (const [args, message] of cases) {
    const result = await cli(args);
    expect(result.code, args.join(' ')).toBe(2);
    expect(result.stderr).toMatch(message);
  }
});
