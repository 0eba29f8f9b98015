// What waking a sleeping thread costs the thread that posts the message, against posting to a
// thread that is awake (polling its port). On the 2-vCPU VMs this project is measured on, the
// first is ~30 µs of the sender's CPU (the wake-up is an inter-processor interrupt the
// hypervisor must deliver), the second ~0.2 µs: the floor under the hop into the sandbox and
// part of the main thread's cost per review (bench/PROFILE.md, `postMessage`).
// Run: npx node bench/wake-cost.ts
import { Worker } from 'node:worker_threads';

const sleeper = new Worker("require('node:worker_threads').parentPort.on('message', () => {});", { eval: true });
const poller = new Worker(
  "const { parentPort, receiveMessageOnPort } = require('node:worker_threads'); " +
  'for (;;) { const m = receiveMessageOnPort(parentPort); if (m && m.message === "stop") break; }',
  { eval: true },
);
await Promise.all([sleeper, poller].map((w) => new Promise((resolve) => w.once('online', resolve))));
const pause = new Int32Array(new SharedArrayBuffer(4));
const rounds = 3000;

function senderMicros(worker: Worker): number {
  let total = 0;
  for (let i = 0; i < rounds; i++) {
    Atomics.wait(pause, 0, 0, 0.3); // 300 µs: long enough for an idle thread to go to sleep
    const before = process.threadCpuUsage();
    worker.postMessage(i);
    const spent = process.threadCpuUsage(before);
    total += spent.user + spent.system;
  }
  return total / rounds;
}

for (let r = 0; r < 2; r++) {
  console.log(`post to a sleeping thread: ${senderMicros(sleeper).toFixed(1)} µs of the sender's CPU; to an awake one: ${senderMicros(poller).toFixed(1)} µs`);
}
poller.postMessage('stop');
await Promise.all([sleeper.terminate(), poller.terminate()]);
