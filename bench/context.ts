// Issue 15's microbenchmark: the cost of one context `get` inside a guest, from the worker's
// replica of the informer cache (1,000 cached Namespaces). A guest does the same get N times in
// one call; per-get cost = (guest time with N gets - guest time with 0) / N, per call, so the
// evaluation's own fixed cost drops out. Medians over many calls, TypeScript (component, jco
// import) and AssemblyScript (Extism host function).
//   npx node bench/context.ts [--quick]       prints one line of JSON, then a summary on stderr
// `npm run bench` runs it as its `context` phase.
import type { JsonObject } from '@portcullis/sdk';
import { ContextHub } from '../host/src/context/hub.ts';
import { loadOffline } from '../host/src/context/offline.ts';
import { evaluatePolicy } from '../host/src/evaluate/evaluate.ts';
import { loadPolicy } from '../host/src/policy/load.ts';
import type { LoadedPolicy } from '../host/src/policy/loaded.ts';
import { SandboxPool } from '../host/src/sandbox/pool.ts';
import { DEFAULT_LIMITS } from '../host/src/config/limits.ts';
import { request } from '@portcullis/sdk/testing';
import { percentiles, type Percentiles } from './load.ts';

const quick = process.argv.includes('--quick');
const CALLS = quick ? 30 : 200;
const GETS = 1000;
const NS = { apiVersion: 'v1', kind: 'Namespace' };
const root = new URL('..', import.meta.url).pathname;

export interface ContextBenchResult {
  cachedObjects: number;
  getsPerCall: number;
  calls: number;
  /** Microseconds per get inside the guest. */
  ts: Percentiles;
  as: Percentiles;
}

const pool = new SandboxPool(1);
const hub = new ContextHub();
const objects: JsonObject[] = Array.from({ length: 1000 }, (_, i) => ({
  apiVersion: 'v1', kind: 'Namespace',
  metadata: { name: `ns-${i}`, labels: { owner: `team-${i % 10}`, 'kubernetes.io/metadata.name': `ns-${i}` } },
}));
loadOffline(hub, objects, [NS]);
hub.attach(pool);

const load = (name: string, file: string): Promise<LoadedPolicy> => loadPolicy(pool, {
  name, module: `${root}test/fixtures/policies/${file}/${file}.wasm`, settings: {}, limits: DEFAULT_LIMITS,
  failurePolicy: 'Fail', enforcement: 'enforce', isolation: 'reuse', context: [NS],
});

async function guestMicros(policy: LoadedPolicy, spec: JsonObject): Promise<number> {
  const outcome = await evaluatePolicy(pool, policy, 'validate', {
    request: request({ object: { spec } }), settings: {}, headers: {}, sslpeer: null, dryRun: false, webhook: '/validate',
  });
  if (outcome.status !== 'allowed' || outcome.guestMicros === undefined) throw new Error(`benchmark call failed: ${JSON.stringify(outcome)}`);
  return outcome.guestMicros;
}

async function perGet(policy: LoadedPolicy, spec: (times: number) => JsonObject): Promise<Percentiles> {
  for (let i = 0; i < 5; i++) await guestMicros(policy, spec(GETS)); // warm up
  const samples: number[] = [];
  for (let i = 0; i < CALLS; i++) {
    const base = await guestMicros(policy, spec(0));
    const full = await guestMicros(policy, spec(GETS));
    samples.push((full - base) / GETS);
  }
  return percentiles(samples);
}

try {
  const ts = await load('ts-probe', 'context-probe');
  const as = await load('as-probe', 'as-context-probe');
  const result: ContextBenchResult = {
    cachedObjects: objects.length, getsPerCall: GETS, calls: CALLS,
    ts: await perGet(ts, (times) => ({ repeat: { verb: 'get', ...NS, name: 'ns-500', times } })),
    as: await perGet(as, (times) => ({ get: 'ns-500', times })),
  };
  process.stdout.write(`${JSON.stringify(result)}\n`);
  const { ts: t, as: a } = result;
  process.stderr.write(`context get inside a guest: TypeScript p50 ${t.p50} µs (p90 ${t.p90}), AssemblyScript p50 ${a.p50} µs (p90 ${a.p90})\n`);
} finally {
  await pool.close();
}
