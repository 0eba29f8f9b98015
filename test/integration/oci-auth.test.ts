// Registries that want to know who we are: a real distribution registry over TLS with htpasswd
// Basic auth, and one with token auth (a Bearer challenge, a token from a realm we serve here,
// signed with a certificate the registry trusts). Credentials come from a docker config.json.
import { mkdtemp, readFile, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { fetchOciModule, type OciOptions } from '../../host/src/oci/fetcher.ts';
import { openClient, resolveOptions } from '../../host/src/oci/options.ts';
import { pushPolicy } from '../../host/src/oci/push.ts';
import { parseReference } from '../../host/src/oci/reference.ts';
import { wasm } from '../helpers/policies.ts';
import { startRegistry, startTokenServer, type TestRegistry, type TokenServer } from '../helpers/registry.ts';

const user = { username: 'policy-author', password: 'c0rrect h0rse:battery' };
const noDelete = await readFile(wasm('no-delete'));
let dir: string;

beforeAll(async () => { dir = await mkdtemp(join(tmpdir(), 'portcullis-oci-auth-')); });

async function dockerConfig(name: string, auths: Record<string, unknown>): Promise<string> {
  const path = join(dir, `${name}.json`);
  await writeFile(path, JSON.stringify({ auths }));
  return path;
}

async function push(reference: string, options: OciOptions): Promise<string> {
  const ref = parseReference(reference);
  const client = await openClient(ref, await resolveOptions(options), 'pull,push');
  try {
    return await pushPolicy(client, ref, noDelete, 'no-delete.wasm');
  } finally {
    await client.close();
  }
}

const cache = () => mkdtemp(join(tmpdir(), 'portcullis-oci-cache-'));

describe('TLS and htpasswd Basic auth', () => {
  let registry: TestRegistry;
  beforeAll(async () => { registry = await startRegistry({ tls: true, auth: { basic: user } }); });
  afterAll(() => registry?.stop());

  it('pushes and pulls with an "auth" (base64 user:password) entry', async () => {
    const config = await dockerConfig('basic-auth', { [registry.host]: { auth: Buffer.from(`${user.username}:${user.password}`).toString('base64') } });
    const options = { insecure: [], dockerConfig: config, ca: registry.ca!, cacheDir: await cache() };
    await push(`oci://${registry.host}/team/policy:v1`, options);
    expect(Buffer.from(await fetchOciModule(`oci://${registry.host}/team/policy:v1`, options)).equals(noDelete)).toBe(true);
  });

  it('pulls with a username/password entry keyed https://host', async () => {
    const config = await dockerConfig('basic-userpass', { [`https://${registry.host}`]: user });
    const options = { insecure: [], dockerConfig: config, ca: registry.ca!, cacheDir: await cache() };
    await push(`oci://${registry.host}/team/policy:v2`, options);
    expect(Buffer.from(await fetchOciModule(`oci://${registry.host}/team/policy:v2`, options)).equals(noDelete)).toBe(true);
  });

  it('without credentials: 401, naming the registry, repository and reference, and where to put credentials', async () => {
    const config = await dockerConfig('basic-none', {});
    const reference = `oci://${registry.host}/team/policy:v1`;
    await expect(fetchOciModule(reference, { insecure: [], dockerConfig: config, ca: registry.ca!, cacheDir: await cache() })).rejects.toMatchObject({
      code: 'REGISTRY_UNAUTHORIZED',
      message: `manifest of ${reference}: ${registry.host} refused access (HTTP 401 UNAUTHORIZED: authentication required); no credentials for ${registry.host} in ${config}: add them there (docker login ${registry.host}, or an "auths" entry)`,
    });
  });

  it('with a wrong password: 401 and "check the credentials"', async () => {
    const config = await dockerConfig('basic-wrong', { [registry.host]: { username: user.username, password: 'wrong' } });
    await expect(fetchOciModule(`oci://${registry.host}/team/policy:v1`, { insecure: [], dockerConfig: config, ca: registry.ca!, cacheDir: await cache() })).rejects.toMatchObject({
      code: 'REGISTRY_UNAUTHORIZED', message: expect.stringContaining(`check the credentials for ${registry.host} in ${config}`),
    });
  });

  it('without trusting its certificate: a TLS error that says what to do', async () => {
    await expect(fetchOciModule(`oci://${registry.host}/team/policy:v1`, { insecure: [], dockerConfig: await dockerConfig('x', {}), cacheDir: await cache() })).rejects.toMatchObject({
      code: 'REGISTRY_TLS', message: expect.stringMatching(/TLS error talking to 127\.0\.0\.1:\d+ \(https\): .*trust that CA \(PORTCULLIS_REGISTRY_CA or NODE_EXTRA_CA_CERTS\)/),
    });
  });

  it('refuses a docker config that was named but does not exist', async () => {
    await expect(fetchOciModule(`oci://${registry.host}/team/policy:v1`, { insecure: [], dockerConfig: join(dir, 'nope.json'), ca: registry.ca! })).rejects.toThrow(
      `cannot use docker config ${join(dir, 'nope.json')}: no such file`,
    );
  });
});

describe('token auth (Bearer challenge)', () => {
  let registry: TestRegistry;
  let tokens: TokenServer;
  beforeAll(async () => {
    tokens = await startTokenServer(user);
    registry = await startRegistry({ auth: { token: tokens } });
  });
  afterAll(async () => {
    await registry?.stop();
    await tokens?.close();
  });

  it('gets a token from the realm with Basic credentials, asking for the scope it needs', async () => {
    const config = await dockerConfig('token', { [registry.host]: { auth: Buffer.from(`${user.username}:${user.password}`).toString('base64') } });
    const options = { insecure: [registry.host], dockerConfig: config, cacheDir: await cache() };
    await push(`oci://${registry.host}/team/tokened:v1`, options);
    expect(tokens.requests.at(-1)?.scopes).toContain('repository:team/tokened:pull,push');
    tokens.requests.length = 0;
    expect(Buffer.from(await fetchOciModule(`oci://${registry.host}/team/tokened:v1`, options)).equals(noDelete)).toBe(true);
    // One token for the whole pull: manifest and blob share it.
    expect(tokens.requests).toEqual([{ scopes: ['repository:team/tokened:pull'], authorization: `Basic ${Buffer.from(`${user.username}:${user.password}`).toString('base64')}` }]);
  });

  it('without credentials: the token service refuses, and the message says where credentials go', async () => {
    const config = await dockerConfig('token-none', {});
    await expect(fetchOciModule(`oci://${registry.host}/team/tokened:v1`, { insecure: [registry.host], dockerConfig: config, cacheDir: await cache() })).rejects.toMatchObject({
      code: 'REGISTRY_UNAUTHORIZED',
      message: expect.stringMatching(new RegExp(`^manifest of oci://${registry.host}/team/tokened:v1 \\(token from 127\\.0\\.0\\.1:\\d+\\): 127\\.0\\.0\\.1:\\d+ refused access \\(HTTP 401 UNAUTHORIZED: bad credentials\\); no credentials for ${registry.host} in ${config}`)),
    });
  });
});
