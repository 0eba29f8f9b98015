// bench/intake.ts only: the limit server that also calls the AssemblyScript no-delete policy in
// its own thread, with no worker and no message: what evaluating a cheap policy in the intake
// thread would cost at best. It has none of the sandbox's deadline (a loop here would stop the
// server), so it is an experiment, not a design Portcullis can ship as is.
import { readFile } from 'node:fs/promises';
import '../host/src/sandbox/quiet-wasi-warning.ts';
import { instantiateGuest, LogBuffer } from '../host/src/sandbox/guest.ts';
import { serve } from './bare-server.ts';
import { modulePath } from './policies.ts';

interface Review {
  apiVersion: string;
  request: { uid: string };
}

const module = await WebAssembly.compile(await readFile(modulePath('no-delete')));
const guest = await instantiateGuest({
  key: 'inline', policy: 'no-delete', kind: 'core', modules: { 'policy.wasm': module }, memoryCapBytes: 64 * 2 ** 20,
  maxOutputBytes: 2 ** 20, fresh: false,
}, new LogBuffer());

await serve(async (_path, body) => {
  const review = JSON.parse(body) as Review;
  const answer = JSON.parse(await guest.call('validate', `{"settings":{},${body.slice(1)}`)) as { outcome: string };
  return { apiVersion: review.apiVersion, kind: 'AdmissionReview', response: { uid: review.request.uid, allowed: answer.outcome === 'allow' } };
});
