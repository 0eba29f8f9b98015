// The alternative design issue 15 asked to measure: a worker asks the main thread for each
// read and blocks on a SharedArrayBuffer with Atomics.wait until it answers. Measured here
// with an idle main thread (its best case) against the same lookup done locally in the worker
// (the replica design the host uses). Under load the round trip also waits for the main
// thread's event loop, which the replica never does.
//   npx node bench/context-roundtrip.ts
import { Worker } from 'node:worker_threads';

const N = 20_000;
const workerSource = `
const { parentPort, workerData } = require('node:worker_threads');
const { shared, N } = workerData;
const flag = new Int32Array(shared, 0, 1);
const bytes = new Uint8Array(shared, 8);
const local = new Map();
for (let i = 0; i < 1000; i++) local.set('ns-' + i, JSON.stringify({ metadata: { name: 'ns-' + i, labels: { owner: 't' } } }));
const roundTrip = [], replica = [];
for (let i = 0; i < N; i++) {
  let t = performance.now();
  Atomics.store(flag, 0, 0);
  parentPort.postMessage('ns-' + (i % 1000));
  Atomics.wait(flag, 0, 0);
  const length = Atomics.load(flag, 0);
  JSON.parse(new TextDecoder().decode(bytes.slice(0, length)));
  roundTrip.push((performance.now() - t) * 1000);
  t = performance.now();
  JSON.parse(local.get('ns-' + (i % 1000)));
  replica.push((performance.now() - t) * 1000);
}
const median = (a) => a.sort((x, y) => x - y)[a.length >> 1];
parentPort.postMessage({ done: true, roundTrip: median(roundTrip), replica: median(replica) });
`;
const shared = new SharedArrayBuffer(1 << 16);
const flag = new Int32Array(shared, 0, 1);
const bytes = new Uint8Array(shared, 8);
const store = new Map<string, string>();
for (let i = 0; i < 1000; i++) store.set(`ns-${i}`, JSON.stringify({ metadata: { name: `ns-${i}`, labels: { owner: 't' } } }));
const worker = new Worker(workerSource, { eval: true, workerData: { shared, N } });
const result = await new Promise<{ roundTrip: number; replica: number }>((resolve) => {
  worker.on('message', (message: string | { done: true; roundTrip: number; replica: number }) => {
    if (typeof message !== 'string') return resolve(message);
    const encoded = new TextEncoder().encode(store.get(message) ?? 'null');
    bytes.set(encoded);
    Atomics.store(flag, 0, encoded.length);
    Atomics.notify(flag, 0);
  });
});
await worker.terminate();
const medianMicros = { atomicsRoundTrip: +result.roundTrip.toFixed(2), workerReplica: +result.replica.toFixed(2) };
process.stdout.write(`${JSON.stringify({ reads: N, medianMicros })}\n`);
