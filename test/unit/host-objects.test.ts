import type { AdmissionRequest } from '@portcullis/sdk';
import { expect, it } from 'vitest';
import { parseConfig } from '../../host/src/config/load.ts';
import { hostObjects, writesOwnObjects } from '../../host/src/select/host-objects.ts';

const request = (group: string, resource: string, namespace: string, name: string, more: Record<string, unknown> = {}) => ({
  uid: 'u', kind: { group, version: 'v1', kind: 'X' }, resource: { group, version: 'v1', resource }, namespace, name, operation: 'UPDATE',
  userInfo: {}, object: {}, oldObject: {}, dryRun: false, ...more,
}) as unknown as AdmissionRequest;

/** A host with both: leader election, and its certificate in a Secret. */
const inCluster = () => hostObjects(parseConfig(`
server: { tls: { mode: secret, secretName: portcullis-tls } }
webhooks: { managed: guard.example.com, service: { name: portcullis, namespace: guards }, leaderElection: true }
policies: []
`, 'test.yaml'), 'guards')!;

it('names the certificate Secret and the Lease, by group, resource, namespace and name', () => {
  const own = inCluster();
  expect(own(request('', 'secrets', 'guards', 'portcullis-tls'))).toBe("the host's own certificate Secret guards/portcullis-tls");
  expect(own(request('coordination.k8s.io', 'leases', 'guards', 'guard.example.com'))).toBe("the host's own leader-election Lease guards/guard.example.com");
  expect(own(request('', 'secrets', 'other', 'portcullis-tls'))).toBeUndefined();
  expect(own(request('', 'configmaps', 'guards', 'portcullis-tls'))).toBeUndefined();
  expect(own(request('example.com', 'secrets', 'guards', 'portcullis-tls'))).toBeUndefined();
  expect(own(request('coordination.k8s.io', 'leases', 'guards', 'guard.example.co'))).toBeUndefined();
});

it('exempts only what the host does to them: not a DELETE, a subresource or a dry run', () => {
  const own = inCluster();
  const lease = (more: Record<string, unknown>) => own(request('coordination.k8s.io', 'leases', 'guards', 'guard.example.com', more));
  expect(lease({ operation: 'CREATE' })).toBeDefined();
  expect(lease({ operation: 'DELETE' })).toBeUndefined();
  expect(lease({ subResource: 'status' })).toBeUndefined();
  expect(lease({ dryRun: true })).toBeUndefined();
  expect(own(request('', 'secrets', 'guards', 'portcullis-tls', { operation: 'CREATE' }))).toBeUndefined();
  expect(own(request('', 'secrets', 'guards', 'portcullis-tls', { operation: 'DELETE' }))).toBeUndefined();
});

it('is nothing when the host writes nothing (no leader election, certificates not in a Secret)', () => {
  const config = parseConfig(`
server: { tls: { mode: self-signed } }
webhooks: { managed: guard.example.com, url: "https://127.0.0.1:1", leaderElection: false }
policies: []
`, 'test.yaml');
  expect(hostObjects(config, 'guards')).toBeUndefined();
  expect(writesOwnObjects(config)).toBe(false);
});

it('exempts them only for the host\'s own user, when it is known', () => {
  const config = parseConfig(`
server: { tls: { mode: secret, secretName: portcullis-tls } }
webhooks: { managed: guard.example.com, service: { name: portcullis, namespace: guards }, leaderElection: true }
policies: []
`, 'test.yaml');
  const own = hostObjects(config, 'guards', 'system:serviceaccount:guards:portcullis')!;
  expect(own.requester).toBe('system:serviceaccount:guards:portcullis');
  const secret = (username: string) => own(request('', 'secrets', 'guards', 'portcullis-tls', { userInfo: { username } }));
  expect(secret('system:serviceaccount:guards:portcullis')).toBe("the host's own certificate Secret guards/portcullis-tls");
  expect(secret('system:serviceaccount:guards:other')).toBeUndefined();
  expect(secret('')).toBeUndefined();
  expect(own(request('', 'secrets', 'guards', 'portcullis-tls', { userInfo: {} }))).toBeUndefined();
  expect(writesOwnObjects(config)).toBe(true);
});
