// Shared helpers for tests that load real policy .wasm files into a real sandbox pool.
import { fileURLToPath } from 'node:url';
import type { AdmissionRequest, EvaluationInput, JsonValue } from '@portcullis/sdk';
import { request } from '@portcullis/sdk/testing';
import { loadPolicy } from '../../host/src/policy/load.ts';
import type { LoadedPolicy, PolicyOptions } from '../../host/src/policy/loaded.ts';
import type { SandboxPool } from '../../host/src/sandbox/pool.ts';
import { DEFAULT_LIMITS } from '../../host/src/config/limits.ts';

export const root = fileURLToPath(new URL('../..', import.meta.url));

/** Path of a built example policy (policies/NAME) or test fixture (test/fixtures/policies/NAME). */
export function wasm(name: string): string {
  const examples = ['numbers', 'no-delete', 'added-by', 'resources-oversell', 'require-labels', 'show-auth'];
  return examples.includes(name) ? `${root}policies/${name}/${name}.wasm` : `${root}test/fixtures/policies/${name}/${name}.wasm`;
}

export function options(name: string, overrides: Partial<PolicyOptions> & { file?: string } = {}): PolicyOptions {
  const { file, ...rest } = overrides;
  return {
    name, module: wasm(file ?? name), settings: {}, limits: DEFAULT_LIMITS,
    failurePolicy: 'Fail', enforcement: 'enforce', isolation: 'reuse', ...rest,
  };
}

export function load(pool: SandboxPool, name: string, overrides: Partial<PolicyOptions> & { file?: string } = {}): Promise<LoadedPolicy> {
  return loadPolicy(pool, options(name, overrides));
}

export function input(overrides: Partial<AdmissionRequest> = {}, settings: JsonValue = {}): EvaluationInput {
  return { request: request(overrides), settings, headers: {}, sslpeer: null, dryRun: false, webhook: '/validate' };
}
