// The name a policy gets from its module when none is given (CLI run, test, bench).
import { expect, it } from 'vitest';
import { policyNameOf } from '../../host/src/policy/source.ts';

it('is the file\'s name without .wasm, or an oci:// repository\'s last part without its tag or digest (newcomer: "p:v1")', () => {
  expect(policyNameOf('/work/policies/numbers/numbers.wasm')).toBe('numbers');
  expect(policyNameOf('numbers.wasm')).toBe('numbers');
  expect(policyNameOf('file:///tmp/a/b.wasm')).toBe('b');
  expect(policyNameOf('oci://localhost:5000/team/p:v1')).toBe('p');
  expect(policyNameOf(`oci://registry.example/p@sha256:${'a'.repeat(64)}`)).toBe('p');
  expect(policyNameOf('oci://registry.example/p')).toBe('p');
});
