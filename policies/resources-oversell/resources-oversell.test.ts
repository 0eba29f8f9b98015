import { afterAll, beforeAll, expect, it } from 'vitest';
import { request, testPolicy, type TestPolicy } from '@portcullis/sdk/testing';

const wasm = new URL('./resources-oversell.wasm', import.meta.url).pathname;
const pod = (containers: unknown[]) => ({ metadata: { name: 'p' }, spec: { containers } }) as never;
let policy: TestPolicy;
beforeAll(async () => { policy = await testPolicy(wasm, { settings: { cpuFactor: 0.5, memoryFactor: 0.25 } }); });
afterAll(() => policy.close());

it('sets requests to limits times the factors, for each quantity style', async () => {
  const result = await policy.mutate(request({ object: pod([
    { name: 'a', resources: { limits: { cpu: '500m', memory: '1Gi' } } },
    { name: 'b', resources: { limits: { cpu: '1', memory: '128Mi' } } },
    { name: 'c', resources: { limits: { cpu: 2, memory: '1G' } } },
  ]) }));
  const spec = (result.patched as { spec: { containers: { resources: { requests: unknown } }[] } }).spec;
  expect(spec.containers.map((c) => c.resources.requests)).toEqual([
    { cpu: '250m', memory: '256Mi' },
    { cpu: '500m', memory: '32Mi' },
    { cpu: '1', memory: '250M' },
  ]);
});

it('replaces existing requests and skips containers without limits', async () => {
  const result = await policy.mutate(request({ object: pod([
    { name: 'a', resources: { limits: { cpu: '2' }, requests: { cpu: '2' } } },
    { name: 'b' },
  ]) }));
  expect(result.patch).toEqual([{ op: 'replace', path: '/spec/containers/0/resources/requests/cpu', value: '1' }]);
});

it('warns about a limit that is not a quantity', async () => {
  const result = await policy.mutate(request({ object: pod([{ name: 'a', resources: { limits: { cpu: 'lots' } } }]) }));
  expect(result.allowed).toBe(true);
  expect(result.warnings[0]).toContain('"lots" is not a Kubernetes quantity');
});

it('refuses factors outside (0, 1]', async () => {
  await expect(testPolicy(wasm, { settings: { cpuFactor: 3 } })).rejects.toThrow('cpuFactor must be a number in (0, 1]');
});
