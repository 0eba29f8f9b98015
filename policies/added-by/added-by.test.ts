import { afterAll, beforeAll, expect, it } from 'vitest';
import { request, testPolicy, type TestPolicy } from '@portcullis/sdk/testing';

const wasm = new URL('./added-by.wasm', import.meta.url).pathname;
let policy: TestPolicy;
beforeAll(async () => { policy = await testPolicy(wasm, { settings: { value: 'team-ä' } }); });
afterAll(() => policy.close());

it('creates metadata.annotations when absent', async () => {
  const result = await policy.mutate(request({ object: { metadata: { name: 'x' } } }));
  expect(result.patch).toEqual([{ op: 'add', path: '/metadata/annotations', value: { 'portcullis.dev/added-by': 'team-ä' } }]);
});

it('adds to existing annotations without touching the others', async () => {
  const result = await policy.mutate(request({ object: { metadata: { name: 'x', annotations: { keep: 'me' } } } }));
  expect(result.patch).toEqual([{ op: 'add', path: '/metadata/annotations/portcullis.dev~1added-by', value: 'team-ä' }]);
  expect(result.patched).toEqual({ metadata: { name: 'x', annotations: { keep: 'me', 'portcullis.dev/added-by': 'team-ä' } } });
});

it('replaces a stale value', async () => {
  const result = await policy.mutate(request({ object: { metadata: { annotations: { 'portcullis.dev/added-by': 'old' } } } }));
  expect(result.patch).toEqual([{ op: 'replace', path: '/metadata/annotations/portcullis.dev~1added-by', value: 'team-ä' }]);
});

it('refuses settings whose value is not a string', async () => {
  await expect(testPolicy(wasm, { settings: { value: 42 } })).rejects.toThrow('policy "added-by" refused its settings: settings.value must be a string');
});
