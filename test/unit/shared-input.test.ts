import { expect, it } from 'vitest';
import { sharedInput } from '../../host/src/evaluate/evaluate.ts';
import type { LoadedPolicy } from '../../host/src/policy/loaded.ts';
import { joinInput, joinInputBytes } from '../../host/src/sandbox/input.ts';
import { request } from '@portcullis/sdk/testing';

const policy = (settings: unknown) => ({ settings }) as LoadedPolicy;

it('encodes a review once and joins each policy\'s settings in front, as text and as bytes', () => {
  const input = { request: request({ object: { metadata: { name: 'café-ü' } } }), settings: null, headers: { a: 'b' }, sslpeer: null, dryRun: false, webhook: '/validate' };
  const a = sharedInput(input, policy({ x: 1 }));
  const b = sharedInput(input, policy({ y: 'ä' }));
  expect(a.envelope).toBe(b.envelope);
  expect(a.envelope.buffer).toBeInstanceOf(SharedArrayBuffer);
  expect(JSON.parse(joinInput(a))).toEqual({ ...input, settings: { x: 1 } });
  expect(JSON.parse(new TextDecoder().decode(joinInputBytes(b)))).toEqual({ ...input, settings: { y: 'ä' } });
});

it('handles an empty envelope', () => {
  const envelope = new Uint8Array(new SharedArrayBuffer(2));
  envelope.set(new TextEncoder().encode('{}'));
  expect(joinInput({ envelope, settings: '{"a":1}' })).toBe('{"settings":{"a":1}}');
  expect(new TextDecoder().decode(joinInputBytes({ envelope, settings: '{"a":1}' }))).toBe('{"settings":{"a":1}}');
});
