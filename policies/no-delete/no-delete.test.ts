import { afterAll, beforeAll, expect, it } from 'vitest';
import { request, testPolicy, type TestPolicy } from '@portcullis/sdk/testing';

const labelled = (value: string) => ({ metadata: { name: 'precious', labels: { 'portcullis.dev/no-delete': value } } });
let policy: TestPolicy;
beforeAll(async () => { policy = await testPolicy(new URL('./no-delete.wasm', import.meta.url).pathname); });
afterAll(() => policy.close());

it('is a validating AssemblyScript policy', () => {
  expect(policy.modes).toEqual(['validate']);
});

it('denies DELETE of an object labelled no-delete=true', async () => {
  const result = await policy.validate(request({ operation: 'DELETE', name: 'precious', oldObject: labelled('true') }));
  expect(result).toMatchObject({ allowed: false, code: 403 });
  expect(result.message).toContain('precious is protected by the label portcullis.dev/no-delete="true"');
});

it('allows DELETE when the label is absent or not "true"', async () => {
  expect((await policy.validate(request({ operation: 'DELETE', oldObject: labelled('false') }))).allowed).toBe(true);
  expect((await policy.validate(request({ operation: 'DELETE', oldObject: { metadata: { name: 'x' } } }))).allowed).toBe(true);
});

it('allows other operations on a labelled object', async () => {
  expect((await policy.validate(request({ operation: 'UPDATE', object: labelled('true'), oldObject: labelled('true') }))).allowed).toBe(true);
});
