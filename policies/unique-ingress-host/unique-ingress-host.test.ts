import { fileURLToPath } from 'node:url';
import type { JsonObject } from '@portcullis/sdk';
import { request, testPolicy, type TestPolicy } from '@portcullis/sdk/testing';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const wasm = fileURLToPath(new URL('./unique-ingress-host.wasm', import.meta.url));

function ingress(namespace: string, name: string, ...hosts: string[]): JsonObject {
  return { apiVersion: 'networking.k8s.io/v1', kind: 'Ingress', metadata: { namespace, name }, spec: { rules: hosts.map((host) => ({ host })) } };
}

function review(object: JsonObject, operation: 'CREATE' | 'UPDATE' = 'CREATE') {
  const { namespace, name } = object.metadata as { namespace: string; name: string };
  return request({
    kind: { group: 'networking.k8s.io', version: 'v1', kind: 'Ingress' },
    resource: { group: 'networking.k8s.io', version: 'v1', resource: 'ingresses' },
    namespace, name, operation, object,
  });
}

describe('unique-ingress-host', () => {
  let policy: TestPolicy;
  beforeAll(async () => {
    policy = await testPolicy(wasm, { context: [ingress('shop', 'web', 'shop.example.com'), ingress('blog', 'blog', 'blog.example.com')] });
  });
  afterAll(() => policy.close());

  it('denies a host another Ingress already uses, naming that Ingress', async () => {
    const result = await policy.validate(review(ingress('team-b', 'copy', 'other.example.com', 'SHOP.example.com')));
    expect(result).toMatchObject({ allowed: false, code: 409, message: 'host "shop.example.com" is already used by Ingress shop/web' });
  });

  it('allows a new host', async () => {
    expect(await policy.validate(review(ingress('team-b', 'new', 'new.example.com')))).toMatchObject({ allowed: true });
  });

  it('allows an Ingress to keep its own host on UPDATE', async () => {
    expect(await policy.validate(review(ingress('shop', 'web', 'shop.example.com'), 'UPDATE'))).toMatchObject({ allowed: true });
  });

  it('fails permanently, naming the missing grant, when it is not granted Ingress', async () => {
    const ungranted = await testPolicy(wasm, { grants: [] });
    try {
      const result = await ungranted.validate(review(ingress('a', 'b', 'x.example.com')));
      expect(result).toMatchObject({ allowed: false, failure: 'permanent' });
      expect(result.message).toContain('add context: [{ apiVersion: networking.k8s.io/v1, kind: Ingress }]');
    } finally {
      await ungranted.close();
    }
  });
});
