// The thread that reads a large configuration file (yaml.ts readYamlBounded): whatever the file
// costs to read, it costs this thread's time and heap, which the host bounds and then ends.
import { parentPort, workerData } from 'node:worker_threads';
import { errorMessage } from '../errors.ts';
import { MAX_READ_JSON_CHARS, NotJson, readJsonYaml, YamlProblem, type ReadReply } from './yaml.ts';

if (!parentPort) throw new Error('the configuration reader started outside a worker thread');
let reply: ReadReply;
try {
  const json = JSON.stringify(readJsonYaml(workerData as string));
  // Parsed again on the main thread: aliases can make a small file a large value.
  reply = json.length > MAX_READ_JSON_CHARS
    ? { ok: false, kind: 'bound', message: `it expands to more than ${MAX_READ_JSON_CHARS / 2 ** 20} Mi characters of JSON (aliases repeat what they name); it is refused` }
    : { ok: true, json };
} catch (error) {
  // A stack overflow is how the deepest nesting ends (the heap limit, how the widest does).
  if (error instanceof YamlProblem) reply = { ok: false, kind: 'yaml', message: error.message };
  else if (error instanceof NotJson) reply = { ok: false, kind: 'json', message: error.message };
  else reply = { ok: false, kind: 'bound', message: error instanceof RangeError ? `it is nested too deeply to read (${error.message})` : errorMessage(error) };
}
parentPort.postMessage(reply);
