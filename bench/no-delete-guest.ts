// bench/inline-server.ts and bench/hop-worker.ts: the AssemblyScript no-delete policy through
// Portcullis's own guest code, with no pool and no deadline, and whether it allows a review.
import { readFile } from 'node:fs/promises';
import '../host/src/sandbox/quiet-wasi-warning.ts';
import { modulePath } from './policies.ts';

// Imported only now: Extism loads node:wasi, whose warning a static import would print before
// quiet-wasi-warning.ts had run.
const { instantiateGuest, LogBuffer } = await import('../host/src/sandbox/guest.ts');

const guest = await instantiateGuest({
  key: 'no-delete', policy: 'no-delete', kind: 'core', modules: { 'policy.wasm': await WebAssembly.compile(await readFile(modulePath('no-delete'))) },
  memoryCapBytes: 64 * 2 ** 20, maxOutputBytes: 2 ** 20, fresh: false,
}, new LogBuffer());

/** Whether no-delete allows the review (its JSON text, as the body came). */
export async function noDeleteAllows(body: string): Promise<boolean> {
  const answer = JSON.parse(await guest.call('validate', `{"settings":{},${body.slice(1)}`)) as { outcome: string };
  return answer.outcome === 'allow';
}
