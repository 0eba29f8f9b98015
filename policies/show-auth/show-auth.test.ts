import { afterAll, beforeAll, expect, it } from 'vitest';
import { request, testPolicy, type TestPolicy } from '@portcullis/sdk/testing';

let policy: TestPolicy;
beforeAll(async () => { policy = await testPolicy(new URL('./show-auth.wasm', import.meta.url).pathname); });
afterAll(() => policy.close());

const peer = { subject: { CN: 'kube-apiserver' }, issuer: { CN: 'ca' }, serialNumber: '01', validFrom: '', validTo: '', fingerprint256: '' };

it('names the TLS peer and says an Authorization header was present, never its value', async () => {
  const result = await policy.validate(request(), { sslpeer: peer, headers: { authorization: 'Bearer s3cret' } });
  expect(result.warnings).toEqual(['TLS peer: CN=kube-apiserver', 'Authorization header: present']);
  expect(JSON.stringify(result)).not.toContain('s3cret');
});

it('lists the groups (O) of the peer, one or several', async () => {
  const one = await policy.validate(request(), { sslpeer: { ...peer, subject: { CN: 'alice', O: 'team-a' } } });
  expect(one.warnings).toContain('TLS peer groups (O): ["team-a"]');
  const two = await policy.validate(request(), { sslpeer: { ...peer, subject: { CN: 'alice', O: ['a', 'system:masters'] } } });
  expect(two.warnings).toContain('TLS peer groups (O): ["a","system:masters"]');
});

it('says when there is no peer certificate and no header', async () => {
  const result = await policy.validate(request());
  expect(result).toMatchObject({ allowed: true, warnings: ['TLS peer: none (no verified client certificate)', 'Authorization header: absent'] });
});
