// A real OCI registry for tests: Debian's docker-registry (CNCF distribution) started on a
// free loopback port with its own storage, config and (optionally) TLS, htpasswd Basic auth
// or token auth. Needs the apt packages docker-registry, and apache2-utils for htpasswd.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { createHash, createPrivateKey, randomBytes, sign, X509Certificate } from 'node:crypto';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { createServer, type Server } from 'node:http';
import { createServer as createNetServer, type AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Agent, request } from 'undici';
import { selfSigned } from '../../host/src/server/tls.ts';

export const REGISTRY_BINARY = process.env.PORTCULLIS_TEST_REGISTRY ?? '/usr/bin/docker-registry';

export interface RegistryAuth {
  /** htpasswd Basic auth for this user. */
  basic?: { username: string; password: string };
  /** Token auth: the registry trusts JWTs signed by `signer` (see startTokenServer). */
  token?: { realm: string; service: string; issuer: string; certPem: string };
}

export interface TestRegistry {
  /** host:port, as it goes in oci:// references. */
  host: string;
  url: string;
  /** Root of the registry's filesystem storage (docker/registry/v2/...). */
  storage: string;
  /** PEM of its self-signed certificate, when started with TLS. */
  ca: string | undefined;
  stop(): Promise<void>;
}

export async function startRegistry(options: { tls?: boolean; auth?: RegistryAuth } = {}): Promise<TestRegistry> {
  const dir = await mkdtemp(join(tmpdir(), 'portcullis-registry-'));
  const port = await freePort();
  const host = `127.0.0.1:${port}`;
  const storage = join(dir, 'storage');
  const lines = [
    'version: 0.1',
    'log: { level: error, accesslog: { disabled: true } }',
    `storage: { filesystem: { rootdirectory: ${storage} }, delete: { enabled: true }, maintenance: { uploadpurging: { enabled: false } } }`,
    'http:',
    `  addr: ${host}`,
    `  secret: ${randomBytes(16).toString('hex')}`,
  ];
  let ca: string | undefined;
  if (options.tls) {
    const material = await selfSigned(['127.0.0.1']);
    await writeFile(join(dir, 'cert.pem'), material.cert);
    await writeFile(join(dir, 'key.pem'), material.key);
    lines.push(`  tls: { certificate: ${join(dir, 'cert.pem')}, key: ${join(dir, 'key.pem')} }`);
    ca = material.cert;
  }
  if (options.auth?.basic) {
    await writeFile(join(dir, 'htpasswd'), htpasswd(options.auth.basic.username, options.auth.basic.password));
    lines.push(`auth: { htpasswd: { realm: portcullis-test, path: ${join(dir, 'htpasswd')} } }`);
  }
  if (options.auth?.token) {
    const { realm, service, issuer, certPem } = options.auth.token;
    await writeFile(join(dir, 'token-ca.pem'), certPem);
    lines.push(`auth: { token: { realm: "${realm}", service: ${service}, issuer: ${issuer}, rootcertbundle: ${join(dir, 'token-ca.pem')} } }`);
  }
  await writeFile(join(dir, 'config.yml'), `${lines.join('\n')}\n`);

  const child = spawn(REGISTRY_BINARY, ['serve', join(dir, 'config.yml')], { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (d) => (stderr += d));
  const url = `${options.tls ? 'https' : 'http'}://${host}`;
  try {
    await waitUntilServing(child, `${url}/v2/`, ca, () => stderr);
  } catch (error) {
    child.kill('SIGKILL');
    await rm(dir, { recursive: true, force: true });
    throw error;
  }
  return {
    host, url, storage, ca,
    async stop() {
      await stopChild(child);
      await rm(dir, { recursive: true, force: true });
    },
  };
}

/** Stops the registry but keeps nothing else running: what "the registry went down" looks like. */
async function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  child.kill('SIGTERM');
  const timer = setTimeout(() => child.kill('SIGKILL'), 3000);
  await exited;
  clearTimeout(timer);
}

async function waitUntilServing(child: ChildProcess, url: string, ca: string | undefined, stderr: () => string): Promise<void> {
  const dispatcher = new Agent(ca ? { connect: { ca } } : {});
  try {
    const deadline = Date.now() + 15_000;
    while (Date.now() < deadline) {
      if (child.exitCode !== null) throw new Error(`docker-registry exited with ${child.exitCode}: ${stderr()}`);
      try {
        const { statusCode, body } = await request(url, { dispatcher });
        await body.dump();
        if (statusCode === 200 || statusCode === 401) return;
      } catch {
        // not listening yet
      }
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    throw new Error(`docker-registry did not answer ${url} within 15s: ${stderr()}`);
  } finally {
    await dispatcher.close();
  }
}

export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createNetServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as AddressInfo;
      server.close(() => resolve(port));
    });
  });
}

