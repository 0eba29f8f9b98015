import { afterAll, beforeAll, expect, it } from 'vitest';
import { request, testPolicy, type TestPolicy } from '@portcullis/sdk/testing';

const wasm = new URL('./require-labels.wasm', import.meta.url).pathname;
let policy: TestPolicy;
beforeAll(async () => { policy = await testPolicy(wasm, { settings: { labels: { team: 'unowned', tier: 'dev' } } }); });
afterAll(() => policy.close());

it('validates and mutates', () => {
  expect(policy.modes).toEqual(['validate', 'mutate']);
});

it('denies a pod missing required labels, naming them', async () => {
  const result = await policy.validate(request({ object: { metadata: { name: 'p', labels: { team: 'a' } } } }));
  expect(result).toMatchObject({ allowed: false, code: 403, message: 'missing required label: tier' });
});

it('allows a pod with every label', async () => {
  expect((await policy.validate(request({ object: { metadata: { labels: { team: 'a', tier: 'prod' } } } }))).allowed).toBe(true);
});

it('injects the missing labels with their defaults', async () => {
  const result = await policy.mutate(request({ object: { metadata: { name: 'p' } } }));
  expect(result.patch).toEqual([
    { op: 'add', path: '/metadata/labels', value: { team: 'unowned' } },
    { op: 'add', path: '/metadata/labels/tier', value: 'dev' },
  ]);
  expect(result.patched).toEqual({ metadata: { name: 'p', labels: { team: 'unowned', tier: 'dev' } } });
});

it('refuses settings without a labels map', async () => {
  await expect(testPolicy(wasm, { settings: {} })).rejects.toThrow('settings.labels must be a map');
});
