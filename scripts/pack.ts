// Packs the two packages a policy author installs, @portcullis/sdk and @portcullis/host (the
// CLI), as npm tarballs in .pack/:
//   node scripts/pack.ts            (npm run pack)
//
// The checkout runs its TypeScript sources directly; Node refuses to do that under
// node_modules, so each package is staged first: sources compiled to JavaScript plus .d.ts
// (relative `.ts` imports rewritten by tsc), the WIT interface and the AssemblyScript library
// copied in, and a package.json whose exports point at the compiled files and whose
// dependencies include every compiler `portcullis build` runs. Then `npm pack` packs the stage.
//   node scripts/pack.ts --host-js  only compiles the host into .pack/stage/host (no declarations,
//                                   nothing packed): what the Dockerfile's image runs
import { execFileSync } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';

const root = resolve(import.meta.dirname, '..');
/** Where the project is published: the packages' repository, and where their docs link the README. */
const published = 'https://github.com/portcullis-dev/portcullis';
const out = join(root, '.pack');
const stage = join(out, 'stage');

type Json = Record<string, unknown>;
const readJson = (path: string): Json => JSON.parse(readFileSync(path, 'utf8')) as Json;
const rootPackage = readJson(join(root, 'package.json'));
const rootDev = rootPackage.devDependencies as Record<string, string>;

/**
 * The oldest Node the compiled packages run on (Node 22 and 24 are the LTS lines): 22.19 has
 * process.threadCpuUsage, which the sandbox reads (newcomer: on 22.12-22.18 every policy failed to
 * load), and undici 8 asks for it too.
 */
const ENGINES = { node: '>=22.19' };
/** What `portcullis build` runs: bundler, QuickJS componentizer, AssemblyScript and its libraries, tsc. */
const COMPILERS = ['esbuild', 'componentize-qjs', 'assemblyscript', '@extism/as-pdk', 'json-as', 'typescript'];

function compile(name: string, include: string[], declaration = true): void {
  const config = {
    extends: join(root, 'tsconfig.json'),
    compilerOptions: {
      noEmit: false, declaration, rewriteRelativeImportExtensions: true, allowImportingTsExtensions: false,
      rootDir: join(root, name), outDir: join(stage, name), sourceMap: false,
    },
    include: include.map((glob) => join(root, name, glob)),
    exclude: ['**/node_modules/**', '**/assembly/**'],
  };
  const file = join(out, `tsconfig.${name}.json`);
  writeFileSync(file, JSON.stringify(config, null, 2));
  execFileSync(join(root, 'node_modules', '.bin', 'tsc'), ['-p', file], { stdio: 'inherit', cwd: root });
}

/**
 * Every thread and child the compiled package starts (`new URL(\`./name${extname(…)}\`…)`) must
 * be in it: a missing one fails only when it is first needed (review: a configuration of 16 KiB
 * or more would have been refused, and blamed).
 */
