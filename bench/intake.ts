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
const hop = (withPolicy: boolean) => (port: number) => Promise.resolve(['bench/hop-server.ts', ...(withPolicy ? ['--with-policy'] : []), '--port', String(port)]);
const portcullis = (extra: Record<string, unknown>) => async (port: number) => {
  const config = await writeConfig(join(work, `serve-${JSON.stringify(extra).replace(/\W/g, '')}.yaml`), ONE_AS, extra);
  return ['host/bin/portcullis.js', 'serve', '--config', config, '--host', '127.0.0.1', '--port', String(port), '--tls-self-signed'];
};

const SCENARIOS: Scenario[] = [
  { id: 'limit-1', label: 'limit (bare HTTPS, parse, allow)', processes: 1, args: limit },
  { id: 'limit-2', label: 'limit', processes: 2, args: limit },
  { id: 'hop-1', label: 'limit + a hop to a worker thread and back (no policy)', processes: 1, args: hop(false) },
  { id: 'hop-as-1', label: 'limit + no-delete called in a worker thread (one hop)', processes: 1, args: hop(true) },
  { id: 'hop-as-2', label: 'limit + no-delete called in a worker thread (one hop)', processes: 2, args: hop(true) },
  { id: 'inline-1', label: 'limit + no-delete called in the intake thread', processes: 1, args: inline },
  { id: 'inline-2', label: 'limit + no-delete called in the intake thread', processes: 2, args: inline },
  { id: 'as1-1', label: 'Portcullis, 1 AS policy (2 workers)', processes: 1, args: portcullis({}) },
  { id: 'as1-1w1', label: 'Portcullis, 1 AS policy (1 worker)', processes: 1, args: portcullis({ workers: 1 }) },
  { id: 'as1-2', label: 'Portcullis, 1 AS policy (2 workers each)', processes: 2, args: portcullis({}) },
  { id: 'as1-2w1', label: 'Portcullis, 1 AS policy (1 worker each)', processes: 2, args: portcullis({ workers: 1 }) },
  // This machine's speed drifts by tens of percent within minutes: ratios are to the better of the two.
  { id: 'limit-end', label: 'limit again (end of the runs)', processes: 1, args: limit },
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
  // Each probe is a new connection, which the kernel gives to either process: twenty in a row
  // ready means both are (one still loading its policies answers 503, as it should).
  for (let i = 0, inRow = 0; inRow < 20; i++) {
    if (i === 1200) throw new Error(`${scenario.id}: /readyz did not answer 200 within 60 s`);
    inRow = (await readyz(origin)) ? inRow + 1 : 0;
    if (inRow === 0) await new Promise((r) => setTimeout(r, 50));
  }
  return port;
}

/**
 * Longer than `npm run bench`'s 3 s: a fresh Portcullis runs at about half speed for its first
 * 3-15 s of load on this VM (the ramp: first-touch page faults cost 12-17 µs each here, and its
 * code tiers up), and this experiment compares designs, not fresh processes.
 */
const WARMUP_SEC = 12;

