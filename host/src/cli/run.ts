// `portcullis run`: one policy, one review, the response review on stdout. Exit 0 whatever the
// decision; 1 when the command could not produce a decision (unreadable input, a policy that
// failed to load, crashed, timed out or returned garbage), with one line on stderr saying why.
import { readFile } from 'node:fs/promises';
import { basename } from 'node:path';
import { parseArgs } from 'node:util';
import type { JsonValue, Mode } from '@portcullis/sdk';
import { loadContext } from '../context/cli.ts';
import { evaluatePolicy } from '../evaluate/evaluate.ts';
import { ConfigError, errorMessage } from '../errors.ts';
import { merge } from '../merge/merge.ts';
import { loadPolicy } from '../policy/load.ts';
import { parseReviewText } from '../review/parse.ts';
import { respond } from '../review/respond.ts';
import { SandboxPool } from '../sandbox/pool.ts';
import { DEFAULT_LIMITS } from '../sandbox/prepare.ts';
import { UsageError } from './usage.ts';

export default async function run(args: string[]): Promise<number> {
  const values = parseCli(args);
  if (!values.policy || !values.request) {
    throw new UsageError('usage: portcullis run --policy FILE.wasm --request REVIEW.json [--settings JSON|FILE] [--mode validate|mutate] ' +
      '[--context OBJECTS.yaml [--grant apiVersion/Kind ...]]');
  }
  if (values.mode !== undefined && values.mode !== 'validate' && values.mode !== 'mutate') throw new UsageError(`--mode must be validate or mutate, not "${values.mode}"`);
  const reviewText = await readInput(values.request, 'review');
  const review = (() => {
    try {
      return parseReviewText(reviewText);
    } catch (error) {
      throw new ConfigError(`${values.request}: ${errorMessage(error)}`);
    }
  })();
  const settings = values.settings === undefined ? {} : await parseSettings(values.settings);
  const name = basename(values.policy).replace(/\.wasm$/, '');
  const limits = {
    ...DEFAULT_LIMITS,
    ...(values['timeout-ms'] ? { timeoutMs: positive(values['timeout-ms'], '--timeout-ms') } : {}),
    ...(values['memory-mib'] ? { memoryMiB: positive(values['memory-mib'], '--memory-mib') } : {}),
  };
  // Issue 15: cluster objects the policy may read, from a file instead of a cluster.
  const context = values.context === undefined ? undefined : await loadContext(values.context, values.grant ?? []);
  const pool = new SandboxPool(1);
  try {
    context?.hub.attach(pool);
    const policy = await loadPolicy(pool, {
      name, module: values.policy, settings, limits, failurePolicy: 'Fail', enforcement: 'enforce', isolation: 'reuse',
      ...(context ? { context: context.grants } : {}),
    });
    const mode: Mode = (values.mode as Mode | undefined) ?? (policy.modes.includes('validate') ? 'validate' : 'mutate');
    if (!policy.modes.includes(mode)) throw new ConfigError(`policy "${name}" (${values.policy}) does not ${mode}; it supports: ${policy.modes.join(', ')}`);
    const outcome = await evaluatePolicy(pool, policy, mode, {
      request: review.request, settings, headers: {}, sslpeer: null, dryRun: review.request.dryRun === true, webhook: `/${mode}/${name}`,
    });
    const { decision } = merge([{ policy, outcome }], review.request.operation, review.request.object);
    process.stdout.write(`${JSON.stringify(respond(review.apiVersion, review.request.uid, decision), null, 2)}\n`);
    if (outcome.status === 'failed') {
      process.stderr.write(`portcullis run: policy "${name}" (${values.policy}) failed on request ${review.request.uid}: ${outcome.message}\n`);
      return 1;
    }
    return 0;
  } finally {
    await pool.close();
  }
}

function parseCli(args: string[]) {
  try {
    return parseArgs({
      args,
      options: {
        policy: { type: 'string' }, request: { type: 'string' }, settings: { type: 'string' }, mode: { type: 'string' },
        'timeout-ms': { type: 'string' }, 'memory-mib': { type: 'string' },
        context: { type: 'string' }, grant: { type: 'string', multiple: true },
      },
    }).values;
  } catch (error) {
    throw new UsageError((error as Error).message);
  }
}

async function readInput(path: string, what: string): Promise<string> {
  try {
    return path === '-' ? await readStdin() : await readFile(path, 'utf8');
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    throw new ConfigError(`cannot read the ${what} ${path}: ${code === 'ENOENT' ? 'no such file' : errorMessage(error)}`);
  }
}

async function readStdin(): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString('utf8');
}

/** --settings takes inline JSON or the path of a JSON file. */
async function parseSettings(value: string): Promise<JsonValue> {
  const trimmed = value.trim();
  if (/^[[{"]/.test(trimmed) || /^(true|false|null|-?\d)/.test(trimmed)) {
    try {
      return JSON.parse(trimmed) as JsonValue;
    } catch (error) {
      throw new ConfigError(`--settings is not valid JSON: ${errorMessage(error)}`);
    }
  }
  const text = await readInput(value, 'settings file');
  try {
    return JSON.parse(text) as JsonValue;
  } catch (error) {
    throw new ConfigError(`--settings file ${value} is not valid JSON: ${errorMessage(error)}`);
  }
}

function positive(value: string, flag: string): number {
  const n = Number(value);
  if (!Number.isFinite(n) || n <= 0) throw new UsageError(`${flag} must be a positive number`);
  return n;
}
