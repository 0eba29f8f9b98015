// The patch merger's thread (offload.ts): combines the patches of one review at a time, off the
// main thread. Nothing here is trusted more than on the main thread: combinePatches rejects what
// a policy's patch does wrong, and anything it throws comes back as a message.
import { parentPort } from 'node:worker_threads';
import { lowerThisThread } from '../util/thread-priority.ts';
import { combinePatches } from './patches.ts';
import type { MergeReply, MergeRequest } from './offload.ts';

if (!parentPort) throw new Error('the patch merger started outside a worker thread');
const port = parentPort;
// The merge a policy's patch costs yields to the main thread, as guests do.
lowerThisThread();

port.on('message', ({ id, object, patches }: MergeRequest) => {
  let reply: MergeReply;
  try {
    reply = { id, ok: true, combined: combinePatches(object, patches) };
  } catch (error) {
    reply = { id, ok: false, message: error instanceof Error ? error.message : String(error) };
  }
  port.postMessage(reply);
});
port.postMessage({ ready: true } satisfies MergeReply);
