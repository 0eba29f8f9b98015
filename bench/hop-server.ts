// bench/intake.ts only: the limit server that hands every review to a worker thread and answers
// when the worker's reply is back: the least any design with one intake thread and a hop to a
// sandbox thread costs. With --with-policy the worker calls the AssemblyScript no-delete policy
// (Portcullis's own guest code, no deadline, no pool) on the review's text; without it, it
// only answers. Nothing else of Portcullis runs: no scan, no selection, no merge, no metrics.
import { Worker } from 'node:worker_threads';
import { serve } from './bare-server.ts';

interface Review {
  apiVersion: string;
  request: { uid: string };
}

// Taken out of argv before serve() parses its own flags.
const at = process.argv.indexOf('--with-policy');
const withPolicy = at >= 0;
if (withPolicy) process.argv.splice(at, 1);

const worker = new Worker(new URL('./hop-worker.ts', import.meta.url), { workerData: { withPolicy } });
await new Promise((resolve) => worker.once('online', resolve));
// bare-server.ts closes the server on SIGTERM; the worker would hold the process open.
process.once('SIGTERM', () => void worker.terminate());
const waiting = new Map<number, (allowed: boolean) => void>();
let next = 0;
worker.on('message', ([id, allowed]: [number, boolean]) => {
  const resolve = waiting.get(id);
  waiting.delete(id);
  resolve?.(allowed);
});

await serve(async (_path, body) => {
  const review = JSON.parse(body) as Review;
  const id = next++;
  const allowed = await new Promise<boolean>((resolve) => {
    waiting.set(id, resolve);
    worker.postMessage(withPolicy ? [id, body] : [id]);
  });
  return { apiVersion: review.apiVersion, kind: 'AdmissionReview', response: { uid: review.request.uid, allowed } };
});
