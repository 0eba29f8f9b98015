// `npm run bench:intake [-- --only a,b] [-- --seconds N]`: an experiment for issue 14, not part
// of `npm run bench`. What would more than one intake thread buy on this machine, and what would
// evaluating a cheap policy in the intake thread itself (no worker, no message) buy? Each server
// runs as 1 or 2 processes sharing one port (SO_REUSEPORT, bench/reuse-port.ts) under the same
// saturating load as `npm run bench` (autocannon, 16 keep-alive connections, the same 5 KB Pod
// review). Writes bench/INTAKE.md (with --only: prints the table, writes nothing).
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { Agent, request } from 'undici';
import { freePort } from './free-port.ts';
import { gitState, HZ, machine, machineCpu, processCpu } from './machine.ts';
import type { LoadResult } from './load.ts';
import { ONE_AS, root, writeConfig } from './policies.ts';
import { reviewBody } from './review.ts';

const { values: flags } = parseArgs({ options: { only: { type: 'string' }, seconds: { type: 'string', default: '12' } } });
const body = reviewBody();
const work = await mkdtemp(join(tmpdir(), 'portcullis-intake-'));
const insecure = new Agent({ connect: { rejectUnauthorized: false } });
const machineBusy = async () => (await machineCpu()).busy;

interface Scenario {
  id: string;
  label: string;
  processes: number;
  args: (port: number) => Promise<string[]>;
}

const limit = (port: number) => Promise.resolve(['bench/limit-server.ts', '--port', String(port)]);
const inline = (port: number) => Promise.resolve(['bench/inline-server.ts', '--port', String(port)]);
const portcullis = (extra: Record<string, unknown>) => async (port: number) => {
  const config = await writeConfig(join(work, `serve-${JSON.stringify(extra).replace(/\W/g, '')}.yaml`), ONE_AS, extra);
  return ['host/bin/portcullis.js', 'serve', '--config', config, '--host', '127.0.0.1', '--port', String(port), '--tls-self-signed'];
};

const SCENARIOS: Scenario[] = [
  { id: 'limit-1', label: 'limit (bare HTTPS, parse, allow)', processes: 1, args: limit },
  { id: 'limit-2', label: 'limit', processes: 2, args: limit },
  { id: 'inline-1', label: 'limit + no-delete called in the intake thread', processes: 1, args: inline },
  { id: 'inline-2', label: 'limit + no-delete called in the intake thread', processes: 2, args: inline },
  { id: 'as1-1', label: 'Portcullis, 1 AS policy (2 workers)', processes: 1, args: portcullis({}) },
  { id: 'as1-2', label: 'Portcullis, 1 AS policy (2 workers each)', processes: 2, args: portcullis({}) },
  { id: 'as1-2w1', label: 'Portcullis, 1 AS policy (1 worker each)', processes: 2, args: portcullis({ workers: 1 }) },
];

async function readyz(origin: string): Promise<boolean> {
  try {
    const res = await request(`${origin}/readyz`, { dispatcher: insecure, reset: true });
    await res.body.dump();
    return res.statusCode === 200;
  } catch {
    return false;
  }
}

/** Starts the scenario's processes into `procs` (so that the caller stops them whatever fails), on one port. */
async function start(scenario: Scenario, procs: ChildProcess[]): Promise<number> {
  const port = await freePort();
  for (let i = 0; i < scenario.processes; i++) {
    const args = await scenario.args(port);
    const proc = spawn(process.execPath, ['--import', './bench/reuse-port.ts', ...args], { cwd: root, stdio: ['ignore', 'pipe', 'pipe'] });
    procs.push(proc);
    let out = '';
    const listening = new Promise<void>((resolve, reject) => {
      const seen = (d: Buffer) => {
        out += d.toString();
        if (out.includes('"port"') || out.includes('"listening"')) resolve();
      };
      proc.stdout.on('data', seen);
      proc.stderr.on('data', seen);
      proc.once('exit', (code) => reject(new Error(`${scenario.id}: process exited ${code}:\n${out.slice(-2000)}`)));
      setTimeout(() => reject(new Error(`${scenario.id}: not listening after 120 s:\n${out.slice(-2000)}`)), 120_000).unref();
    });
    await listening;
  }
  const origin = `https://127.0.0.1:${port}`;
  for (let i = 0; !(await readyz(origin)); i++) {
    if (i === 600) throw new Error(`${scenario.id}: /readyz did not answer 200 within 60 s`);
    await new Promise((r) => setTimeout(r, 100));
  }
  return port;
}

