// What a policy author does with the CLI, through the real binary: new -> build (type check,
// metadata) -> inspect -> test, the help every command gives, and the host using the embedded
// metadata as defaults (rules, settings schema).
import { mkdir, mkdtemp, readFile, readdir, rm, writeFile, access, appendFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfigFile, parseConfig } from '../../host/src/config/load.ts';
import { loadPolicySet } from '../../host/src/policy/policy-set.ts';
import { SandboxPool } from '../../host/src/sandbox/pool.ts';
import { writeLeb as leb } from '../../host/src/sandbox/memory-cap.ts';
import { cli } from '../helpers/cli.ts';
import { root } from '../helpers/policies.ts';
import { run } from '../helpers/process.ts';

// Inside the checkout, so the project resolves @portcullis/sdk from the workspace; .scratch is ignored by git.
let scratch: string;
let project: string;
const inProject = (args: string[]) => run(process.execPath, [`${root}host/bin/portcullis.js`, ...args], { cwd: project });

beforeAll(async () => {
  await mkdir(join(root, '.scratch'), { recursive: true });
  scratch = await mkdtemp(join(root, '.scratch', 'author-'));
  project = join(scratch, 'team-label');
  const created = await cli(['new', project]);
  expect(created.code, created.stderr).toBe(0);
});

afterAll(async () => {
  await rm(scratch, { recursive: true, force: true });
});

describe('help and version', () => {
  it('every command answers --help with its flags and the environment, exit 0, without running', async () => {
    const commands = ['new', 'build', 'test', 'run', 'bench', 'inspect', 'serve', 'push', 'pull'];
    const main = await cli(['--help']);
    expect(main.code).toBe(0);
    for (const name of commands) expect(main.stdout).toMatch(new RegExp(`^  ${name} +\\S`, 'm'));
    for (const name of commands) {
      const help = await cli([name, '--help']);
      expect(help.code, name).toBe(0);
      expect(help.stdout).toMatch(new RegExp(`^usage: portcullis ${name} `));
      expect(help.stdout).toMatch(/PORTCULLIS_CACHE/);
    }
    expect((await cli(['run', '--help'])).stdout).toMatch(/--insecure.*\n.*--docker-config/);
    expect((await cli(['build', '--help'])).stdout).toMatch(/--no-typecheck/);
    // -h anywhere wins, even beside flags the command would refuse.
    expect((await cli(['serve', '--port', 'x', '-h'])).code).toBe(0);
  });

  it('--version prints the package version; an unknown command is one line and exit 2', async () => {
    const pkg = JSON.parse(await readFile(join(root, 'host/package.json'), 'utf8')) as { version: string };
    expect((await cli(['--version'])).stdout).toBe(`portcullis ${pkg.version} (node ${process.versions.node})\n`);
    const unknown = await cli(['frobnicate']);
    expect(unknown.code).toBe(2);
    expect(unknown.stderr).toBe('portcullis: unknown command "frobnicate"; run portcullis --help for the list\n');
  });
});

it('on a Node older than 22.19 (the machine\'s own /usr/bin/node here), says so in one line before loading anything', async () => {
  const system = await run('/usr/bin/node', ['-p', 'process.versions.node']);
  expect(system.code, 'this test needs the machine\'s own Node at /usr/bin/node').toBe(0);
  const version = system.stdout.trim();
  const result = await run('/usr/bin/node', [`${root}host/bin/portcullis.js`, '--version']);
  const [major = 0, minor = 0] = version.split('.').map(Number);
  if (major < 22 || (major === 22 && minor < 19)) {
    expect(result.code).toBe(1);
    expect(result.stderr).toBe(`portcullis: Node ${version} is not supported; install Node 22.19 or later, or 24 (LTS), and run it again\n`);
  } else {
    expect(result.code).toBe(0);
  }
});

