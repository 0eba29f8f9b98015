// The metering of a component's core modules (metering.ts), in a thread of its own: the walk
// over every instruction takes 65-130 ms for QuickJS's 1.3 MB on this project's VMs, and the
// main thread, which asked for it (inline-lane.ts), answers reviews meanwhile. Each metered copy
// is walked once more here (code-walk.ts), as every module is before the host compiles it, so
// that the compile needs no walk of its own on the main thread.
import { parentPort, workerData } from 'node:worker_threads';
import { checkCodeSection } from './code-walk.ts';
import { readLayout } from './memory-cap.ts';
import { meterModule, type Metering } from './metering.ts';
import { lowerThisThread } from '../util/thread-priority.ts';

if (!parentPort) throw new Error('the metering thread started outside a worker thread');
// Nobody waits on it: it yields to the workers too (as the copies' compile trials do).
lowerThisThread(19);

const modules = workerData as Uint8Array<ArrayBuffer>[];
const answers: Metering[] = modules.map((bytes) => {
  try {
    const metering = meterModule(bytes);
    if (!('bytes' in metering)) return metering;
    const { codeSection } = readLayout(metering.bytes);
    if (codeSection) checkCodeSection(metering.bytes, codeSection.start, codeSection.end);
    return metering;
  } catch (error) {
    return { unmetered: error instanceof Error ? error.message : String(error) };
  }
});
parentPort.postMessage(answers, answers.flatMap((a) => ('bytes' in a ? [a.bytes.buffer] : [])));
