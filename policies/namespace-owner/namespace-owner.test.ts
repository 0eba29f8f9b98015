import { fileURLToPath } from 'node:url';
import type { JsonObject } from '@portcullis/sdk';
import { request, testPolicy, type TestPolicy } from '@portcullis/sdk/testing';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const wasm = fileURLToPath(new URL('./namespace-owner.wasm', import.meta.url));
const namespace = (name: string, labels: Record<string, string> = {}): JsonObject => ({ apiVersion: 'v1', kind: 'Namespace', metadata: { name, labels } });
const pod = (ns: string) => request({ namespace: ns, object: { apiVersion: 'v1', kind: 'Pod', metadata: { name: 'p', namespace: ns } } });

describe('namespace-owner', () => {
  let policy: TestPolicy;
  beforeAll(async () => {
    policy = await testPolicy(wasm, { context: [namespace('shop', { owner: 'ann' }), namespace('lost'), namespace('team', { lead: 'bob' })] });
  });
  afterAll(() => policy.close());

  it('allows a Pod in a namespace with an owner', async () => {
    expect(await policy.validate(pod('shop'))).toMatchObject({ allowed: true });
  });

  it('denies a Pod in a namespace without one, saying how to fix it', async () => {
    expect(await policy.validate(pod('lost'))).toMatchObject({
      allowed: false, code: 403,
      message: 'namespace "lost" has no "owner" label; add one (kubectl label namespace lost owner=<team>) before creating objects in it',
    });
  });

  it('asks for a retry when the namespace is not in the cache (created a moment ago)', async () => {
    expect(await policy.validate(pod('new'))).toMatchObject({ allowed: false, failure: 'temporary' });
  });

  it('requires the label named in its settings', async () => {
    const lead = await testPolicy(wasm, { settings: { label: 'lead' }, context: [namespace('team', { lead: 'bob' }), namespace('shop', { owner: 'ann' })] });
    try {
      expect(await lead.validate(pod('team'))).toMatchObject({ allowed: true });
      expect(await lead.validate(pod('shop'))).toMatchObject({ allowed: false, message: expect.stringContaining('has no "lead" label') });
    } finally {
      await lead.close();
    }
  });

  it('fails permanently, naming the grant, without the Namespace grant', async () => {
    const ungranted = await testPolicy(wasm, { grants: [] });
    try {
      const result = await ungranted.validate(pod('shop'));
      expect(result).toMatchObject({ allowed: false, failure: 'permanent' });
      expect(result.message).toContain('add context: [{ apiVersion: v1, kind: Namespace }]');
    } finally {
      await ungranted.close();
    }
  });
});