describe('portcullis new', () => {
  it('writes a project with the scripts, sources, suite and serve configuration', async () => {
    const files = await readdir(project, { recursive: true });
    expect(files.sort()).toEqual(expect.arrayContaining([
      'package.json', 'tsconfig.json', 'src/policy.ts', 'tests/team-label.test.yaml', 'portcullis.yaml',
      'examples/pod-with-label.yaml', 'examples/pod-without-label.yaml', 'README.md', '.gitignore',
    ]));
    const pkg = JSON.parse(await readFile(join(project, 'package.json'), 'utf8')) as { scripts: Record<string, string>; devDependencies?: unknown };
    expect(Object.keys(pkg.scripts).sort()).toEqual(['build', 'push', 'serve', 'test', 'typecheck']);
    // Run from the checkout, no tarball to point at: no dependency a plain `npm install` would
    // look up on the public registry, and a scope pinned to one that does not exist.
    expect(pkg.devDependencies).toBeUndefined();
    expect(await readFile(join(project, '.npmrc'), 'utf8')).toMatch(/^@portcullis:registry=https:\/\/[a-z-]+\.invalid\/\n$/);
    // A development webhook left behind by kill -9 must not stop the cluster: its webhook is Ignore (newcomer).
    const config = parseConfig(await readFile(join(project, 'portcullis.yaml'), 'utf8'), join(project, 'portcullis.yaml'));
    expect(config.policies.map((p) => p.failurePolicy)).toEqual(['Ignore']);
  });

  it('refuses a folder that is not empty (writing nothing) and a name that cannot be a policy name', async () => {
    const refused = await cli(['new', project]);
    expect(refused.code).toBe(1);
    expect(refused.stderr).toMatch(/team-label is not empty; give a new folder \(nothing was written\)\n$/);
    const badName = await cli(['new', join(scratch, 'Bad_Name')]);
    expect(badName.code).toBe(2);
    expect(badName.stderr).toMatch(/"Bad_Name" cannot be a policy name: use lowercase letters, digits and dashes/);
    await expect(access(join(scratch, 'Bad_Name'))).rejects.toThrow();
    expect((await cli(['new', join(scratch, 'x'), '--lang', 'rust'])).stderr).toMatch(/--lang must be ts or as, not "rust"/);
    expect((await cli(['new', join(scratch, 'x'), '--registry', 'ghcr.io/My Org'])).stderr).toMatch(/--registry must be HOST, HOST:PORT or either with a repository prefix \(ghcr.io\/my-org\), not "ghcr.io\/My Org"/);
  });

  it('takes a registry with a repository prefix of one\'s own (newcomer: ghcr.io/my-org was refused)', async () => {
    const made = await cli(['new', join(scratch, 'prefixed'), '--registry', 'ghcr.io/my-org/team']);
    expect(made.code).toBe(0);
    expect(made.stdout).toBe(`created ${join(scratch, 'prefixed')} (TypeScript policy "prefixed")\nnext: cd ${join(scratch, 'prefixed')} && npm test\n`);
    const pkg = JSON.parse(await readFile(join(scratch, 'prefixed', 'package.json'), 'utf8')) as { scripts: Record<string, string> };
    expect(pkg.scripts.push).toBe('portcullis push prefixed.wasm oci://ghcr.io/my-org/team/prefixed:v0.1.0');
    expect(await readFile(join(scratch, 'prefixed', 'portcullis.yaml'), 'utf8')).toContain('module: oci://ghcr.io/my-org/team/prefixed:v0.1.0');
    const local = await cli(['new', join(scratch, 'local'), '--registry', '127.0.0.1:5001']);
    expect(local.code).toBe(0);
    const localPkg = JSON.parse(await readFile(join(scratch, 'local', 'package.json'), 'utf8')) as { scripts: Record<string, string> };
    expect(localPkg.scripts.push).toBe('portcullis push local.wasm oci://127.0.0.1:5001/policies/local:v0.1.0 --insecure');
  });
});

