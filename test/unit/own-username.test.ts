// Which user the host's own writes come from (webhooks/kube.ts ownUsername), read from its
// credentials as the apiserver would map them; anything it cannot be sure of is no answer.
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { KubeConfig } from '@kubernetes/client-node';
import { generate } from 'selfsigned';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { ownUsername } from '../../host/src/webhooks/kube.ts';

let dir: string;
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'portcullis-username-'));
});
afterAll(() => rm(dir, { recursive: true, force: true }));

const jwt = (claims: Record<string, unknown>) =>
  [{ alg: 'RS256' }, claims].map((part) => Buffer.from(JSON.stringify(part)).toString('base64url')).join('.') + '.c2lnbmF0dXJl';

function withUser(user: Record<string, unknown>): KubeConfig {
  const kc = new KubeConfig();
  kc.loadFromString(JSON.stringify({
    apiVersion: 'v1', kind: 'Config', 'current-context': 'c',
    clusters: [{ name: 'c', cluster: { server: 'https://127.0.0.1:1' } }],
    users: [{ name: 'u', user }],
    contexts: [{ name: 'c', context: { cluster: 'c', user: 'u' } }],
  }));
  return kc;
}

it('reads a ServiceAccount token\'s subject, in a kubeconfig or mounted in a Pod', async () => {
  const token = jwt({ iss: 'https://kubernetes.default.svc', sub: 'system:serviceaccount:portcullis:portcullis' });
  expect(ownUsername(withUser({ token }))).toBe('system:serviceaccount:portcullis:portcullis');
  // As in a Pod: the client reads the token from the ServiceAccount's mounted folder.
  await mkdir(join(dir, 'var/run/secrets/kubernetes.io/serviceaccount'), { recursive: true });
  await writeFile(join(dir, 'var/run/secrets/kubernetes.io/serviceaccount/token'), `${jwt({ sub: 'system:serviceaccount:guards:host' })}\n`);
  const inPod = new KubeConfig();
  inPod.loadFromCluster(dir);
  expect(ownUsername(inPod)).toBe('system:serviceaccount:guards:host');
});

it('reads a client certificate\'s common name', async () => {
  const { cert } = await generate([{ name: 'commonName', value: 'system:portcullis' }, { name: 'organizationName', value: 'system:masters' }], { keySize: 2048 });
  expect(ownUsername(withUser({ 'client-certificate-data': Buffer.from(cert).toString('base64'), 'client-key-data': 'eA==' }))).toBe('system:portcullis');
  await writeFile(join(dir, 'client.crt'), cert);
  expect(ownUsername(withUser({ 'client-certificate': join(dir, 'client.crt'), 'client-key-data': 'eA==' }))).toBe('system:portcullis');
});

it('gives no answer where the apiserver\'s own mapping decides', () => {
  // A static token, an OIDC token (its sub is mapped by apiserver flags), a token that is no JWT, none at all.
  expect(ownUsername(withUser({ token: 'opaque-static-token' }))).toBeUndefined();
  expect(ownUsername(withUser({ token: jwt({ iss: 'https://accounts.example.com', sub: '1234567890' }) }))).toBeUndefined();
  expect(ownUsername(withUser({ token: 'a.%%%.b' }))).toBeUndefined();
  expect(ownUsername(withUser({ token: jwt({ sub: 'system:serviceaccount:a:b:c' }) }))).toBeUndefined();
  expect(ownUsername(withUser({ username: 'admin', password: 'x' }))).toBeUndefined();
  expect(ownUsername(withUser({ exec: { command: 'true', apiVersion: 'client.authentication.k8s.io/v1' } }))).toBeUndefined();
  // A token file that is gone: no answer, not a crash.
  expect(ownUsername(withUser({ 'auth-provider': { name: 'tokenFile', config: { tokenFile: join(dir, 'missing') } } }))).toBeUndefined();
});