/** distribution only accepts bcrypt entries; `htpasswd -B` (apache2-utils) writes them. */
function htpasswd(username: string, password: string): string {
  const result = spawnSync('htpasswd', ['-Bbn', username, password], { encoding: 'utf8' });
  if (result.error || result.status !== 0) throw new Error(`htpasswd -Bbn failed (install apache2-utils): ${result.error?.message ?? result.stderr}`);
  return result.stdout.trim() + '\n';
}

export function sha256(bytes: Uint8Array | string): string {
  return `sha256:${createHash('sha256').update(bytes).digest('hex')}`;
}

/** Uploads a blob the way any client would (POST, then PUT with ?digest=), over plain HTTP. */
export async function uploadBlob(registry: TestRegistry, repository: string, bytes: Uint8Array | string): Promise<{ digest: string; size: number }> {
  const data = typeof bytes === 'string' ? new TextEncoder().encode(bytes) : bytes;
  const digest = sha256(data);
  const opened = await fetch(`${registry.url}/v2/${repository}/blobs/uploads/`, { method: 'POST' });
  if (opened.status !== 202) throw new Error(`upload POST: HTTP ${opened.status} ${await opened.text()}`);
  const location = new URL(opened.headers.get('location')!, registry.url);
  location.searchParams.set('digest', digest);
  const closed = await fetch(location, { method: 'PUT', body: new Uint8Array(data), headers: { 'content-type': 'application/octet-stream' } });
  if (closed.status !== 201) throw new Error(`upload PUT: HTTP ${closed.status} ${await closed.text()}`);
  return { digest, size: data.length };
}

/** PUTs manifest text exactly as given; returns its digest. */
export async function putManifest(registry: TestRegistry, repository: string, tag: string, text: string, mediaType: string): Promise<string> {
  const response = await fetch(`${registry.url}/v2/${repository}/manifests/${tag}`, { method: 'PUT', body: text, headers: { 'content-type': mediaType } });
  if (response.status !== 201) throw new Error(`manifest PUT: HTTP ${response.status} ${await response.text()}`);
  return sha256(text);
}

/** Where the registry keeps a blob's bytes, to damage them behind its back. */
export function blobDataPath(registry: TestRegistry, digest: string): string {
  const hex = digest.slice('sha256:'.length);
  return join(registry.storage, 'docker', 'registry', 'v2', 'blobs', 'sha256', hex.slice(0, 2), hex, 'data');
}

export interface TokenServer {
  realm: string;
  service: string;
  issuer: string;
  certPem: string;
  /** What the token endpoint was asked: scopes, and whether Basic credentials came with it. */
  requests: { scopes: string[]; authorization: string | undefined }[];
  close(): Promise<void>;
}

/**
 * A token endpoint for distribution's token auth: it checks Basic credentials and answers a
 * JWT (ES256) whose x5c header carries the certificate the registry's rootcertbundle trusts.
 */
export async function startTokenServer(user: { username: string; password: string }): Promise<TokenServer> {
  const service = 'portcullis-test-registry';
  const issuer = 'portcullis-test-issuer';
  const material = await selfSigned(['portcullis-token-signer']);
  const key = createPrivateKey(material.key);
  const x5c = [new X509Certificate(material.cert).raw.toString('base64')];
  const expected = `Basic ${Buffer.from(`${user.username}:${user.password}`).toString('base64')}`;
  const requests: TokenServer['requests'] = [];
  const server: Server = createServer((req, res) => {
    const url = new URL(req.url ?? '/', 'http://x');
    const scopes = url.searchParams.getAll('scope');
    requests.push({ scopes, authorization: req.headers.authorization });
    if (req.headers.authorization !== expected) {
      res.writeHead(401, { 'content-type': 'application/json' }).end('{"errors":[{"code":"UNAUTHORIZED","message":"bad credentials"}]}');
      return;
    }
    const access = scopes.map((scope) => {
      const [type, name, actions] = scope.split(':');
      return { type, name, actions: (actions ?? '').split(',').filter(Boolean) };
    });
    const now = Math.floor(Date.now() / 1000);
    const token = jwt(key, x5c, {
      iss: issuer, sub: user.username, aud: service, exp: now + 300, nbf: now - 10, iat: now,
      jti: randomBytes(8).toString('hex'), access,
    });
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ token, expires_in: 300 }));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    realm: `http://127.0.0.1:${port}/token`, service, issuer, certPem: material.cert, requests,
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
}

function jwt(key: ReturnType<typeof createPrivateKey>, x5c: string[], claims: Record<string, unknown>): string {
  const encode = (value: unknown) => Buffer.from(JSON.stringify(value)).toString('base64url');
  const input = `${encode({ alg: 'ES256', typ: 'JWT', x5c })}.${encode(claims)}`;
  const signature = sign('sha256', Buffer.from(input), { key, dsaEncoding: 'ieee-p1363' }).toString('base64url');
  return `${input}.${signature}`;
}