async function saturate(origin: string, durationSec: number): Promise<LoadResult> {
  const proc = spawn(process.execPath, ['bench/load.ts', JSON.stringify({ kind: 'saturate', origin, paths: ['/validate'], body, connections: 16, warmupSec: WARMUP_SEC, durationSec })], { cwd: root, stdio: ['ignore', 'pipe', 'inherit'] });
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

const limitRuns = rows.filter((r) => r.id === 'limit-1' || r.id === 'limit-end').map((r) => r.rps);
const limitRps = limitRuns.length > 0 ? Math.max(...limitRuns) : undefined;
const f = (v: number) => v.toFixed(2);
/** A row's throughput as a share of the limit's. */
const share = (r: Row) => (limitRps ? `${Math.round((r.rps / limitRps) * 100)}%` : '–');
/** CPU µs per review of `cores` (one of a row's core counts). */
const perReview = (r: Row, cores: number) => Math.round((cores / r.rps) * 1e6);
const table = [
  '| server | processes | req/s | × limit (the better 1-process run) | p50 ms | p99 ms | cores: server (main threads) / load / other | CPU per review, µs: server / main threads | answers right |',
  '|---|---:|---:|---:|---:|---:|---|---|---|',
  ...rows.map((r) => `| ${r.label} | ${r.processes} | ${r.rps} | ${share(r)} | ${r.p50} | ${r.p99} | ${f(r.server)} (${f(r.main)}) / ${f(r.load)} / ${f(r.others)} | ${perReview(r, r.server)} / ${perReview(r, r.main)} | ${r.allowed ? 'yes' : 'NO'} |`),
].join('\n');
const rowOf = (id: string) => rows.find((row) => row.id === id);
/** Main-thread CPU per review (µs) of a row, when it ran. */
const mainMicros = (id: string) => {
  const r = rowOf(id);
  return r ? perReview(r, r.main) : undefined;
};
const ratio = (id: string) => {
  const r = rowOf(id);
  return r ? share(r) : '–';
};
// What posting a message costs the poster when the receiving thread sleeps, against when it is
// awake: the wake-up is an inter-processor interrupt the hypervisor delivers (bench/wake-cost.ts).
const wake = await new Promise<string>((resolve) => {
  const proc = spawn(process.execPath, ['bench/wake-cost.ts'], { cwd: root, stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  proc.stdout.on('data', (d: Buffer) => (out += d.toString()));
  proc.once('close', () => resolve(out.trim()));
});

if (flags.only) {
  console.log(table);
  console.log(wake);
} else {
  const [head, { cores, cpuModel }] = [await gitState(), await machine()];
  await writeFile(join(root, 'bench', 'INTAKE.md'), `# One intake thread or two, a hop or none (issue 14 experiment)

- **Date:** ${new Date().toISOString()}
- **Command:** \`npm run bench:intake\` (bench/intake.ts)
- **Code:** ${head}
- **Machine:** ${cores} cores, ${cpuModel}, Node ${process.version}
- **Load:** autocannon, 16 keep-alive HTTPS connections, ${flags.seconds} s after ${WARMUP_SEC} s of warm-up, the 5 KB Pod review of \`npm run bench\`; load generator on the same cores.

Why: with one AssemblyScript policy, Portcullis reaches 25–42% of the limit, and its main thread
is the bottleneck (bench/PROFILE.md). What bounds a design where one thread takes the requests?
Each row is a server built to answer that, under the same load. Two processes share one port with
SO_REUSEPORT (bench/reuse-port.ts; Portcullis itself has no such option). The limit-based rows
run nothing of Portcullis but its guest code (no scan, selection, pool, merge or metrics):
- "a hop to a worker thread and back": the limit server that, per review, posts a message to a
  worker thread and answers when the reply is back (bench/hop-server.ts);
- "no-delete called in a worker thread": the same, the worker calling the real no-delete module
  on the review through Portcullis's guest code (bench/hop-worker.ts), with no deadline;
- "no-delete called in the intake thread": the limit server calling it in its own thread, with
  no worker and no message (bench/inline-server.ts), with no deadline.

${table}

How to read it: the last but one column is the CPU each review cost, across all the server's
threads, then on its main threads.

- **A hop is not what holds Portcullis back.** One intake thread that hands every review to a
  worker, which calls the policy, reached ${ratio('hop-as-1')} of the limit, at ${mainMicros('hop-as-1') ?? '–'} µs of
  main thread a review, against ${mainMicros('limit-1') ?? '–'} µs for the limit. Portcullis, the same design,
  reached ${ratio('as1-1')} at ${mainMicros('as1-1') ?? '–'} µs (${ratio('as1-1w1')} and ${mainMicros('as1-1w1') ?? '–'} µs with one worker). The
  difference is Portcullis's own work per review in that thread: the scan and the partial
  parse of the body, the envelope, selection, the pool's bookkeeping and replies, the merge,
  metrics, and the HTTP layer's guards (bench/PROFILE.md lists them). Session 27 read this
  table without the hop rows and blamed the hop; these rows say otherwise.
- **A slow server pays more per review for its wake-ups.** Posting to a thread that sleeps
  costs the poster far more than posting to one that is awake (bench/wake-cost.ts, this run):

  ${wake.split('\n').join('\n  ')}

  Each review wakes the worker that evaluates it, and each answer wakes the load generator (the
  apiserver, in a cluster), through the socket write. That write is the largest item of every
  main thread in bench/PROFILE.md, the limit's included. The slower the server, the more often
  the other thread has gone to sleep by then, so each µs cut from Portcullis's own work should
  also save some of the wake-ups (not measured apart).
- **A second intake thread** (the 2-process rows) helps the designs whose intake thread is
  their bound, most of all the one that calls the policy in that thread; on two cores shared
  with the load generator, it gains little or loses where workers already take the second core.
- The inline lane (sandbox/inline-lane.ts) is the "intake thread" design inside Portcullis, with
  a deadline by fuel (sandbox/metering.ts). It takes calls only while the workers are idle, so
  at saturation every call hops, which the rows above say is not the problem.

What would remove the floor, then: bring Portcullis's own main-thread work per review toward the
hop rows' (about ${mainMicros('hop-as-1') ?? '–'} µs here). Its largest parts are listed in
bench/PROFILE.md under "1 AS policy".
`);
}
