// The AssemblyScript SDK's patch has the TypeScript SDK's names (set, merge, remove, apply),
// run in the real sandbox: the patched object is what the TypeScript Patch would make.
import { expect, it } from 'vitest';
import { request, testPolicy } from '../../sdk/src/testing.ts';
import { Patch } from '../../sdk/src/patch.ts';
import { root } from '../helpers/policies.ts';

it('set<T>, merge, remove and apply patch an AssemblyScript policy\'s object as the TypeScript Patch does', async () => {
  const object = {
    apiVersion: 'apps/v1', kind: 'Deployment', metadata: { name: 'web', annotations: { old: 'x' } },
    spec: { replicas: 1, legacy: true, strategy: { type: 'RollingUpdate', rollingUpdate: { maxSurge: 1 } } },
  };
  const policy = await testPolicy(`${root}test/fixtures/policies/as-patch-api/as-patch-api.wasm`);
  try {
    const result = await policy.mutate(request({ object }));
    expect(result.status).toBe('allowed');
    const expected = new Patch(structuredClone(object))
      .set(['metadata', 'labels', 'team'], 'payments')
      .set(['spec', 'replicas'], 3)
      .set(['spec', 'paused'], false)
      .merge({ metadata: { annotations: { checked: 'yes', old: null } }, spec: { strategy: { type: 'Recreate' } } })
      .remove(['spec', 'legacy'])
      .apply({ op: 'add', path: '/metadata/annotations/raw', value: '1' });
    expect(result.patched).toEqual(expected.result);
    expect(result.patched).toMatchObject({
      metadata: { labels: { team: 'payments' }, annotations: { checked: 'yes', raw: '1' } },
      spec: { replicas: 3, paused: false, strategy: { type: 'Recreate', rollingUpdate: { maxSurge: 1 } } },
    });
  } finally {
    await policy.close();
  }
});
