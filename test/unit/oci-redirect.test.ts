// Blob storage lives elsewhere: the registry answers a blob GET with a redirect (S3, a CDN).
// The registry's credentials must not follow it there.
import { mkdtemp, writeFile } from 'node:fs/promises';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { fetchOciModule } from '../../host/src/oci/fetcher.ts';
import { policyManifest } from '../../host/src/oci/artifact.ts';
import { sha256 } from '../helpers/registry.ts';

const wasm = new Uint8Array([0, 0x61, 0x73, 0x6d, 1, 0, 0, 0]);
const config = new TextEncoder().encode('{}');
const manifest = policyManifest({ digest: sha256(wasm), size: wasm.length, title: 'tiny.wasm' }, { digest: sha256(config), size: 2 });
const seen: { server: string; path: string; authorization: string | undefined }[] = [];
let registry: Server;
let storage: Server;

function listen(handler: (req: IncomingMessage, res: ServerResponse) => void): Promise<Server> {
  return new Promise((resolve) => {
    const server = createServer(handler);
    server.listen(0, '127.0.0.1', () => resolve(server));
  });
}
const port = (server: Server) => (server.address() as AddressInfo).port;

beforeAll(async () => {
  storage = await listen((req, res) => {
    seen.push({ server: 'storage', path: req.url!, authorization: req.headers.authorization });
    res.writeHead(200, { 'content-type': 'application/octet-stream' }).end(wasm);
  });
  registry = await listen((req, res) => {
    seen.push({ server: 'registry', path: req.url!, authorization: req.headers.authorization });
    if (!req.headers.authorization) {
      res.writeHead(401, { 'www-authenticate': 'Basic realm="test"' }).end();
    } else if (req.url!.includes('/manifests/')) {
      res.writeHead(200, { 'content-type': 'application/vnd.oci.image.manifest.v1+json' }).end(manifest);
    } else {
      // Same host name, other port: another origin, as a storage bucket would be.
      res.writeHead(307, { location: `http://127.0.0.1:${port(storage)}/bucket/blob?signature=xyz` }).end();
    }
  });
});
afterAll(() => {
  registry.close();
  storage.close();
});

it('follows the redirect to blob storage without the Authorization header', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'portcullis-oci-redirect-'));
  await writeFile(join(dir, 'config.json'), JSON.stringify({ auths: { [`127.0.0.1:${port(registry)}`]: { username: 'u', password: 'p' } } }));
  const host = `127.0.0.1:${port(registry)}`;
  const bytes = await fetchOciModule(`oci://${host}/a/b:v1`, { insecure: [host], dockerConfig: join(dir, 'config.json'), cacheDir: join(dir, 'cache') });
  expect(bytes).toEqual(wasm);
  const basic = `Basic ${Buffer.from('u:p').toString('base64')}`;
  expect(seen).toEqual([
    { server: 'registry', path: '/v2/a/b/manifests/v1', authorization: undefined },
    { server: 'registry', path: '/v2/a/b/manifests/v1', authorization: basic },
    { server: 'registry', path: `/v2/a/b/blobs/${sha256(wasm)}`, authorization: basic },
    { server: 'storage', path: '/bucket/blob?signature=xyz', authorization: undefined },
  ]);
});
