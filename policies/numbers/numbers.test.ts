import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { request, testPolicy, type TestPolicy } from '@portcullis/sdk/testing';

const obj = (spec: Record<string, unknown>) => ({ apiVersion: 'kopf.dev/v1', kind: 'KopfExample', metadata: { name: 'x' }, spec }) as never;
let policy: TestPolicy;
beforeAll(async () => { policy = await testPolicy(new URL('./numbers.wasm', import.meta.url).pathname); });
afterAll(() => policy.close());

describe('numbers: validate', () => {
  it('allows numbers within 0..100', async () => {
    expect(await policy.validate(request({ object: obj({ numbers: [0, 50, 100] }) }))).toMatchObject({ allowed: true, warnings: [] });
  });
  it('warns for strings that convert, and still allows', async () => {
    const result = await policy.validate(request({ object: obj({ numbers: [1, '7'] }) }));
    expect(result.allowed).toBe(true);
    expect(result.warnings).toEqual(['spec.numbers[1] is a string ("7"); it should be a number.']);
  });
  it('denies out-of-range numbers with code 499, keeping earlier warnings', async () => {
    const result = await policy.validate(request({ object: obj({ numbers: ['7', 150] }) }));
    expect(result).toMatchObject({ allowed: false, code: 499, message: 'Numbers must be within 0..100.' });
    expect(result.warnings).toHaveLength(1);
  });
  it('denies values that are not numbers, and a non-list', async () => {
    expect(await policy.validate(request({ object: obj({ numbers: ['seven'] }) }))).toMatchObject({ allowed: false, code: 499 });
    expect(await policy.validate(request({ object: obj({ numbers: 'nope' }) }))).toMatchObject({ allowed: false, code: 499, message: 'spec.numbers must be a list.' });
  });
});

describe('numbers: mutate', () => {
  it('defaults spec.numbers to [1, 2, 3]', async () => {
    const result = await policy.mutate(request({ object: obj({}) }));
    expect(result.patch).toEqual([{ op: 'add', path: '/spec/numbers', value: [1, 2, 3] }]);
    expect(result.patched).toMatchObject({ spec: { numbers: [1, 2, 3] } });
  });
  it('creates spec when the object has none', async () => {
    const result = await policy.mutate(request({ object: { metadata: { name: 'x' } } }));
    expect(result.patched).toMatchObject({ spec: { numbers: [1, 2, 3] } });
  });
  it('converts convertible strings and leaves the rest', async () => {
    const result = await policy.mutate(request({ object: obj({ numbers: [1, '7', 'x'] }) }));
    expect(result.patch).toEqual([{ op: 'replace', path: '/spec/numbers/1', value: 7 }]);
  });
});
