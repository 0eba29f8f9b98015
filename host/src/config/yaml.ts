// Reads the configuration's YAML into a JSON value, bounded in time and memory. The yaml
// package checks that a map's keys are unique in time that grows with the square of their
// number, and builds its whole tree before it finds nesting too deep for it: red team 12, a
// settings map of 36,000 keys (1 MB) took the main thread 48 s to reload, a flat list of 8 MiB
// 47 s, and 8 MiB of `[[[...` ran the heap out and ended the process, while reviews waited. Keys
// are checked here in one pass instead, and a file of READ_APART_FROM_BYTES or more is read on a
// thread of its own with a heap, a stack and a time limit: such a file is refused, never a stall.
import { extname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';
import { isScalar, LineCounter, parseDocument, visit } from 'yaml';
import { errorMessage } from '../errors.ts';
import { nonJsonValue } from './json-values.ts';

/** Files from this size are read on a thread of their own (~60 ms to start it; real ones are a few KB). */
export const READ_APART_FROM_BYTES = 64 * 2 ** 10;
/** Longest a file may take to read there; a 1 MB map of 36,000 keys takes ~0.6 s. */
export const MAX_READ_MS = 10_000;
/** That thread's heap, far above what a file of MAX_CONFIG_BYTES of plain maps and lists needs. */
const READ_HEAP_MIB = 256;
/** Aliases a file may expand: the yaml package's default, which refuses a "billion laughs" file. */
const MAX_ALIAS_COUNT = 100;

/** A YAML file's problem, as the yaml package words it (load.ts yamlProblem shortens it). */
export class YamlProblem extends Error {}
/** A value YAML can say and JSON cannot (nonJsonValue's message). */
export class NotJson extends Error {}
/** A file the reading thread gave up on: its time, its heap, its stack. */
export class ReadRefused extends Error {}

/**
 * The document's value, or a YamlProblem. Every map's keys are unique as JSON keys: `1` and
 * `"1"` are the same key once the settings reach a policy as JSON.
 */
export function readYaml(text: string): unknown {
  const lineCounter = new LineCounter();
  const doc = parseDocument(text, { uniqueKeys: false, lineCounter });
  const [error] = doc.errors;
  if (error) throw new YamlProblem(error.message);
  let twice: { key: string; offset: number } | undefined;
  visit(doc, {
    Map(_, map) {
      const seen = new Set<string>();
      for (const { key } of map.items) {
        const name = isScalar(key) ? String(key.value) : String(key);
        if (seen.has(name)) {
          twice = { key: name, offset: (isScalar(key) ? key.range?.[0] : undefined) ?? map.range?.[0] ?? 0 };
          return visit.BREAK;
        }
        seen.add(name);
      }
      return undefined;
    },
  });
  if (twice) {
    const { line, col } = lineCounter.linePos(twice.offset);
    throw new YamlProblem(`Map keys must be unique; "${twice.key.length > 80 ? `${twice.key.slice(0, 80)}…` : twice.key}" is given twice, at line ${line}, column ${col}`);
  }
  return doc.toJS({ maxAliasCount: MAX_ALIAS_COUNT }) as unknown;
}

/** What the reading thread answers: the value as JSON text, or why not. */
export type ReadReply = { ok: true; json: string } | { ok: false; message: string; kind: 'yaml' | 'json' | 'bound' };

/**
 * readYaml, then nonJsonValue, on this thread for a short text and on a thread of its own from
 * READ_APART_FROM_BYTES. Rejects with a YamlProblem for bad YAML, a NotJson for a value JSON
 * cannot hold, a ReadRefused past the thread's bounds (on this thread, a stack overflow is the
 * yaml package's RangeError).
 */
export async function readYamlBounded(text: string, limits: { ms?: number; heapMiB?: number } = {}): Promise<unknown> {
  if (Buffer.byteLength(text) < READ_APART_FROM_BYTES) {
    const value = readYaml(text);
    const problem = nonJsonValue(value);
    if (problem) throw new NotJson(problem);
    return value;
  }
  const reply = await readApart(text, limits.ms ?? MAX_READ_MS, limits.heapMiB ?? READ_HEAP_MIB);
  if (!reply.ok) throw reply.kind === 'yaml' ? new YamlProblem(reply.message) : reply.kind === 'json' ? new NotJson(reply.message) : new ReadRefused(reply.message);
  return JSON.parse(reply.json) as unknown;
}

function readApart(text: string, ms: number, heapMiB: number): Promise<ReadReply> {
  return new Promise((resolve) => {
    // yaml-worker.ts in the checkout, yaml-worker.js in the installed package.
    const worker = new Worker(new URL(`./yaml-worker${extname(fileURLToPath(import.meta.url))}`, import.meta.url), {
      workerData: text, stdout: false, stderr: false,
      resourceLimits: { maxOldGenerationSizeMb: heapMiB, maxYoungGenerationSizeMb: 32, stackSizeMb: 4 },
    });
    let settled = false;
    const settle = (reply: ReadReply) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      void worker.terminate();
      resolve(reply);
    };
    const timer = setTimeout(() => settle({ ok: false, kind: 'bound', message: `reading it took longer than ${ms / 1000} s; it is refused (is it far larger or more deeply nested than a configuration needs to be?)` }), ms);
    worker.once('message', (reply: ReadReply) => settle(reply));
    worker.once('error', (error: Error & { code?: string }) => settle({
      ok: false, kind: 'bound',
      message: error.code === 'ERR_WORKER_OUT_OF_MEMORY'
        ? `reading it needed more than ${heapMiB} MiB; it is refused (is it far larger or more deeply nested than a configuration needs to be?)`
        : `it could not be read: ${errorMessage(error)}`,
    }));
    worker.once('exit', (code) => settle({ ok: false, kind: 'bound', message: `it could not be read (the reading thread stopped, exit code ${code})` }));
  });
}
