// The host's API (@portcullis/host) gives outcomes whose patch is operations, from evaluatePolicy
// and back from merge: the text form the host uses inside (sandbox/outcome.ts PATCH_TEXT_FROM)
// stays inside (review: merge's result was typed with it). Checked by the compiler (tsc runs over
// the tests) and at run time.
import { expect, it } from 'vitest';
import { merge, type Evaluated, type Outcome } from '../../host/src/index.ts';

it('merge gives back the outcomes it was given, typed as the API\'s', () => {
  const patched: Outcome = { policy: 'a', status: 'allowed', warnings: [], patch: [{ op: 'add', path: '/metadata/labels/x', value: 'y' }] };
  const denied: Outcome = { policy: 'b', status: 'denied', code: 403, message: 'no', warnings: [] };
  const audited: Outcome = { policy: 'c', status: 'allowed', warnings: [], patch: [{ op: 'remove', path: '/spec/x' }] };
  const evaluated: Evaluated[] = [
    { policy: { name: 'a', failurePolicy: 'Fail', enforcement: 'enforce' }, outcome: patched },
    { policy: { name: 'b', failurePolicy: 'Fail', enforcement: 'enforce' }, outcome: denied },
    { policy: { name: 'c', failurePolicy: 'Fail', enforcement: 'audit' }, outcome: audited },
  ];
  const result = merge(evaluated, 'CREATE', { metadata: { labels: {} }, spec: { x: 1 } });
  const deciding: Outcome | undefined = result.deciding;
  expect(deciding).toBe(denied);
  // Iterable as operations: a compile error if the API's type let text through.
  const operations = result.audited.flatMap((o) => (o.status === 'allowed' ? [...o.patch] : []));
  expect(operations).toEqual([{ op: 'remove', path: '/spec/x' }]);
  expect(result.decision).toMatchObject({ allowed: false, patch: [] });
});
