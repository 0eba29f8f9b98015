// Reads the configuration's YAML into a JSON value, bounded in time and memory. The yaml
// package checks that a map's keys are unique in time that grows with the square of their
// number, resolves each alias by a scan of every anchor and alias before it (quadratic again),
// and builds its whole tree before it finds nesting too deep for it: red team 12, a settings map
// of 36,000 keys (1 MB) took the main thread 48 s to reload, and 8 MiB of `[[[...` ran the heap
// out and ended the process, while reviews waited; red team 13, 21,000 aliases in 64 KB, 5 s.
// Keys are checked here in one pass instead, and a file of READ_APART_FROM_BYTES or more, or
// with more than MAX_ALIASES_HERE aliases, is read on a thread of its own with a heap, a stack
// and a time limit: such a file is refused, never a stall.
import { extname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';
import { type Document, isAlias, isCollection, isScalar, LineCounter, parseDocument, visit } from 'yaml';
import { errorMessage } from '../errors.ts';
import { nonJsonValue } from './json-values.ts';

/** Far more than any configuration: a ConfigMap holds at most 1 MiB. */
export const MAX_CONFIG_BYTES = 8 * 2 ** 20;
/** Files from this size are read on a thread of their own (~60 ms to start it; real ones are a few KB, ~10 ms here at most). */
export const READ_APART_FROM_BYTES = 16 * 2 ** 10;
/** Aliases a file read on this thread may hold: resolving each scans those before it. */
const MAX_ALIASES_HERE = 64;
/** Longest a file may take to read there; a 1 MB map of 36,000 keys takes ~0.6 s. */
const MAX_READ_MS = 10_000;
/** That thread's heap, far above what a file of MAX_CONFIG_BYTES of plain maps and lists needs. */
const READ_HEAP_MIB = 256;
/** Aliases a file may expand: the yaml package's default, which refuses a "billion laughs" file. */
const MAX_ALIAS_COUNT = 100;
/** Longest JSON the reading thread hands back (aliases expand; red team 13: 400 KB gave 38 MiB). */
export const MAX_READ_JSON_CHARS = 2 * MAX_CONFIG_BYTES;

/** A YAML file's problem, as the yaml package words it (load.ts yamlProblem shortens it). */
export class YamlProblem extends Error {}
/** A value YAML can say and JSON cannot (nonJsonValue's message). */
export class NotJson extends Error {}
/** A file the reading thread gave up on: its time, its heap, its stack, its size once read. */
export class ReadRefused extends Error {}
/** The host could not read the file at all (its reading thread did not start): not the file's fault. */
export class ReaderFailed extends Error {}

/** A parsed document, its keys checked; `aliases`: how many it holds. */
function parsed(text: string): { doc: Document; aliases: number } {
  const lineCounter = new LineCounter();
  const doc = parseDocument(text, { uniqueKeys: false, lineCounter });
  const [error] = doc.errors;
  if (error) throw new YamlProblem(error.message);
  let problem: { message: string; offset: number } | undefined;
  let aliases = 0;
  visit(doc, {
    Alias() {
      aliases++;
    },
    Map(_, map) {
      const seen = new Set<string>();
      for (const { key } of map.items) {
        const offset = (isScalar(key) || isAlias(key) || isCollection(key) ? key.range?.[0] : undefined) ?? map.range?.[0] ?? 0;
        // As toJS names it: an alias by what it stands for, null (`~`, or nothing) as "".
        const named = isAlias(key) ? key.resolve(doc) : key;
        if (isCollection(named)) {
          problem = { message: 'Map keys must be strings, numbers or booleans; a list or a map as a key has no JSON form', offset };
          return visit.BREAK;
        }
        const name = keyName(isScalar(named) ? named.value : named);
        if (seen.has(name)) {
          problem = { message: `Map keys must be unique; "${name.length > 80 ? `${name.slice(0, 80)}…` : name}" is given twice`, offset };
          return visit.BREAK;
        }
        seen.add(name);
      }
      return undefined;
    },
  });
  if (problem) {
    const { line, col } = lineCounter.linePos(problem.offset);
    throw new YamlProblem(`${problem.message}, at line ${line}, column ${col}`);
  }
  return { doc, aliases };
}

/** A scalar key's name in JSON: null (`~`, or no key) is "". */
function keyName(value: unknown): string {
  if (value === null || value === undefined) return '';
  if (typeof value === 'string') return value;
  return typeof value === 'number' || typeof value === 'boolean' || typeof value === 'bigint' ? String(value) : JSON.stringify(value) ?? '';
}

/**
 * The document's value, or a YamlProblem. Every map's keys are unique as JSON keys: `1` and
 * `"1"` are the same key once the settings reach a policy as JSON.
 */
export function readYaml(text: string): unknown {
  return valueOf(parsed(text).doc);
}

function valueOf(doc: Document): unknown {
  try {
    return doc.toJS({ maxAliasCount: MAX_ALIAS_COUNT }) as unknown;
  } catch (error) {
    // Its own words for too many aliases ("Excessive alias count…"); a stack overflow stays one.
    if (error instanceof RangeError) throw error;
    throw new YamlProblem(errorMessage(error));
  }
}

/** readYaml and nonJsonValue: the value, or a YamlProblem or NotJson. */
export function readJsonYaml(text: string): unknown {
  return jsonValueOf(parsed(text).doc);
}

function jsonValueOf(doc: Document): unknown {
  const value = valueOf(doc);
  const problem = nonJsonValue(value);
  if (problem) throw new NotJson(problem);
  return value;
}

/** What the reading thread answers: the value as JSON text, or why not. */
export type ReadReply = { ok: true; json: string } | { ok: false; message: string; kind: 'yaml' | 'json' | 'bound' };

/**
 * readJsonYaml, on this thread for a short text with few aliases and on a thread of its own
 * otherwise. Rejects with a YamlProblem for bad YAML, a NotJson for a value JSON cannot hold, a
 * ReadRefused past the thread's bounds (on this thread, a stack overflow is the yaml package's
 * RangeError), a ReaderFailed when the thread could not run at all.
 */
export async function readYamlBounded(text: string, limits: { ms?: number; heapMiB?: number } = {}): Promise<unknown> {
  if (Buffer.byteLength(text) < READ_APART_FROM_BYTES) {
    const { doc, aliases } = parsed(text);
    if (aliases <= MAX_ALIASES_HERE) return jsonValueOf(doc);
  }
  const reply = await readApart(text, limits.ms ?? MAX_READ_MS, limits.heapMiB ?? READ_HEAP_MIB);
  if (!reply.ok) throw reply.kind === 'yaml' ? new YamlProblem(reply.message) : reply.kind === 'json' ? new NotJson(reply.message) : new ReadRefused(reply.message);
  return JSON.parse(reply.json) as unknown;
}

/** How a worker fails to start at all. */
const STARTING = new Set(['MODULE_NOT_FOUND', 'ERR_MODULE_NOT_FOUND', 'ERR_WORKER_INIT_FAILED', 'ERR_WORKER_PATH']);

const REFUSED_WHY = 'is it far larger or more deeply nested than a configuration needs to be?';

function readApart(text: string, ms: number, heapMiB: number): Promise<ReadReply> {
  return new Promise((resolve, reject) => {
    // yaml-worker.ts in the checkout, yaml-worker.js in the installed package.
    const worker = new Worker(new URL(`./yaml-worker${extname(fileURLToPath(import.meta.url))}`, import.meta.url), {
      workerData: text, stdout: false, stderr: false,
      resourceLimits: { maxOldGenerationSizeMb: heapMiB, maxYoungGenerationSizeMb: 32, stackSizeMb: 4 },
    });
    let settled = false;
    const settle = (reply: ReadReply | ReaderFailed) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      void worker.terminate();
      if (reply instanceof ReaderFailed) reject(reply);
      else resolve(reply);
    };
    const timer = setTimeout(() => settle({ ok: false, kind: 'bound', message: `reading it took longer than ${ms / 1000} s; it is refused (${REFUSED_WHY})` }), ms);
    worker.once('message', (reply: ReadReply) => settle(reply));
    worker.once('error', (error: Error & { code?: string }) => {
      if (error.code === 'ERR_WORKER_OUT_OF_MEMORY') {
        settle({ ok: false, kind: 'bound', message: `reading it needed more than ${heapMiB} MiB; it is refused (${REFUSED_WHY})` });
      } else if (STARTING.has(error.code ?? '')) {
        // A reader that cannot start (its file missing from a package) is the host's fault, not the file's.
        settle(new ReaderFailed(`the host could not start its configuration reader (${errorMessage(error)}); this is a fault of the installation, not of the file`));
      } else {
        settle({ ok: false, kind: 'bound', message: `it could not be read: ${errorMessage(error)}` });
      }
    });
    worker.once('exit', (code) => settle({ ok: false, kind: 'bound', message: `it could not be read (the reading thread stopped, exit code ${code})` }));
  });
}
