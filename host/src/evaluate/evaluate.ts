// Evaluates one loaded policy against one request in the sandbox pool and returns a typed
// Outcome. Sandbox faults become failures here: caps and deadlines are temporary, traps and
// garbage are crashes. It never throws for anything a guest does.
import type { EvaluationInput, Mode } from '@portcullis/sdk';
import type { LoadedPolicy } from '../policy/loaded.ts';
import type { CallResult, SandboxPool } from '../sandbox/pool.ts';
import { decodeOutput, MalformedOutput, type Outcome } from './outcome.ts';

export async function evaluatePolicy(pool: SandboxPool, policy: LoadedPolicy, mode: Mode, input: EvaluationInput | string): Promise<Outcome> {
  const payload = typeof input === 'string' ? input : serializeInput(input, policy);
  const result = await pool.call(policy.key, mode, payload, policy.limits.timeoutMs);
  return toOutcome(policy.name, result);
}

/** The envelope with this policy's settings. Serialized per policy because settings differ. */
export function serializeInput(input: EvaluationInput, policy: LoadedPolicy): string {
  return JSON.stringify({ ...input, settings: policy.settings });
}

export function toOutcome(policy: string, result: CallResult): Outcome {
  const timing = { totalMicros: result.totalMicros, ...(result.ok ? { guestMicros: result.guestMicros } : {}) };
  if (!result.ok) {
    const failure = result.fault === 'deadline' || result.fault === 'memory' || result.fault === 'output' ? 'temporary' : 'crash';
    return { policy, status: 'failed', failure, message: result.message, warnings: [], ...timing };
  }
  try {
    return { ...decodeOutput(policy, result.output), ...timing };
  } catch (error) {
    if (!(error instanceof MalformedOutput)) throw error;
    return { policy, status: 'failed', failure: 'crash', message: error.message, warnings: [], ...timing };
  }
}
