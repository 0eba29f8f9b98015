// `portcullis run` with what authors have at hand: a plain manifest (YAML or JSON) turned into a
// request by flags, a bare AdmissionRequest, a whole configuration, and the patched object.
import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { cli } from '../helpers/cli.ts';
import { root } from '../helpers/policies.ts';
import { requestFor, RequestInputError } from '../../host/src/cli/request.ts';

let dir: string;
const wasm = (name: string) => `${root}policies/${name}/${name}.wasm`;
const POD = 'apiVersion: v1\nkind: Pod\nmetadata: { name: web, namespace: shop, labels: { portcullis.dev/no-delete: "true" } }\nspec: { containers: [{ name: c, image: nginx }] }\n';

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'portcullis-run-manifest-'));
  await writeFile(join(dir, 'pod.yaml'), POD);
  await writeFile(join(dir, 'request.json'), JSON.stringify({
    uid: 'bare-1', kind: { group: '', version: 'v1', kind: 'ConfigMap' }, resource: { group: '', version: 'v1', resource: 'configmaps' },
    operation: 'CREATE', userInfo: { username: 'alice' }, object: { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'c' } },
  }));
});

describe('portcullis run with a manifest', () => {
  it('builds a CREATE request from a YAML manifest and prints the decision', async () => {
    const result = await cli(['run', '--policy', wasm('require-labels'), '--settings', '{"labels":{"team":"x"}}', '--request', join(dir, 'pod.yaml')]);
    expect(result.code).toBe(0);
    expect(JSON.parse(result.stdout).response).toMatchObject({ allowed: false, status: { message: 'policy "require-labels": missing required label: team' } });
  });

  it('--operation DELETE makes the manifest the old object', async () => {
    const result = await cli(['run', '--policy', wasm('no-delete'), '--request', join(dir, 'pod.yaml'), '--operation', 'DELETE']);
    expect(JSON.parse(result.stdout).response).toMatchObject({ allowed: false, status: { message: expect.stringContaining('web is protected') } });
  });

  it('--show patched prints the object after the patch', async () => {
    const result = await cli(['run', '--policy', wasm('require-labels'), '--settings', '{"labels":{"team":"x"}}', '--request', join(dir, 'pod.yaml'),
      '--mode', 'mutate', '--show', 'patched']);
    expect(result.code).toBe(0);
    expect(JSON.parse(result.stdout).metadata.labels).toEqual({ 'portcullis.dev/no-delete': 'true', team: 'x' });
  });

  it('takes a bare AdmissionRequest', async () => {
    const result = await cli(['run', '--policy', wasm('added-by'), '--settings', '{"value":"me"}', '--request', join(dir, 'request.json'), '--show', 'patched']);
    expect(JSON.parse(result.stdout).metadata).toEqual({ name: 'c', annotations: { 'portcullis.dev/added-by': 'me' } });
  });

  it('--config evaluates every matching policy, mutating before validating, as the server does', async () => {
    const patched = await cli(['run', '--config', `${root}policies/portcullis.yaml`, '--request', join(dir, 'pod.yaml'), '--show', 'patched']);
    expect(patched.code).toBe(0);
    // require-labels' mutation adds the default team label, so its validation then passes.
    expect(JSON.parse(patched.stdout).metadata.labels.team).toBe('unowned');
    const deleted = await cli(['run', '--config', `${root}policies/portcullis.yaml`, '--request', join(dir, 'pod.yaml'), '--operation', 'DELETE']);
    expect(JSON.parse(deleted.stdout).response).toMatchObject({ allowed: false, status: { message: expect.stringContaining('policy "no-delete"') } });
  });

  it('refuses what cannot work, in one line', async () => {
    const both = await cli(['run', '--policy', wasm('numbers'), '--config', 'x.yaml', '--request', join(dir, 'pod.yaml')]);
    expect(both.code).toBe(2);
    expect(both.stderr).toContain('give --policy or --config, not both');
    const review = join(dir, 'review.json');
    await writeFile(review, JSON.stringify({ apiVersion: 'admission.k8s.io/v1', kind: 'AdmissionReview', request: JSON.parse(JSON.stringify({ uid: 'u' })) }));
    const flagOnReview = await cli(['run', '--policy', wasm('numbers'), '--request', review, '--user', 'bob']);
    expect(flagOnReview.code).toBe(2);
    expect(flagOnReview.stderr).toContain('--user applies to a plain manifest');
    await writeFile(join(dir, 'nokind.yaml'), 'metadata: { name: x }\n');
    const noKind = await cli(['run', '--policy', wasm('numbers'), '--request', join(dir, 'nokind.yaml')]);
    expect(noKind.code).toBe(1);
    expect(noKind.stderr).toMatch(/nokind\.yaml: the object needs apiVersion and kind/);
  });
});

describe('requestFor', () => {
  it('fills kind, resource, namespace, operation and user as the apiserver would', () => {
    const ingress = { apiVersion: 'networking.k8s.io/v1', kind: 'Ingress', metadata: { name: 'i', namespace: 'shop' } };
    expect(requestFor({ object: ingress, oldObject: ingress, user: 'alice', groups: ['dev'] }, 'u')).toMatchObject({
      uid: 'u', kind: { group: 'networking.k8s.io', version: 'v1', kind: 'Ingress' },
      resource: { group: 'networking.k8s.io', version: 'v1', resource: 'ingresses' },
      name: 'i', namespace: 'shop', operation: 'UPDATE', userInfo: { username: 'alice', groups: ['dev'] },
    });
    expect(requestFor({ object: { apiVersion: 'v1', kind: 'Policy' }, namespace: 'n' }, 'u')).toMatchObject({ resource: { resource: 'policies' }, namespace: 'n' });
    expect(() => requestFor({ object: { apiVersion: 'v1', kind: 'Pod' }, operation: 'PATCH' }, 'u')).toThrow(RequestInputError);
  });

  it('builds only the shapes the apiserver sends: a DELETE\'s object is the old object, an UPDATE needs one', () => {
    // Outside author: a suite's DELETE kept `object`, so it passed a denial the real request never gets.
    const pod = { apiVersion: 'v1', kind: 'Pod', metadata: { name: 'p' } };
    expect(requestFor({ object: pod, operation: 'DELETE' }, 'u')).toMatchObject({ operation: 'DELETE', object: null, oldObject: pod, name: 'p' });
    expect(() => requestFor({ object: pod, oldObject: pod, operation: 'DELETE' }, 'u')).toThrow(/a DELETE has no object, only the old object/);
    expect(() => requestFor({ object: pod, operation: 'UPDATE' }, 'u')).toThrow(/an UPDATE needs oldObject/);
  });
});
