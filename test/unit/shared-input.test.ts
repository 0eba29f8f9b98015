import { describe, expect, it } from 'vitest';
import { rawEnvelope, sharedInput } from '../../host/src/evaluate/evaluate.ts';
import { requestSpan } from '../../host/src/review/scan.ts';
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
  // The encoded envelope is kept on the input itself, out of sight: not listed, copied or serialized.
  expect(Object.keys(input)).toEqual(['request', 'settings', 'headers', 'sslpeer', 'dryRun', 'webhook']);
  expect(Object.getOwnPropertySymbols({ ...input })).toEqual([]);
  expect(JSON.parse(JSON.stringify(input))).toEqual(JSON.parse(joinInput({ ...a, settings: 'null' })));
});

it('handles an empty envelope', () => {
  const envelope = new Uint8Array(new SharedArrayBuffer(2));
  envelope.set(new TextEncoder().encode('{}'));
  expect(joinInput({ envelope, settings: '{"a":1}' })).toBe('{"settings":{"a":1}}');
  expect(new TextDecoder().decode(joinInputBytes({ envelope, settings: '{"a":1}' }))).toBe('{"settings":{"a":1}}');
});

describe('issue 14: the request reaches guests as the body\'s own bytes', () => {
  const body = (text: string) => Buffer.from(text);

  it('finds the top-level request value, whatever comes around it', () => {
    const request = '{"uid":"1","object":{"a":"}\\"{","request":{"x":[1,{"y":"]"}]}},"n":-1.5e3,"t":true}';
    for (const text of [
      `{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":${request}}`,
      ` { "request" : ${request} , "kind" : "AdmissionReview" , "z" : [ "request" , null ] } `,
      `{"a":{"request":1},"request":${request}}`,
    ]) {
      const bytes = body(text);
      const span = requestSpan(bytes)!;
      expect(bytes.subarray(span.start, span.end).toString()).toBe(request);
    }
  });

  it('declines when another parser could see a different request', () => {
    expect(requestSpan(body('{"request":{"a":1},"request":{"a":2}}'))).toBeUndefined();
    expect(requestSpan(body('{"\\u0072equest":{"a":1}}'))).toBeUndefined();
    expect(requestSpan(body('{"kind":"x"}'))).toBeUndefined();
    expect(requestSpan(body('[{"request":{}}]'))).toBeUndefined();
    expect(requestSpan(body('{"request":{"a":"unterminated}'))).toBeUndefined();
    // Keys inside the request written with escapes: the AssemblyScript SDK would not decode them.
    expect(requestSpan(body('{"request":{"oper\\u0061tion":"DELETE"}}'))).toBeUndefined();
    expect(requestSpan(body('{"request":{"object":{"metadata":{"labels":{"a\\/b":"x"}}}}}'))).toBeUndefined();
    expect(requestSpan(body('{"request":{"list":[{"k\\"ey" : 1}]}}'))).toBeUndefined();
    // Bytes that are not UTF-8: JSON.parse saw replacement characters there.
    expect(requestSpan(Buffer.concat([body('{"request":{"a":"'), Buffer.from([0xff, 0xfe]), body('"}}')]))).toBeUndefined();
    // Escapes in values are decoded by every parser: the raw path stays.
    expect(requestSpan(body('{"request":{"a":"x\\u0041\\"","b":["\\\\"]}}'))).toEqual({ start: 11, end: 39 });
  });

  it('a key with an escape after many plain strings is still found; the walk stays linear (a denial of service, not a speed target)', () => {
    // Red team: each string searched for the next backslash to the end of the body: a million
    // empty strings and one backslash after them took 21 s of main thread. Now ~25 ms; the bound is 80 times that.
    const strings = `[${'"",'.repeat(1_000_000)}""]`;
    const late = body(`{"request":{"object":{"spec":{"x":${strings}}},"uid":"1"},"z":"\\\\"}`);
    let started = performance.now();
    expect(requestSpan(late)).toBeDefined();
    expect(performance.now() - started).toBeLessThan(2000);
    // The same strings with the escaped key after them: declined, as any escaped key is.
    const escapedKey = body(`{"request":{"object":{"spec":{"x":${strings}}},"u\\u0069d":"1"}}`);
    started = performance.now();
    expect(requestSpan(escapedKey)).toBeUndefined();
    expect(performance.now() - started).toBeLessThan(2000);
    expect(requestSpan(body('{"request":{"a":"","b\\n":1}}'))).toBeUndefined();
    expect(requestSpan(body('{"request":{"a\\n":"","b":1}}'))).toBeUndefined();
    expect(requestSpan(body('{"request":{"a":"\\n","b":1}}'))).toBeDefined();
  });

  it('joins settings, the per-review fields and the raw request into the same input as before', () => {
    const req = request({ object: { metadata: { name: 'café-ü', labels: { a: 'b' } } } });
    const text = JSON.stringify({ kind: 'AdmissionReview', apiVersion: 'admission.k8s.io/v1', request: req }, null, 2);
    const bytes = body(text);
    const input = { request: req, settings: null, headers: { a: 'b' }, sslpeer: null, dryRun: false, webhook: '/validate' };
    rawEnvelope(input, bytes, requestSpan(bytes)!);
    const shared = sharedInput(input, policy({ x: 1 }));
    expect(shared.envelope.buffer).toBeInstanceOf(SharedArrayBuffer);
    expect(JSON.parse(joinInput(shared))).toEqual({ ...input, settings: { x: 1 } });
    expect(JSON.parse(new TextDecoder().decode(joinInputBytes(shared)))).toEqual({ ...input, settings: { x: 1 } });
  });
});
