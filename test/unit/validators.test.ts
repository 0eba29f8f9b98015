import { readFileSync } from 'node:fs';
import { expect, it } from 'vitest';
import { generateValidators, GENERATED } from '../../scripts/validators.ts';
import { parseConfig } from '../../host/src/config/load.ts';
import { checkInfo } from '../../host/src/policy/metadata.ts';

it('the compiled validators match the schemas (run `node scripts/validators.ts` after editing one)', () => {
  expect(readFileSync(GENERATED, 'utf8')).toBe(generateValidators());
});

it('the compiled validators refuse what the schemas refuse, with the field named', () => {
  expect(() => parseConfig('policies:\n  - { name: x, module: x.wasm, limits: { memoryMiB: 5000 } }\n', 'c.yaml')).toThrow('c.yaml: /policies/0/limits/memoryMiB must be <= 4096');
  expect(() => parseConfig('server: { port: 1, colour: red }\npolicies: []\n', 'c.yaml')).toThrow('c.yaml: /server: unknown field "colour"');
  expect(() => checkInfo({ name: 'x', modes: ['validate', 'validate'] }, 'm.wasm')).toThrow('m.wasm: /modes must NOT have duplicate items');
  expect(() => checkInfo({ description: 'é'.repeat(4097) }, 'm.wasm')).toThrow('m.wasm: /description must NOT have more than 4096 characters');
  expect(checkInfo({ name: 'x', rules: [{ operations: ['CREATE'], apiGroups: [''], apiVersions: ['v1'], resources: ['pods'] }] }, 'm.wasm').name).toBe('x');
  // A module's own rules become its webhook's when the configuration gives none: what the apiserver refuses is refused here.
  expect(() => checkInfo({ name: 'x', rules: [{ operations: ['CREATE'], apiGroups: [''], apiVersions: ['v1'], resources: ['pods/*', 'pods/status'] }] }, 'm.wasm'))
    .toThrow('m.wasm: /rules/0/resources/1: "pods/status" is already covered by "pods/*" listed before it');
});
