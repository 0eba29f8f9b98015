// Shrinks a production node_modules (npm ci --omit=dev) for the runtime image: drops the
// packages serving never loads, then every package that only they needed (found with
// `npm ls`), then types, source maps and docs.
//   node scripts/image-prune.ts [APP_DIR]      (run where `npm ci --omit=dev` ran)
// jco is a production dependency only for `transpile` (component -> core modules + JS glue at
// policy load); its other commands pull in compilers. If the host stops depending on all of
// jco (issue 12 may switch to @bytecodealliance/jco-transpile), most of this goes away.
import { execFileSync } from 'node:child_process';
import { readdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';

const UNUSED = new Set([
  'binaryen', '@bytecodealliance/componentize-js', '@bytecodealliance/componentize-js-0-19-3', 'componentize-qjs',
  '@bytecodealliance/jco-std', 'typescript', 'typescript-compiler-api', 'rolldown', 'unenv', 'regexpu-core',
]);

interface Tree { dependencies?: Record<string, Tree> }

const app = process.argv[2] ?? '.';
function npmLs(): string {
  try {
    return execFileSync('npm', ['ls', '--omit=dev', '--all', '--json'], { cwd: app, encoding: 'utf8', maxBuffer: 64 << 20, stdio: ['ignore', 'pipe', 'ignore'] });
  } catch (error) {
    // npm ls exits 1 over version "problems" (the root's overrides) but still prints the tree.
    const stdout = (error as { stdout?: unknown }).stdout;
    if (typeof stdout === 'string' && stdout.startsWith('{')) return stdout;
    throw error;
  }
}
const tree = JSON.parse(npmLs()) as Tree;
const kept = new Set<string>();
(function walk(node: Tree): void {
  for (const [name, child] of Object.entries(node.dependencies ?? {})) {
    if (UNUSED.has(name)) continue;
    // A deduplicated entry lists no dependencies; the full one elsewhere does: walk every entry.
    kept.add(name);
    walk(child);
  }
})(tree);

const modules = join(app, 'node_modules');
let removed = 0;
const entries = readdirSync(modules).flatMap((e) => (e.startsWith('@') ? readdirSync(join(modules, e)).map((s) => `${e}/${s}`) : [e]));
for (const name of entries) {
  if (name.startsWith('.') || name.startsWith('@portcullis/') || kept.has(name)) continue;
  rmSync(join(modules, name), { recursive: true, force: true });
  removed++;
}
for (const scope of readdirSync(modules).filter((e) => e.startsWith('@'))) {
  if (readdirSync(join(modules, scope)).length === 0) rmSync(join(modules, scope), { recursive: true });
}
const JUNK = /(\.map|\.d\.[mc]?ts|^readme(\..*)?|^changelog(\..*)?)$/i;
(function clean(dir: string): void {
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory() && !entry.isSymbolicLink()) clean(path);
    else if (entry.isFile() && JUNK.test(entry.name)) rmSync(path);
  }
})(modules);
const left = readdirSync(modules).length;
console.log(`image-prune: removed ${removed} packages serving never loads; ${left} entries left in ${modules}`);
