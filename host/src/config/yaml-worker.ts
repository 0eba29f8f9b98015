// The thread that reads a large configuration file (yaml.ts readYamlBounded): whatever the file
// costs to read, it costs this thread's time and heap, which the host bounds and then ends.
import { parentPort, workerData } from 'node:worker_threads';
import { errorMessage } from '../errors.ts';
import { nonJsonValue } from './json-values.ts';
import { readYaml, YamlProblem, type ReadReply } from './yaml.ts';

if (!parentPort) throw new Error('the configuration reader started outside a worker thread');
let reply: ReadReply;
try {
  const value = readYaml(workerData as string);
  const problem = nonJsonValue(value);
  reply = problem ? { ok: false, kind: 'json', message: problem } : { ok: true, json: JSON.stringify(value) };
} catch (error) {
  // A stack overflow is how the deepest nesting ends (the heap limit, how the widest does).
  const message = error instanceof RangeError ? `it is nested too deeply to read (${error.message})` : errorMessage(error);
  reply = { ok: false, kind: error instanceof YamlProblem ? 'yaml' : 'bound', message };
}
parentPort.postMessage(reply);