async function saturate(origin: string, durationSec: number): Promise<LoadResult> {
  const proc = spawn(process.execPath, ['bench/load.ts', JSON.stringify({ kind: 'saturate', origin, paths: ['/validate'], body, connections: 16, warmupSec: 3, durationSec })], { cwd: root, stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  proc.stdout.on('data', (d: Buffer) => (out += d.toString()));
  await new Promise((r) => proc.once('close', r));
  return JSON.parse(out.trim().split('\n').at(-1)) as LoadResult;
}

interface Row {
  id: string; label: string; processes: number; rps: number; p50: number; p99: number;
  server: number; main: number; load: number; others: number; allowed: boolean;
}
const rows: Row[] = [];
for (const scenario of SCENARIOS) {
  if (flags.only && !flags.only.split(',').includes(scenario.id)) continue;
  const procs: ChildProcess[] = [];
  try {
    const origin = `https://127.0.0.1:${await start(scenario, procs)}`;
    const probe = await request(`${origin}/validate`, { dispatcher: insecure, method: 'POST', headers: { 'content-type': 'application/json' }, body });
    const answer = (await probe.body.json()) as { response?: { allowed?: boolean } };
    const pids = procs.map((p) => p.pid!);
    const before = await Promise.all([...pids.map((p) => processCpu(p)), ...pids.map((p) => processCpu(p, p)), machineBusy()]);
    const w0 = performance.now();
    const result = await saturate(origin, Number(flags.seconds));
    const after = await Promise.all([...pids.map((p) => processCpu(p)), ...pids.map((p) => processCpu(p, p)), machineBusy()]);
    const seconds = (performance.now() - w0) / 1000;
    const n = pids.length;
    const cores = (from: number, to: number) => after.slice(from, to).reduce((a, v, i) => a + v - before[from + i]!, 0) / HZ / seconds;
    const server = cores(0, n);
    const main = cores(n, 2 * n);
    const load = (result.cpuSec ?? 0) / seconds;
    const busy = cores(2 * n, 2 * n + 1);
    rows.push({
      id: scenario.id, label: scenario.label, processes: n, rps: result.rps, p50: result.latencyMs.p50, p99: result.latencyMs.p99,
      server, main, load, others: Math.max(0, busy - server - load), allowed: answer.response?.allowed === true && result.non2xx === 0 && result.errors === 0,
    });
    process.stderr.write(`${scenario.id}: ${result.rps} req/s\n`);
  } finally {
    for (const proc of procs) proc.kill('SIGTERM');
    await Promise.all(procs.map((p) => (p.exitCode !== null ? Promise.resolve() : new Promise((r) => p.once('exit', r)))));
  }
}
await rm(work, { recursive: true, force: true });
await insecure.close();

const limitRps = rows.find((r) => r.id === 'limit-1')?.rps;
const f = (v: number) => v.toFixed(2);
const table = [
  '| server | processes | req/s | × limit (1 process) | p50 ms | p99 ms | cores: server (main threads) / load / other | CPU per review, µs: server / main threads | answers right |',
  '|---|---:|---:|---:|---:|---:|---|---|---|',
  ...rows.map((r) => {
    const us = (c: number) => Math.round((c / r.rps) * 1e6);
    return `| ${r.label} | ${r.processes} | ${r.rps} | ${limitRps ? `${Math.round((r.rps / limitRps) * 100)}%` : '–'} | ${r.p50} | ${r.p99} | ${f(r.server)} (${f(r.main)}) / ${f(r.load)} / ${f(r.others)} | ${us(r.server)} / ${us(r.main)} | ${r.allowed ? 'yes' : 'NO'} |`;
  }),
].join('\n');
if (flags.only) {
  console.log(table);
} else {
  const [head, { cores, cpuModel }] = [await gitState(), await machine()];
  await writeFile(join(root, 'bench', 'INTAKE.md'), `# One intake thread or two, a hop or none (issue 14 experiment)

- **Date:** ${new Date().toISOString()}
- **Command:** \`npm run bench:intake\` (bench/intake.ts)
- **Code:** ${head}
- **Machine:** ${cores} cores, ${cpuModel}, Node ${process.version}
- **Load:** autocannon, 16 keep-alive HTTPS connections, ${flags.seconds} s after 3 s of warm-up, the 5 KB Pod review of \`npm run bench\`; load generator on the same cores.

Why: with one AssemblyScript policy, Portcullis reaches 35–40% of the limit, and its main thread
is the bottleneck (bench/PROFILE.md). Two designs could lift that: more than one intake thread,
and no hop to a worker for a cheap policy. Each is measured here on its own and together. Two
processes share one port with SO_REUSEPORT (bench/reuse-port.ts; Portcullis itself has no such
option). "Limit + no-delete in the intake thread" is the limit server calling the real no-delete
module through Portcullis's own guest code (bench/inline-server.ts), with no deadline: the best
such a design could do, not something that can ship as is.

${table}

How to read it: the last but one column is the CPU each review cost, across all the server's
threads, then on its main threads. Portcullis spends about twice the CPU per review that the
limit server calling the policy in its own thread does: the difference is the hop (the message to
a worker, the worker's wake-up, the answer back). A second Portcullis process adds intake, not
less CPU per review, and two cores hold both processes, their workers and the load: with two
workers each it loses, with one worker each it gains a little, far below the limit-based rows.
The intake-thread design gains most from a second process, since nothing waits on another thread.

What would remove the floor, then: evaluate a cheap core-module policy in the thread that took
the request, and run more than one such thread. Not built, because the sandbox's deadline is
enforced today by terminating the worker, and a policy evaluated in the intake thread cannot be
stopped that way: it would need a deadline inside the module (the module rewritten at load with
a fuel counter checked at every function entry and loop head, as wasmtime's fuel or Wasmer's
metering do; sandbox/code-walk.ts already decodes every instruction), a small fuel budget in
that thread with the call handed to a worker when it runs out, and the intake threads (worker
threads or processes sharing the port) with one place for webhook management, certificates,
metrics and the context cache.
`);
}
