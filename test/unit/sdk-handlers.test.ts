// What a handler returns: nothing allows; anything else fails the evaluation (never allows).
import { expect, it } from 'vitest';
import { AdmissionError, definePolicy, type PolicyDefinition } from '@portcullis/sdk';
import { request } from '@portcullis/sdk/testing';

const input = JSON.stringify({ request: request({ object: { metadata: { name: 'x' } } }), settings: {}, headers: {}, sslpeer: null, dryRun: false, webhook: '/validate' });
const run = (definition: unknown, mode: 'validate' | 'mutate' = 'validate'): unknown => JSON.parse(definePolicy(definition as PolicyDefinition)[mode](input));

it('fails, never allows, when an async validate throws AdmissionError (red team: it allowed)', async () => {
  const output = run({ async validate() { throw new AdmissionError('no'); } });
  expect(output).toEqual({ outcome: 'error', kind: 'permanent', message: expect.stringMatching(/^validate returned a Promise: handlers must be synchronous/) as unknown });
  await new Promise((resolve) => setTimeout(resolve, 10)); // the rejection was handled: no unhandled rejection fails this file
});

it('fails when a handler returns a value, such as a predicate\'s false', () => {
  expect(run({ validate: () => false })).toEqual({ outcome: 'error', kind: 'permanent', message: 'validate returned false: return nothing to allow, throw AdmissionError to deny' });
  expect(run({ mutate: async () => undefined }, 'mutate')).toMatchObject({ outcome: 'error', message: expect.stringMatching(/^mutate returned a Promise/) as unknown });
});

it('allows when it returns nothing, and denies when it throws', () => {
  expect(run({ validate() {} })).toEqual({ outcome: 'allow' });
  expect(run({ validate() { throw new AdmissionError('no', 418); } })).toEqual({ outcome: 'deny', code: 418, message: 'no' });
});

it('says so at the type check too: an async or value-returning handler does not typecheck, one returning nothing does', () => {
  const typed = definePolicy({
    validate({ object }) {
      if (!object) throw new AdmissionError('no object');
    },
    mutate({ patch }) {
      patch.set(['metadata', 'labels', 'a'], '1');
    },
  });
  // @ts-expect-error an async handler returns a Promise, not undefined
  definePolicy({ async validate() {} });
  // @ts-expect-error a predicate returns a boolean
  definePolicy({ validate: () => false });
  expect(typed.metadata()).toBe('{"modes":["validate","mutate"],"settings":false,"input":["objects-apart","nested-apart"]}');
});
