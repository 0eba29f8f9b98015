import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { lookupCredentials, parseChallenge } from '../../host/src/oci/auth.ts';

const dir = await mkdtemp(join(tmpdir(), 'portcullis-oci-auth-'));
async function config(value: unknown): Promise<string> {
  const path = join(dir, `${Math.random()}.json`);
  await writeFile(path, typeof value === 'string' ? value : JSON.stringify(value));
  return path;
}

describe('docker config.json', () => {
  it('reads "auth" (base64 user:password, the password may hold colons)', async () => {
    const path = await config({ auths: { 'reg.example:5000': { auth: Buffer.from('me:pa:ss').toString('base64') } } });
    expect((await lookupCredentials(path, 'reg.example:5000', true)).credentials).toEqual({ username: 'me', password: 'pa:ss' });
  });

  it('reads username/password, and keys written as URLs', async () => {
    const path = await config({ auths: { 'https://reg.example/v1/': { username: 'me', password: 'pw' } } });
    expect((await lookupCredentials(path, 'reg.example', true)).credentials).toEqual({ username: 'me', password: 'pw' });
    expect((await lookupCredentials(path, 'other.example', true)).credentials).toBeUndefined();
  });

  it('knows Docker Hub by its several names', async () => {
    const path = await config({ auths: { 'https://index.docker.io/v1/': { username: 'me', password: 'pw' } } });
    expect((await lookupCredentials(path, 'docker.io', true)).credentials).toEqual({ username: 'me', password: 'pw' });
  });

  it('notes credential helpers, which it does not run', async () => {
    const path = await config({ auths: {}, credsStore: 'desktop' });
    expect(await lookupCredentials(path, 'reg.example', true)).toEqual({ credentials: undefined, source: path, helpers: true });
  });

  it('is anonymous when the default file is missing, an error when a named one is', async () => {
    const missing = join(dir, 'missing.json');
    expect((await lookupCredentials(missing, 'reg.example', false)).credentials).toBeUndefined();
    await expect(lookupCredentials(missing, 'reg.example', true)).rejects.toThrow(`cannot use docker config ${missing}: no such file`);
    await expect(lookupCredentials(await config('{oops'), 'reg.example', false)).rejects.toThrow(/cannot use docker config .*: .*JSON/);
  });
});

describe('WWW-Authenticate', () => {
  it('parses a Bearer challenge', () => {
    expect(parseChallenge('Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull,push"')).toEqual({
      scheme: 'bearer', params: { realm: 'https://auth.example/token', service: 'registry.example', scope: 'repository:a/b:pull,push' },
    });
  });

  it('parses Basic, unquoted values, and picks ours among several', () => {
    expect(parseChallenge(['Negotiate', 'basic realm=registry'])).toEqual({ scheme: 'basic', params: { realm: 'registry' } });
    expect(parseChallenge(undefined)).toBeUndefined();
  });
});
