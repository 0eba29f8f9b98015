// The worker of bench/hop-server.ts: answers each review, calling no-delete on it when asked.
import { parentPort, workerData } from 'node:worker_threads';

const { withPolicy } = workerData as { withPolicy: boolean };
const allows = withPolicy ? (await import('./no-delete-guest.ts')).noDeleteAllows : undefined;

parentPort!.on('message', ([id, body]: [number, string?]) => {
  if (!allows || body === undefined) return parentPort!.postMessage([id, true]);
  void allows(body).then((allowed) => parentPort!.postMessage([id, allowed]));
});
