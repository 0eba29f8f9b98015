// The policy sets the benchmarks load, and the configuration files `portcullis serve` gets for
// them. Every policy gets rules that match the benchmark's Pod CREATE, so it is evaluated.
import { writeFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import type { JsonValue } from '@portcullis/sdk';

export const root = fileURLToPath(new URL('..', import.meta.url));

export type Example = 'numbers' | 'no-delete' | 'added-by' | 'resources-oversell' | 'require-labels' | 'show-auth';

export interface BenchPolicy {
  name: string;
  module: Example;
  settings?: JsonValue;
}

/** Language of each example: AssemblyScript (core module) or TypeScript (QuickJS component). */
export const LANGUAGE: Record<Example, 'AS' | 'TS'> = {
  'numbers': 'TS', 'no-delete': 'AS', 'added-by': 'AS', 'resources-oversell': 'TS', 'require-labels': 'TS', 'show-auth': 'TS',
};

export const SETTINGS: Record<Example, JsonValue | undefined> = {
  'numbers': undefined, 'no-delete': undefined, 'show-auth': undefined,
  'added-by': { value: 'portcullis' },
  'resources-oversell': { cpuFactor: 0.5, memoryFactor: 0.5 },
  'require-labels': { labels: { team: 'unowned' } },
};

export function modulePath(module: Example): string {
  return `${root}policies/${module}/${module}.wasm`;
}

const example = (name: string, module: Example = name as Example, settings = SETTINGS[module]): BenchPolicy =>
  ({ name, module, ...(settings !== undefined ? { settings } : {}) });

export const ONE_AS = [example('no-delete')];
export const ONE_TS = [example('require-labels')];

/** Ten validating policies, 4 AssemblyScript + 6 TypeScript, as one /validate webhook. */
export const MIXED_10: BenchPolicy[] = [
  example('no-delete-1', 'no-delete'), example('numbers-1', 'numbers'), example('require-labels-1', 'require-labels'),
  example('show-auth-1', 'show-auth'), example('no-delete-2', 'no-delete'), example('numbers-2', 'numbers'),
  example('no-delete-3', 'no-delete'), example('require-labels-2', 'require-labels'), example('show-auth-2', 'show-auth'),
  example('no-delete-4', 'no-delete'),
];

/** Five mutating policies (1 AS + 4 TS) on /mutate; four of them patch the Pod. */
export const MUTATE_5: BenchPolicy[] = [
  example('added-by'), example('resources-oversell'), example('require-labels'),
  example('require-env-label', 'require-labels', { labels: { env: 'production' } }), example('numbers'),
];

/** The six examples under `count` different names: distinct sandboxes. */
export function many(count: number): BenchPolicy[] {
  const modules = Object.keys(LANGUAGE) as Example[];
  return Array.from({ length: count }, (_, i) => {
    const module = modules[i % modules.length]!;
    return example(`p${String(i + 1).padStart(2, '0')}-${module}`, module);
  });
}

/** `count` copies of one module under distinct names (for memory per loaded policy). */
export function copies(module: Example, count: number, prefix: string): BenchPolicy[] {
  return Array.from({ length: count }, (_, i) => example(`${prefix}-${i + 1}`, module));
}

const POD_RULES = [{ operations: ['CREATE', 'UPDATE'], apiGroups: [''], apiVersions: ['v1'], resources: ['pods'] }];

/** A configuration file (JSON is YAML) with absolute module paths. */
export async function writeConfig(file: string, policies: BenchPolicy[], extra: Record<string, unknown> = {}): Promise<string> {
  const config = {
    server: { host: '127.0.0.1', tls: { mode: 'self-signed', hostnames: ['localhost', '127.0.0.1'] } },
    ...extra,
    policies: policies.map((p) => ({
      name: p.name, module: modulePath(p.module), ...(p.settings !== undefined ? { settings: p.settings } : {}), rules: POD_RULES,
    })),
  };
  await writeFile(file, `${JSON.stringify(config, null, 2)}\n`);
  return file;
}
