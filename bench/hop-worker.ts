// The worker of bench/hop-server.ts: answers each review, calling no-delete on it when asked.
import { readFile } from 'node:fs/promises';
import { parentPort, workerData } from 'node:worker_threads';
import '../host/src/sandbox/quiet-wasi-warning.ts';
import { modulePath } from './policies.ts';

const { withPolicy } = workerData as { withPolicy: boolean };
// Imported only now: Extism loads node:wasi, whose warning a static import would print before
// quiet-wasi-warning.ts had run.
const { instantiateGuest, LogBuffer } = await import('../host/src/sandbox/guest.ts');
const guest = withPolicy
  ? await instantiateGuest({
    key: 'hop', policy: 'no-delete', kind: 'core', modules: { 'policy.wasm': await WebAssembly.compile(await readFile(modulePath('no-delete'))) },
    memoryCapBytes: 64 * 2 ** 20, maxOutputBytes: 2 ** 20, fresh: false,
  }, new LogBuffer())
  : undefined;

parentPort!.on('message', ([id, body]: [number, string?]) => {
  if (!guest || body === undefined) return parentPort!.postMessage([id, true]);
  void guest.call('validate', `{"settings":{},${body.slice(1)}`).then((text) => {
    parentPort!.postMessage([id, (JSON.parse(text) as { outcome: string }).outcome === 'allow']);
  });
});
