// Builds every policy under policies/ (with --fixtures, also test/fixtures/policies/) to
// <dir>/<name>.wasm. A policy is rebuilt only when its sources, the SDK or the WIT changed.
//   node scripts/build-policies.ts [--fixtures] [--force] [--only NAME]
import { readdir, readFile, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { buildPolicyToFile, type Language } from '@portcullis/sdk/build';

const { values } = parseArgs({ options: { force: { type: 'boolean' }, only: { type: 'string' }, fixtures: { type: 'boolean' } } });
const roots = values.fixtures ? ['policies', 'test/fixtures/policies'] : ['policies'];

interface Job { name: string; source: string; language: Language; out: string; inputs: string[]; stubWasi: boolean }

async function exists(path: string): Promise<boolean> {
  return stat(path).then(() => true, () => false);
}

async function newest(paths: string[]): Promise<number> {
  let latest = 0;
  for (const path of paths) {
    const info = await stat(path).catch(() => undefined);
    if (!info) continue;
    if (info.isDirectory()) {
      const children = (await readdir(path)).filter((c) => c !== 'node_modules' && !c.endsWith('.wasm'));
      latest = Math.max(latest, await newest(children.map((c) => join(path, c))));
    } else {
      latest = Math.max(latest, info.mtimeMs);
    }
  }
  return latest;
}

async function discover(): Promise<Job[]> {
  const jobs: Job[] = [];
  for (const root of roots) {
    if (!(await exists(root))) continue;
    for (const name of (await readdir(root)).sort()) {
      const dir = join(root, name);
      const ts = join(dir, 'policy.ts');
      const as = join(dir, 'assembly', 'index.ts');
      const out = join(dir, `${name}.wasm`);
      // build.json (test fixtures only) may turn off WASI stubbing.
      const options = JSON.parse(await readFile(join(dir, 'build.json'), 'utf8').catch(() => '{}')) as { stubWasi?: boolean };
      const stubWasi = options.stubWasi ?? true;
      if (await exists(ts)) jobs.push({ name, source: ts, language: 'typescript', out, inputs: [ts, 'sdk/src', 'sdk/build', 'wit'], stubWasi });
      else if (await exists(as)) jobs.push({ name, source: as, language: 'assemblyscript', out, inputs: [join(dir, 'assembly'), 'sdk/assembly', 'sdk/build'], stubWasi });
    }
  }
  return jobs.filter((job) => !values.only || job.name === values.only);
}

const jobs = await discover();
const todo: Job[] = [];
for (const job of jobs) {
  const built = await stat(job.out).then((s) => s.mtimeMs, () => 0);
  if (values.force || built < (await newest(job.inputs))) todo.push(job);
}
const started = performance.now();
let failed = 0;
// Two at a time: the machines this runs on have two cores, and each build is single-threaded.
const queue = [...todo];
await Promise.all([0, 1].map(async () => {
  for (let job = queue.shift(); job; job = queue.shift()) {
    try {
      const result = await buildPolicyToFile({ source: job.source, language: job.language, out: job.out, stubWasi: job.stubWasi });
      console.log(`built ${job.out} (${job.language}, ${(result.bytes.length / 1024).toFixed(0)} KiB)`);
    } catch (error) {
      failed++;
      console.error(`failed ${job.out}: ${(error as Error).message}`);
    }
  }
}));
console.log(`${todo.length - failed} of ${jobs.length} policies built, ${jobs.length - todo.length} up to date (${Math.round(performance.now() - started)} ms)`);
if (failed > 0) process.exitCode = 1;
