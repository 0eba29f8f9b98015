// The typed result of evaluating one policy, and the validation of what a guest returned.
// Guest output is untrusted: anything not in the contract's shape is a crash of that policy.
import type { PatchOperation } from '@portcullis/sdk';
import { PortcullisError } from '../errors.ts';

/**
 * Why a policy failed, in merge priority order after an explicit denial:
 *  permanent (the policy says it cannot decide) > temporary (it says retry later, or it hit
 *  a CPU/memory/output cap) > crash (uncaught exception, trap, malformed output).
 */
export type FailureKind = 'permanent' | 'temporary' | 'crash';

interface Common {
  policy: string;
  warnings: string[];
  /** Time inside the guest, and the whole call including the hop into the sandbox (µs). */
  guestMicros?: number;
  totalMicros?: number;
}

export type Outcome =
  | (Common & { status: 'allowed'; patch: PatchOperation[] })
  | (Common & { status: 'denied'; code: number; message: string })
  | (Common & { status: 'failed'; failure: FailureKind; message: string });

const OPS = new Set(['add', 'remove', 'replace', 'move', 'copy', 'test']);

export class MalformedOutput extends PortcullisError {
  constructor(message: string) {
    super('MALFORMED_OUTPUT', message);
  }
}

export function decodeOutput(policy: string, text: string): Outcome {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw new MalformedOutput(`returned output that is not JSON (${preview(text)})`);
  }
  if (!isObject(value)) throw new MalformedOutput('returned output that is not a JSON object');
  const warnings = decodeWarnings(value.warnings);
  switch (value.outcome) {
    case 'allow':
      return { policy, status: 'allowed', warnings, patch: decodePatch(value.patch) };
    case 'deny': {
      const code = value.code === undefined ? 403 : value.code;
      if (typeof code !== 'number' || !Number.isInteger(code) || code < 100 || code > 599) {
        throw new MalformedOutput(`returned a denial with an invalid HTTP code ${JSON.stringify(code)}`);
      }
      return { policy, status: 'denied', code, message: decodeMessage(value.message), warnings };
    }
    case 'error': {
      const kind = value.kind;
      const failure = kind === 'permanent' || kind === 'temporary' ? kind : 'crash';
      return { policy, status: 'failed', failure, message: decodeMessage(value.message), warnings };
    }
    default:
      throw new MalformedOutput(`returned an unknown outcome ${preview(JSON.stringify(value.outcome) ?? 'undefined')}`);
  }
}

function decodeWarnings(value: unknown): string[] {
  if (value === undefined) return [];
  if (!Array.isArray(value) || !value.every((w) => typeof w === 'string')) throw new MalformedOutput('returned warnings that are not a list of strings');
  return value;
}

function decodeMessage(value: unknown): string {
  if (value === undefined) return '';
  if (typeof value !== 'string') throw new MalformedOutput('returned a message that is not a string');
  return value;
}

function decodePatch(value: unknown): PatchOperation[] {
  if (value === undefined) return [];
  if (!Array.isArray(value)) throw new MalformedOutput('returned a patch that is not a list of operations');
  for (const op of value) {
    if (!isObject(op) || typeof op.op !== 'string' || !OPS.has(op.op) || typeof op.path !== 'string') {
      throw new MalformedOutput(`returned an invalid patch operation ${preview(JSON.stringify(op))}`);
    }
    if (op.path !== '' && !op.path.startsWith('/')) throw new MalformedOutput(`returned a patch path that is not a JSON pointer: ${preview(op.path)}`);
    if ((op.op === 'move' || op.op === 'copy') && typeof op.from !== 'string') throw new MalformedOutput(`returned a ${op.op} without "from"`);
    if ((op.op === 'add' || op.op === 'replace' || op.op === 'test') && !('value' in op)) throw new MalformedOutput(`returned an ${op.op} without "value"`);
  }
  return value as PatchOperation[];
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function preview(text: string): string {
  return text.length > 80 ? `${text.slice(0, 80)}…` : text;
}
