// Runs componentize-qjs in a worker thread. Componentizing evaluates the policy's top-level
// code once (to snapshot the initialised QuickJS heap), so a policy that loops at the top level
// would hang the build: in a worker, the build can stop it at a deadline.
import { parentPort, workerData } from 'node:worker_threads';

const { componentize } = await import('componentize-qjs');
try {
  const result = await componentize(workerData as Parameters<typeof componentize>[0]);
  parentPort!.postMessage({ ok: true, component: new Uint8Array(result.component) });
} catch (error) {
  parentPort!.postMessage({ ok: false, error: error instanceof Error ? error.message : String(error) });
}
