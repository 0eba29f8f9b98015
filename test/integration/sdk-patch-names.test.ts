// The AssemblyScript SDK's patch has the TypeScript SDK's names (set, merge, remove, apply),
// run in the real sandbox: the patched object is what the TypeScript Patch would make.
import { expect, it } from 'vitest';
import { request, testPolicy } from '../../sdk/src/testing.ts';
import { Patch } from '../../sdk/src/patch.ts';
import type { JsonObject } from '@portcullis/sdk';
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

it('writes under maps it created, through list indexes, and appends with "-", as the TypeScript Patch does', async () => {
  // Outside author: two labels where metadata.labels was absent kept only the last, and a write
  // through containers/0 replaced the whole containers list with a map keyed "0".
  const object: JsonObject = {
    apiVersion: 'v1', kind: 'Pod', metadata: { name: 'web' },
    spec: { containers: [{ name: 'app', image: 'app:1' }, { name: 'side', image: 'sidecar:1', resources: {} }] },
  };
  const policy = await testPolicy(`${root}test/fixtures/policies/as-patch-lists/as-patch-lists.wasm`);
  try {
    const result = await policy.mutate(request({ object }));
    expect(result.status).toBe('allowed');
    const expected = new Patch(structuredClone(object))
      .set(['metadata', 'labels', 'a'], '1')
      .set(['metadata', 'labels', 'b'], '2')
      .merge({ metadata: { annotations: { x: '1', y: '2' } } })
      .set(['spec', 'containers', '0', 'resources', 'limits', 'cpu'], '500m')
      .set(['spec', 'containers', '0', 'resources', 'limits', 'memory'], '128Mi')
      .set(['spec', 'containers', '1', 'image'], 'sidecar:2')
      .set(['spec', 'containers', '0', 'env', '-'], { name: 'A', value: 'ü' })
      .set(['spec', 'containers', '0', 'env', '-'], { name: 'B', value: '2' })
      .set(['spec', 'tolerations', '-'], { key: 'k', operator: 'Exists' })
      .set(['spec', 'containers', '-'], { name: 'added', image: 'x:1' });
    expect(result.patched).toEqual(expected.result);
    // Appends to a missing list as the TypeScript Patch writes them: the empty list first, so
    // that they compose with another policy's appends there (sdk/src/patch.ts).
    const lists = (ops: readonly { path: string }[]) => ops.filter((o) => /^\/spec\/(tolerations|containers\/0\/env)/.test(o.path));
    expect(lists(result.patch)).toEqual(lists(expected.operations));
    expect(result.patch).toContainEqual({ op: 'add', path: '/spec/tolerations', value: [] });
    expect(result.patched).toMatchObject({
      metadata: { labels: { a: '1', b: '2' }, annotations: { x: '1', y: '2' } },
      spec: {
        containers: [
          { name: 'app', image: 'app:1', resources: { limits: { cpu: '500m', memory: '128Mi' } }, env: [{ name: 'A', value: 'ü' }, { name: 'B', value: '2' }] },
          { name: 'side', image: 'sidecar:2' },
          { name: 'added', image: 'x:1' },
        ],
        tolerations: [{ key: 'k', operator: 'Exists' }],
      },
    });
  } finally {
    await policy.close();
  }
});

it('AssemblyScript helpers read userInfo, namespace, name, and lists of strings and maps', async () => {
  // Outside author: the obvious json-as code for userInfo.groups aborted ("holey array").
  const policy = await testPolicy(`${root}test/fixtures/policies/as-request-helpers/as-request-helpers.wasm`);
  try {
    const object: JsonObject = {
      apiVersion: 'v1', kind: 'Pod', metadata: { name: 'web', namespace: 'shop' },
      spec: { containers: [{ name: 'app', args: ['--port', '80', 7] }, { name: 'side' }, 'not a map'], replicas: 7 },
    };
    const base = request({ object, namespace: 'shop', name: 'web' });
    const result = await policy.validate({ ...base, userInfo: { username: 'ann', groups: ['dev', 'system:authenticated'] } });
    expect(result).toMatchObject({ status: 'allowed', warnings: ['user ann in [dev,system:authenticated]', 'object shop/web', 'app args --port 80', 'containers app,side', 'replicas 7 (more than 5)', 'containers is not a number'] });
    const denied = await policy.validate({ ...base, userInfo: { username: 'bob', groups: ['contractors'] } });
    expect(denied).toMatchObject({ status: 'denied', message: 'contractors may not do this' });
    const nobody = await policy.validate({ ...base, name: '', userInfo: {} });
    expect(nobody.warnings.slice(0, 2)).toEqual(['user  in []', 'object shop/']);
  } finally {
    await policy.close();
  }
});