describe('build, inspect, test on the generated project', () => {
  it('embeds name, version, modes, rules and settings schema; inspect shows them', async () => {
    const built = await inProject(['build', 'src/policy.ts', '-o', 'team-label.wasm']);
    expect(built.code, built.stderr).toBe(0);
    // Where the name came from is said at build, not found later by inspect (newcomer: a policy
    // beside its folder's own package.json was named after the folder).
    expect(built.stderr).toMatch(new RegExp(`^built team-label\\.wasm \\(typescript, \\d+ bytes, \\d+ ms\\); name "team-label" 0\\.1\\.0, 1 rule, from ${project}/package\\.json\n$`));
    const inspected = await inProject(['inspect', 'team-label.wasm', '--json']);
    expect(inspected.code, inspected.stderr).toBe(0);
    const report = JSON.parse(inspected.stdout) as Record<string, unknown>;
    expect(report).toMatchObject({
      kind: 'component', digest: expect.stringMatching(/^sha256:[0-9a-f]{64}$/),
      imports: ['portcullis:policy/host@0.1.0', 'portcullis:policy/context@0.1.0'],
      metadata: {
        name: 'team-label', version: '0.1.0', modes: ['validate'],
        rules: [{ operations: ['CREATE', 'UPDATE'], apiGroups: [''], apiVersions: ['v1'], resources: ['pods'] }],
        settingsSchema: { type: 'object', required: ['label'] },
      },
    });
    const text = await inProject(['inspect', 'team-label.wasm']);
    expect(text.stdout).toMatch(/name: +team-label 0\.1\.0\n.*\n  modes: +validate\n  rules: +CREATE\|UPDATE core\/v1\/pods/);
  }, 60_000);

  it('the generated suite passes as generated', async () => {
    const tested = await inProject(['test', 'tests']);
    expect(tested.stdout).toMatch(/2 passed, 0 failed/);
    expect(tested.code).toBe(0);
  }, 60_000);

  it('settings that break the embedded schema are refused with the field, before the policy runs', async () => {
    const result = await inProject(['run', '--policy', 'team-label.wasm', '--request', 'examples/pod-without-label.yaml', '--settings', '{"label": 7}']);
    expect(result.code).toBe(1);
    expect(result.stderr).toBe('portcullis run: policy "team-label" refused its settings: settings/label must be string (the module\'s settings schema); fix the settings in --settings\n');
    const typo = await inProject(['run', '--policy', 'team-label.wasm', '--request', 'examples/pod-without-label.yaml', '--settings', '{"label": "team", "lable": "x"}']);
    expect(typo.stderr).toMatch(/refused its settings: settings has an unknown field "lable" \(the module's settings schema\)/);
    const missing = await inProject(['run', '--policy', 'team-label.wasm', '--request', 'examples/pod-without-label.yaml', '--settings', '{}']);
    expect(missing.stderr).toMatch(/refused its settings: settings is missing the required field "label" \(the module's settings schema\)/);
    // Missing beside a field it does not know: most likely a typo, so both are said (newcomer).
    const misspelt = await inProject(['run', '--policy', 'team-label.wasm', '--request', 'examples/pod-without-label.yaml', '--settings', '{"lable": "team"}']);
    expect(misspelt.stderr).toMatch(/refused its settings: settings is missing the required field "label", and has a field not among its properties \(a typo\?\): "lable" \(the module's settings schema\)/);
  }, 60_000);

  it('a configuration entry of name + module + settings gets its rules from the module', async () => {
    await writeFile(join(project, 'short.yaml'), 'policies:\n  - { name: team-label, module: team-label.wasm, settings: { label: team } }\n' +
      '  - { name: explicit, module: team-label.wasm, settings: { label: team }, rules: [] }\n');
    const pool = new SandboxPool(1);
    try {
      const set = await loadPolicySet(pool, await loadConfigFile(join(project, 'short.yaml')));
      expect(set.failed).toEqual([]);
      expect(set.byName.get('team-label')!.config.rules).toEqual([{ operations: ['CREATE', 'UPDATE'], apiGroups: [''], apiVersions: ['v1'], resources: ['pods'] }]);
      expect(set.byName.get('explicit')!.config.rules).toEqual([]);
    } finally {
      await pool.close();
    }
  }, 60_000);

  it('a type error stops the build and nothing is written; --no-typecheck builds anyway', async () => {
    await appendFile(join(project, 'src/policy.ts'), '\nexport const wrong: number = "not a number";\n');
    try {
      const refused = await inProject(['build', 'src/policy.ts', '-o', 'typed.wasm']);
      expect(refused.code).toBe(1);
      expect(refused.stderr).toMatch(/1 error\(s\) from the TypeScript compiler \(--no-typecheck builds anyway\):\n.*src\/policy\.ts:\d+:\d+: Type 'string' is not assignable to type 'number'\./);
      await expect(access(join(project, 'typed.wasm'))).rejects.toThrow();
      const forced = await inProject(['build', 'src/policy.ts', '-o', 'typed.wasm', '--no-typecheck']);
      expect(forced.code, forced.stderr).toBe(0);
    } finally {
      const source = await readFile(join(project, 'src/policy.ts'), 'utf8');
      await writeFile(join(project, 'src/policy.ts'), source.replace(/\nexport const wrong.*\n$/, '\n'));
    }
  }, 60_000);

  it('an import of Node\'s own modules says a policy cannot use them, type-checked or not (newcomer)', async () => {
    const original = await readFile(join(project, 'src/policy.ts'), 'utf8');
    await writeFile(join(project, 'src/policy.ts'), `import { readFileSync } from 'node:fs';\nexport const files = readFileSync;\n${original}`);
    try {
      const hint = 'node:fs is one of Node\'s own modules, which a policy cannot use: it runs in a sandbox with no files, network, clock or process';
      for (const flags of [[], ['--no-typecheck']]) {
        const refused = await inProject(['build', 'src/policy.ts', '-o', 'node-fs.wasm', ...flags]);
        expect(refused.code).toBe(1);
        expect(refused.stderr).toContain(hint);
      }
      await expect(access(join(project, 'node-fs.wasm'))).rejects.toThrow();
    } finally {
      await writeFile(join(project, 'src/policy.ts'), original);
    }
  }, 60_000);

  it('an AssemblyScript project: its typecheck script leaves the built module alone, and --no-check still embeds the modes', async () => {
    const dir = join(scratch, 'as-label');
    expect((await cli(['new', dir, '--lang', 'as'])).code).toBe(0);
    const pkg = JSON.parse(await readFile(join(dir, 'package.json'), 'utf8')) as { scripts: Record<string, string> };
    const inAs = (args: string[]) => run(process.execPath, [`${root}host/bin/portcullis.js`, ...args], { cwd: dir });
    const script = (name: string) => pkg.scripts[name]!.replace(/^portcullis /, '').split(' ');
    expect((await inAs(script('build'))).code).toBe(0);
    const built = await readFile(join(dir, 'as-label.wasm'));
    // An author's mistake is reported alone: the template adds no compiler notes of its own
    // (outsider: AS210 "Expression is never 'null'" came with every build error).
    const template = await readFile(join(dir, 'assembly/index.ts'), 'utf8');
    await writeFile(join(dir, 'assembly/broken.ts'), `${template}\nconst wrong: i32 = 'text';\n`);
    const broken = await inAs(['build', 'assembly/broken.ts', '-o', 'broken.wasm']);
    expect(broken.code).toBe(1);
    expect(broken.stderr).toMatch(/TS2322/);
    expect(broken.stderr).not.toMatch(/AS210/);
    const typecheck = await inAs(script('typecheck'));
    expect(typecheck.code, typecheck.stderr).toBe(0);
    expect(await readFile(join(dir, 'as-label.wasm'))).toEqual(built);
    const inspected = await inAs(['inspect', 'node_modules/.cache/typecheck.wasm', '--json']);
    expect(JSON.parse(inspected.stdout)).toMatchObject({ kind: 'core', metadata: { name: 'as-label', modes: ['validate'] } });
  }, 120_000);

  it('refuses to build when the package.json "portcullis" field has a key it does not know (a misspelt "rules" would match every request)', async () => {
    const dir = join(scratch, 'as-typo');
    expect((await cli(['new', dir, '--lang', 'as'])).code).toBe(0);
    const pkg = JSON.parse(await readFile(join(dir, 'package.json'), 'utf8')) as Record<string, unknown>;
    await writeFile(join(dir, 'package.json'), JSON.stringify({ ...pkg, portcullis: { rule: [{ operations: ['CREATE'], apiGroups: [''], apiVersions: ['v1'], resources: ['pods'] }] } }));
    const built = await run(process.execPath, [`${root}host/bin/portcullis.js`, 'build', 'assembly/index.ts', '-o', 'typo.wasm'], { cwd: dir });
    expect(built.code).toBe(1);
    expect(built.stderr).toMatch(/package\.json: "portcullis" has "rule", which it does not know: its keys are "rules" and "settingsSchema"/);
    await expect(access(join(dir, 'typo.wasm'))).rejects.toThrow();
  }, 60_000);

  it('a TypeScript module built with --no-check says its modes were not embedded', async () => {
    const result = await inProject(['build', 'src/policy.ts', '-o', 'unchecked.wasm', '--no-check']);
    expect(result.code, result.stderr).toBe(0);
    expect(result.stderr).toMatch(/modes not embedded \(--no-check\): the host finds them at load\); name "team-label" 0\.1\.0, 1 rule, from .*\/package\.json\n$/);
  }, 60_000);

  it('inspect of something that is not a module is one line and exit 1', async () => {
    await writeFile(join(project, 'junk.wasm'), 'hello');
    const result = await inProject(['inspect', 'junk.wasm']);
    expect(result.code).toBe(1);
    expect(result.stderr).toBe('portcullis inspect: junk.wasm is not a WebAssembly module or component (bad header)\n');
  });

  it('inspect of a device or a FIFO is refused at once (red team 5: /dev/zero grew it past 2.4 GB)', async () => {
    const result = await inProject(['inspect', '/dev/zero']);
    expect(result.code).toBe(1);
    expect(result.stderr).toBe('portcullis inspect: cannot read /dev/zero: it is not a regular file (a FIFO or a device?)\n');
  });

  it('inspect of a core module the host would refuse says why at once, without compiling it', async () => {
    // Red team: 2.5 million nested blocks in one function took inspect 5.9 s and 870 MB to validate.
    const depth = 2_500_000;
    const body = [0x00, ...Array.from({ length: depth }, () => [0x02, 0x40]).flat(), ...Array<number>(depth).fill(0x0b), 0x0b];
    const entry = [...leb(body.length), ...body];
    const code = [...leb(1), ...entry];
    await writeFile(join(project, 'deep.wasm'), Uint8Array.from([0, 0x61, 0x73, 0x6d, 1, 0, 0, 0, 1, 4, 1, 0x60, 0, 0, 3, 2, 1, 0, 10, ...leb(code.length), ...code]));
    const result = await inProject(['inspect', 'deep.wasm']);
    expect(result.code).toBe(1);
    expect(result.stderr).toMatch(/^portcullis inspect: the core module is not one Portcullis would load: function body 0 is 7500002 bytes; a policy's functions may be at most 512 KiB/);
  });
});