function checkEntries(name: string): void {
  const dir = join(stage, name, 'src');
  const files = readdirSync(dir, { recursive: true, encoding: 'utf8' }).filter((f) => f.endsWith('.js'));
  for (const file of files) {
    for (const [, entry] of readFileSync(join(dir, file), 'utf8').matchAll(/new URL\(`\.\/([\w-]+)\$\{extname/g)) {
      if (!existsSync(join(dir, dirname(file), `${entry}.js`))) throw new Error(`pack: ${file} starts ./${entry}.js, which the compiled package lacks`);
    }
  }
}

/** `./src/x.ts` -> { types: ./src/x.d.ts, default: ./src/x.js }; AssemblyScript sources stay as they are. */
function compiledExports(exports: Record<string, string>): Json {
  return Object.fromEntries(Object.entries(exports).map(([key, target]) => {
    if (target.startsWith('./assembly/')) return [key, target];
    const base = target.replace(/\.ts$/, '');
    return [key, { types: `${base}.d.ts`, default: `${base}.js` }];
  }));
}

function versionOf(name: string): string {
  const range = rootDev[name];
  if (!range) throw new Error(`scripts/pack.ts: ${name} is not a devDependency of the root package.json`);
  return range;
}

function stagePackage(name: 'sdk' | 'host', extra: (pkg: Json) => Json): string {
  const source = readJson(join(root, name, 'package.json'));
  const { scripts: _scripts, ...kept } = source;
  const staged: Json = {
    ...kept,
    exports: compiledExports(source.exports as Record<string, string>),
    engines: ENGINES,
    license: 'Apache-2.0',
    repository: { type: 'git', url: published },
    // npm's field for the commit a package was made from; `portcullis --version` and
    // portcullis_build_info show it, so a tarball older than the checkout can be told apart.
    gitHead: revision,
    ...extra(source),
  };
  writeFileSync(join(stage, name, 'package.json'), JSON.stringify(staged, null, 2) + '\n');
  const output = execFileSync('npm', ['pack', '--pack-destination', out, '--json'], { cwd: join(stage, name), encoding: 'utf8' });
  const [packed] = JSON.parse(output) as { filename: string }[];
  return join(out, packed!.filename);
}

/** The commit, marked -dirty when the sources packed differ from it. */
function gitRevision(): string {
  try {
    const head = execFileSync('git', ['rev-parse', 'HEAD'], { cwd: root, encoding: 'utf8' }).trim();
    const dirty = execFileSync('git', ['status', '--porcelain', '--', 'host', 'sdk', 'wit'], { cwd: root, encoding: 'utf8' }).trim() !== '';
    return dirty ? `${head}-dirty` : head;
  } catch {
    return 'unknown';
  }
}
const revision = gitRevision();

rmSync(stage, { recursive: true, force: true });
mkdirSync(stage, { recursive: true });

if (process.argv.includes('--host-js')) {
  // The image: JavaScript starts without type stripping, in the main thread and in every
  // sandbox worker (~0.4 s of a first start with 10 policies, measured outside the image).
  compile('host', ['src/**/*.ts'], false);
  checkEntries('host');
  cpSync(join(root, 'host', 'bin'), join(stage, 'host', 'bin'), { recursive: true });
  process.exit(0);
}

compile('sdk', ['src/**/*.ts', 'build/**/*.ts']);
cpSync(join(root, 'sdk', 'assembly'), join(stage, 'sdk', 'assembly'), { recursive: true });
cpSync(join(root, 'wit'), join(stage, 'sdk', 'wit'), { recursive: true });
cpSync(join(root, 'sdk', 'README.md'), join(stage, 'sdk', 'README.md'));
const sdk = stagePackage('sdk', (pkg) => ({
  dependencies: Object.fromEntries(COMPILERS.map((name) => [name, versionOf(name)])),
  peerDependencies: pkg.peerDependencies,
}));

compile('host', ['src/**/*.ts']);
checkEntries('host');
cpSync(join(root, 'host', 'bin'), join(stage, 'host', 'bin'), { recursive: true });
cpSync(join(root, 'host', 'README.md'), join(stage, 'host', 'README.md'));
// The --help texts point at docs/ and deploy/ (outsider: not in the package, so nowhere to read them).
cpSync(join(root, 'docs'), join(stage, 'host', 'docs'), { recursive: true });
cpSync(join(root, 'deploy'), join(stage, 'host', 'deploy'), { recursive: true });
// What the docs link to beside them (newcomer: the 1.20 overlay the README names, the schema,
// the context example's RBAC were broken links in the package). The links are made to fit where
// these land in it; the repository's README is linked where it is published.
cpSync(join(root, 'deploy-overlays'), join(stage, 'host', 'deploy-overlays'), { recursive: true });
cpSync(join(root, 'host', 'config.schema.json'), join(stage, 'host', 'config.schema.json'));
mkdirSync(join(stage, 'host', 'policies'));
cpSync(join(root, 'policies', 'context.yaml'), join(stage, 'host', 'policies', 'context.yaml'));
for (const file of readdirSync(join(stage, 'host', 'docs')).filter((f) => f.endsWith('.md'))) {
  const path = join(stage, 'host', 'docs', file);
  writeFileSync(path, readFileSync(path, 'utf8')
    .replaceAll('](../host/config.schema.json)', '](../config.schema.json)')
    .replaceAll('](../README.md', `](${published}/blob/main/README.md`));
}
const sdkVersion = readJson(join(root, 'sdk', 'package.json')).version as string;
const host = stagePackage('host', (pkg) => ({
  dependencies: { ...(pkg.dependencies as Json), '@portcullis/sdk': sdkVersion },
}));

process.stdout.write(`${sdk}\n${host}\n`);
