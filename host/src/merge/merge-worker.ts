// The patch merger's thread (offload.ts): combines the patches of one review at a time, off the
// main thread. Nothing here is trusted more than on the main thread: combinePatches rejects what
// a policy's patch does wrong, and anything it throws comes back as a message.
import { parentPort } from 'node:worker_threads';
import type { JsonValue } from '@portcullis/sdk';
import { lowerThisThread } from '../util/thread-priority.ts';
import { combinePatches } from './patches.ts';
import type { MergeReply, MergeRequest } from './offload.ts';

if (!parentPort) throw new Error('the patch merger started outside a worker thread');
const port = parentPort;
// The merge a policy's patch costs yields to the main thread, as guests do.
lowerThisThread();

port.on('message', (request: MergeRequest) => {
  const { id, patches } = request;
  let reply: MergeReply;
  try {
    const object = 'object' in request ? request.object : objectOf(request.envelope);
    const { patch, rejected } = combinePatches(object, patches);
    // As text: a structured clone of the operations cost the main thread more than the merge saved.
    reply = { id, ok: true, combined: { patch: { json: JSON.stringify(patch), length: patch.length }, rejected } };
  } catch (error) {
    reply = { id, ok: false, message: error instanceof Error ? error.message : String(error) };
  }
  port.postMessage(reply);
});
port.postMessage({ ready: true } satisfies MergeReply);

/** `request.object` of the envelope's JSON text (the host parsed the same bytes already). */
function objectOf(envelope: Uint8Array): JsonValue {
  const text = Buffer.from(envelope.buffer, envelope.byteOffset, envelope.byteLength).toString('utf8');
  const object = (JSON.parse(text) as { request?: { object?: JsonValue } }).request?.object;
  if (object === undefined || object === null) throw new Error('the review\'s envelope holds no object');
  return object;
}
