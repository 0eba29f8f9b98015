// The OCI client against a registry that misbehaves on purpose (red team, hostile registry):
// layers larger than the module limit, sizes that lie, layers that are not Wasm, and the
// same layer asked for by several policies at once.
import { spawn } from 'node:child_process';
import { mkdtemp, readdir, writeFile } from 'node:fs/promises';
import { createServer as createHttpServer, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { abandonRegistryRequests, fetchOci, type OciOptions } from '../../host/src/oci/fetcher.ts';
import { readModule } from '../../host/src/policy/source.ts';
import { manifestOf, send, startHostileRegistry, wasmLayerOf, wasmOfSize, type HostileRegistry } from '../helpers/hostile-registry.ts';
import { cli } from '../helpers/cli.ts';
import { sha256 } from '../helpers/registry.ts';

const MiB = 2 ** 20;
let registry: HostileRegistry;

beforeAll(async () => {
  registry = await startHostileRegistry();
});
afterAll(() => registry?.close());

async function options(extra: Partial<OciOptions> = {}): Promise<OciOptions & { cacheDir: string }> {
  return { insecure: [registry.host], cacheDir: await mkdtemp(join(tmpdir(), 'portcullis-oci-hostile-')), maxModuleBytes: MiB, ...extra };
}

async function cachedBlobs(cacheDir: string): Promise<string[]> {
  return readdir(join(cacheDir, 'blobs', 'sha256')).catch(() => []);
}

const blobGets = (repository: string) => registry.requests.filter((line) => line.startsWith(`GET /v2/${repository}/blobs/`));

/** A repository whose manifest lists `layer` and whose blob GETs are answered by `blob`. */
function serve(repository: string, layer: ReturnType<typeof wasmLayerOf>, blob: (res: ServerResponse) => void): void {
  registry.route(repository, (kind, _ref, _req, res) => (kind === 'manifests' ? send(res, manifestOf([layer])) : blob(res)));
}

describe('the module size limit', () => {
  it('refuses a layer whose manifest size is above the limit without asking for it, and caches nothing', async () => {
    const big = wasmOfSize(2 * MiB);
    serve('big', wasmLayerOf(big, 'big.wasm'), (res) => send(res, big, 'application/octet-stream'));
    const settings = await options();
    await expect(fetchOci(`oci://${registry.host}/big:v1`, settings)).rejects.toMatchObject({
      code: 'MODULE_TOO_LARGE',
      message: `layer big.wasm of oci://${registry.host}/big:v1 is 2 MiB, above limits.maxModuleMiB (1 MiB); refused without downloading it (raise limits.maxModuleMiB if the policy really is that large)`,
    });
    expect(blobGets('big')).toEqual([]);
    expect(await cachedBlobs(settings.cacheDir)).toEqual([]);
  });

  it('applies a served policy\'s limits.maxModuleMiB to oci:// modules (readModule)', async () => {
    const big = wasmOfSize(3 * MiB);
    serve('served', wasmLayerOf(big), (res) => send(res, big, 'application/octet-stream'));
    const { cacheDir } = await options();
    await expect(readModule(`oci://${registry.host}/served:v1`, 2 * MiB, { insecure: [registry.host], cacheDir })).rejects.toThrow('is 3 MiB, above limits.maxModuleMiB (2 MiB)');
    expect(blobGets('served')).toEqual([]);
  });

  it('stops reading a body longer than the manifest said (chunked, no length)', async () => {
    const small = wasmOfSize(1000);
    serve('liar', wasmLayerOf(small), (res) => {
      res.writeHead(200, { 'content-type': 'application/octet-stream' });
      res.write(small);
      // Far more than the size said; the client must not wait for (or hold) all of it.
      const filler = Buffer.alloc(64 * 1024);
      let sent = 0;
      const pump = () => {
        while (sent < 64 * MiB && !res.destroyed) {
          sent += filler.length;
          if (!res.write(filler)) return void res.once('drain', pump);
        }
        res.end();
      };
      pump();
    });
    const settings = await options();
    await expect(fetchOci(`oci://${registry.host}/liar:v1`, settings)).rejects.toMatchObject({ code: 'REGISTRY_PROTOCOL', message: expect.stringContaining('sent more than the expected 1000 bytes') });
    expect(await cachedBlobs(settings.cacheDir)).toEqual([]);
  });

  it('refuses a layer that does not start with \\0asm before caching it', async () => {
    const junk = new Uint8Array(4096).fill(7);
    serve('junk', wasmLayerOf(junk), (res) => send(res, junk, 'application/octet-stream'));
    const settings = await options();
    await expect(fetchOci(`oci://${registry.host}/junk:v1`, settings)).rejects.toMatchObject({ code: 'NO_WASM_LAYER', message: expect.stringContaining('is not WebAssembly') });
    expect(await cachedBlobs(settings.cacheDir)).toEqual([]);
  });

  it('downloads a layer once for policies that load the same tag at the same time', async () => {
    const module = wasmOfSize(256 * 1024);
    serve('shared', wasmLayerOf(module), (res) => setTimeout(() => send(res, module, 'application/octet-stream'), 100));
    const settings = await options();
    const pulled = await Promise.all([1, 2, 3].map(() => fetchOci(`oci://${registry.host}/shared:v1`, settings)));
    expect(pulled.map((p) => sha256(p.bytes))).toEqual([sha256(module), sha256(module), sha256(module)]);
    expect(blobGets('shared')).toHaveLength(1);
  });
});

/** The error a pull fails with (a pull that succeeds fails the test). */
async function refusal(reference: string): Promise<Error & { code?: string }> {
  return fetchOci(reference, await options()).then(() => { throw new Error(`${reference} was pulled`); }, (error: unknown) => error as Error);
}

describe('registry text in messages', () => {
  const ANSI = '\u001b[2J\u001b[H\u001b[32mOK: policy pulled and verified\u001b[0m\nportcullis pull: done';
  const unprintable = /[\u0000-\u001f\u007f-\u009f]/;

  it('cuts a 200 KB manifest media type to a few hundred characters', async () => {
    registry.route('hugetype', (_kind, _ref, _req, res) => send(res, Buffer.from(JSON.stringify({ schemaVersion: 2, mediaType: 'x'.repeat(200_000) }))));
    const error = await refusal(`oci://${registry.host}/hugetype:v1`);
    expect(error).toMatchObject({ code: 'UNSUPPORTED_MANIFEST', message: expect.stringContaining(`${'x'.repeat(200)}… (${200_000 - 200} more characters cut) is not supported`) });
    expect(error.message.length).toBeLessThan(500);
  });

  it('escapes control characters of a media type and of a registry error body', async () => {
    registry.route('ansi', (_kind, _ref, _req, res) => send(res, Buffer.from(JSON.stringify({ schemaVersion: 2, mediaType: ANSI }))));
    const ansi = await refusal(`oci://${registry.host}/ansi:v1`);
    expect(ansi.message).toContain('manifest type \\u001b[2J\\u001b[H\\u001b[32mOK: policy pulled and verified\\u001b[0m\\u000aportcullis pull: done is not supported');
    expect(ansi.message).not.toMatch(unprintable);
    registry.route('ansi-error', (_kind, _ref, _req, res) => send(res, Buffer.from(JSON.stringify({ errors: [{ code: 'DENIED\u001b[2J', message: `no\u0007${'y'.repeat(300)}` }] })), 'application/json', 403));
    const denied = await refusal(`oci://${registry.host}/ansi-error:v1`);
    expect(denied).toMatchObject({ code: 'REGISTRY_UNAUTHORIZED', message: expect.stringContaining('(HTTP 403 DENIED\\u001b[2J: no\\u0007yyy') });
    expect(denied.message).not.toMatch(unprintable);
    expect(denied.message.length).toBeLessThan(800);
  });

  it('writes one line without escapes to the CLI\'s stderr', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'portcullis-oci-ansi-'));
    const { code, stderr } = await cli(['pull', `oci://${registry.host}/ansi:v1`, '-o', join(dir, 'x.wasm'), '--insecure'], { env: { PORTCULLIS_CACHE: dir, DOCKER_CONFIG: dir } });
    expect(code).toBe(1);
    expect(stderr.trimEnd().split('\n')).toHaveLength(1);
    expect(stderr.trimEnd()).not.toMatch(unprintable);
  });

  it('names a few of 1,000 layers, not all of them', async () => {
    const layers = Array.from({ length: 1000 }, (_, i) => ({ mediaType: 'application/octet-stream', digest: sha256(String(i)), size: 1, annotations: { 'org.opencontainers.image.title': `file-${i}` } }));
    registry.route('manylayers', (_kind, _ref, _req, res) => send(res, manifestOf(layers)));
    const error = await refusal(`oci://${registry.host}/manylayers:v1`);
    expect(error).toMatchObject({ code: 'NO_WASM_LAYER', message: expect.stringContaining('file-4 (application/octet-stream) and 995 more)') });
    expect(error.message.length).toBeLessThan(800);
  });
});

describe('manifest shapes a registry should not send', () => {
  it.each([
    ['a number', 5, 'number'],
    ['an object', { toLowerCase: 1 }, 'object'],
  ])('refuses a title annotation that is %s, saying so', async (_what, title, type) => {
    const module = wasmOfSize(100);
    registry.route(`title-${type}`, (_kind, _ref, _req, res) => send(res, manifestOf([{ ...wasmLayerOf(module), mediaType: 'application/octet-stream', annotations: { 'org.opencontainers.image.title': title } }])));
    await expect(fetchOci(`oci://${registry.host}/title-${type}:v1`, await options())).rejects.toMatchObject({
      code: 'UNSUPPORTED_MANIFEST',
      message: `oci://${registry.host}/title-${type}:v1: the manifest's layer 0 has annotation org.opencontainers.image.title of type ${type}, not a string`,
    });
  });
});

describe('answers that are the registry\'s fault, not an outage (no cached copy stands in)', () => {
  it('refuses a manifest that is not a JSON object, or longer than MAX_MANIFEST_BYTES, without parsing it (2 MB of nested arrays)', async () => {
    registry.route('deep-array', (_kind, _ref, _req, res) => send(res, Buffer.from(`${'['.repeat(1_000_000)}${']'.repeat(1_000_000)}`)));
    await expect(fetchOci(`oci://${registry.host}/deep-array:v1`, await options())).rejects.toMatchObject({
      code: 'UNSUPPORTED_MANIFEST', message: `manifest of oci://${registry.host}/deep-array:v1: the manifest is 2000000 bytes; a policy's manifest is a few KB, and at most 256 KiB is read`,
    });
    registry.route('short-array', (_kind, _ref, _req, res) => send(res, Buffer.from(`${'['.repeat(1000)}${']'.repeat(1000)}`)));
    await expect(fetchOci(`oci://${registry.host}/short-array:v1`, await options())).rejects.toMatchObject({
      code: 'UNSUPPORTED_MANIFEST', message: `oci://${registry.host}/short-array:v1: the manifest is not a JSON object (an OCI manifest starts with "{")`,
    });
    // Red team 13: one map of 470,000 keys in 4 MiB passed every other bound, 0.3 s of main thread to parse.
    const keys = Object.fromEntries(Array.from({ length: 30_000 }, (_, i) => [`k${i}`, 'v']));
    registry.route('many-keys', (_kind, _ref, _req, res) => send(res, Buffer.from(JSON.stringify({ schemaVersion: 2, annotations: keys }))));
    await expect(fetchOci(`oci://${registry.host}/many-keys:v1`, await options())).rejects.toMatchObject({
      code: 'UNSUPPORTED_MANIFEST', message: expect.stringContaining('at most 256 KiB is read') as unknown,
    });
  });

  it('refuses a redirect to a URL that is not http(s)', async () => {
    const module = wasmOfSize(100);
    serve('to-file', wasmLayerOf(module), (res) => void res.writeHead(302, { location: 'file:///etc/passwd' }).end());
    await expect(fetchOci(`oci://${registry.host}/to-file:v1`, await options())).rejects.toMatchObject({
      code: 'REGISTRY_PROTOCOL', message: expect.stringContaining(`${registry.host} redirected to a file: URL; only http(s) redirects are followed`) as unknown,
    });
  });

  it('shows no error words from a host the registry redirected to, and sends no credentials to a plain-HTTP realm on another host (red team 12)', async () => {
    // Another loopback host: what the webhook's own network can reach, and the registry's cannot show.
    const seen: string[] = [];
    const internal = createHttpServer((req, res) => {
      seen.push(`${req.method} ${req.url} ${req.headers.authorization ?? ''}`);
      if (req.url === '/json') return void res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ mediaType: 'db-password=hunter2' }));
      res.writeHead(404, { 'content-type': 'application/json' }).end(JSON.stringify({ errors: [{ code: 'SECRET', message: 'db-password=hunter2' }] }));
    });
    await new Promise<void>((resolve) => internal.listen(0, '127.0.0.2', resolve));
    const elsewhere = `127.0.0.2:${(internal.address() as AddressInfo).port}`;
    try {
      serve('to-internal', wasmLayerOf(wasmOfSize(100)), (res) => void res.writeHead(302, { location: `http://${elsewhere}/internal/admin` }).end());
      const error = await fetchOci(`oci://${registry.host}/to-internal:v1`, await options()).then(() => undefined, (e: unknown) => e as Error);
      expect(error).toMatchObject({ code: 'REGISTRY_NOT_FOUND' });
      expect(error?.message).not.toContain('hunter2');
      expect(seen).toEqual(['GET /internal/admin ']);
      // Nor a manifest from there (red team 13: its fields were echoed into errors /readyz shows).
      registry.route('manifest-elsewhere', (_kind, _ref, _req, res) => void res.writeHead(302, { location: `http://${elsewhere}/json` }).end());
      const moved = await fetchOci(`oci://${registry.host}/manifest-elsewhere:v1`, await options()).then(() => undefined, (e: unknown) => e as Error);
      expect(moved).toMatchObject({ code: 'REGISTRY_PROTOCOL', message: expect.stringContaining(`sent the manifest from another host (${elsewhere}); a manifest is read only from the registry itself`) as unknown });
      expect(moved?.message).not.toContain('hunter2');
      seen.length = 0;
      // A realm on another host over plain HTTP gets nothing, though the registry itself is listed as insecure.
      registry.route('realm-elsewhere', (_kind, _ref, _req, res) => void res.writeHead(401, { 'www-authenticate': `Bearer realm="http://${elsewhere}/token",service="s"` }).end());
      const dir = await mkdtemp(join(tmpdir(), 'portcullis-oci-realm-'));
      const dockerConfig = join(dir, 'config.json');
      await writeFile(dockerConfig, JSON.stringify({ auths: { [registry.host]: { auth: Buffer.from('alice:s3cret').toString('base64') } } }));
      await expect(fetchOci(`oci://${registry.host}/realm-elsewhere:v1`, await options({ dockerConfig }))).rejects.toMatchObject({
        code: 'REGISTRY_PROTOCOL', message: expect.stringContaining(`asks for a token from http://${elsewhere}, which is not https; refusing to send credentials there`) as unknown,
      });
      expect(seen).toEqual([]);
    } finally {
      internal.close();
    }
  });

  it('refuses a token that cannot be sent as a header (a line break in it)', async () => {
    registry.route('crlf', (_kind, _ref, req, res) => {
      if (req.headers.authorization) return void send(res, manifestOf([wasmLayerOf(wasmOfSize(100))]));
      res.writeHead(401, { 'www-authenticate': `Bearer realm="http://${registry.host}/v2/crlf-token/manifests/t",service="s"` }).end();
    });
    registry.route('crlf-token', (_kind, _ref, _req, res) => send(res, Buffer.from(JSON.stringify({ token: 'a\r\nx-injected: 1' })), 'application/json'));
    await expect(fetchOci(`oci://${registry.host}/crlf:v1`, await options())).rejects.toMatchObject({
      code: 'REGISTRY_PROTOCOL', message: expect.stringContaining('could not be made from what the registry answered') as unknown,
    });
  });
});

/** Headers at once, then a byte every 100 ms until the client goes: never idle, never done. */
function drip(res: ServerResponse, first: Uint8Array = Buffer.from(' ')): void {
  res.writeHead(200, { 'content-type': 'application/vnd.oci.image.manifest.v1+json' });
  res.write(first);
  const timer = setInterval(() => res.write(' '), 100);
  res.on('close', () => clearInterval(timer));
}

describe('deadlines', () => {
  it('ends a manifest body that drips forever at the whole-request deadline, naming the registry', async () => {
    registry.route('drip', (_kind, _ref, _req, res) => drip(res));
    const started = Date.now();
    await expect(fetchOci(`oci://${registry.host}/drip:v1`, await options({ timeouts: { requestMs: 1000, blobBytesPerSecond: MiB } }))).rejects.toMatchObject({
      code: 'REGISTRY_UNREACHABLE',
      message: `manifest of oci://${registry.host}/drip:v1: no complete answer from ${registry.host} (http) within 1 s (the whole request; the registry or the network is stalled or very slow); nothing is cached for oci://${registry.host}/drip:v1 to start from`,
    });
    expect(Date.now() - started).toBeLessThan(4000);
  });

  it('gives a blob the request deadline plus a second per blobBytesPerSecond of its size', async () => {
    const module = wasmOfSize(2000);
    serve('blobdrip', wasmLayerOf(module), (res) => drip(res, module.subarray(0, 8)));
    const started = Date.now();
    // 0.5 s + 2000 bytes at 1600 a second = 1.75 s, said as 1.8 (a blob's deadline is rarely round).
    await expect(fetchOci(`oci://${registry.host}/blobdrip:v1`, await options({ timeouts: { requestMs: 500, blobBytesPerSecond: 1600 } }))).rejects.toMatchObject({
      code: 'REGISTRY_UNREACHABLE', message: expect.stringContaining(`layer policy.wasm of oci://${registry.host}/blobdrip:v1: no complete answer from ${registry.host} (http) within 1.8 s`),
    });
    const elapsed = Date.now() - started;
    expect(elapsed).toBeGreaterThan(1700);
    expect(elapsed).toBeLessThan(4500);
  });

  it('holds a request to one deadline across its 401, token exchange and second try', async () => {
    // Each step takes 0.6 s of a 1 s deadline: once three deadlines in all (session 34's note).
    const module = wasmOfSize(100);
    const later = (res: ServerResponse, answer: () => void) => setTimeout(() => !res.destroyed && answer(), 600);
    registry.route('slow401', (kind, _ref, req, res) => later(res, () => {
      if (!req.headers.authorization) return void res.writeHead(401, { 'www-authenticate': `Bearer realm="http://${registry.host}/v2/slow401-token/manifests/t",service="s"` }).end();
      send(res, kind === 'manifests' ? manifestOf([wasmLayerOf(module)]) : module, kind === 'manifests' ? undefined : 'application/octet-stream');
    }));
    registry.route('slow401-token', (_kind, _ref, _req, res) => later(res, () => send(res, Buffer.from(JSON.stringify({ token: 't' })), 'application/json')));
    const started = Date.now();
    await expect(fetchOci(`oci://${registry.host}/slow401:v1`, await options({ timeouts: { requestMs: 1000, blobBytesPerSecond: MiB } }))).rejects.toMatchObject({
      code: 'REGISTRY_UNREACHABLE',
      message: expect.stringContaining(`no complete answer from ${registry.host} (http) within 1 s (the whole request;`) as unknown,
    });
    expect(Date.now() - started).toBeLessThan(1600);
  });

  it('lets serve exit on SIGTERM while a reload waits on a registry that drips', async () => {
    registry.route('serve-drip', (_kind, _ref, _req, res) => drip(res));
    const dir = await mkdtemp(join(tmpdir(), 'portcullis-oci-sigterm-'));
    const config = (policies: string) => writeFile(join(dir, 'config.yaml'), [
      'server: { host: 127.0.0.1, port: 0, shutdownDelayMs: 0, tls: { mode: insecure } }',
      `registries: { insecure: ["${registry.host}"], cacheDir: ${JSON.stringify(join(dir, 'oci'))} }`,
      `policies: ${policies}`,
    ].join('\n'));
    await config('[]');
    const bin = fileURLToPath(new URL('../../host/bin/portcullis.js', import.meta.url));
    const child = spawn(process.execPath, [bin, 'serve', '--config', join(dir, 'config.yaml')], { env: { ...process.env, PORTCULLIS_CACHE: dir }, stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr.on('data', (d: Buffer) => { stderr += d.toString(); });
    const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
    const until = async (done: () => boolean, what: string) => {
      for (const started = Date.now(); !done(); await new Promise((r) => setTimeout(r, 50))) {
        if (Date.now() - started > 8000 || child.exitCode !== null) throw new Error(`${what}: ${stderr}`);
      }
    };
    try {
      await until(() => stderr.includes('"msg":"ready"'), 'serve never got ready');
      await config(`[{ name: dripping, module: "oci://${registry.host}/serve-drip:v1" }]`);
      child.kill('SIGHUP');
      await until(() => registry.requests.some((line) => line.includes('/serve-drip/manifests/')), 'the reload never asked the registry');
      const signalled = Date.now();
      child.kill('SIGTERM');
      expect(await exited).toBe(0);
      expect(Date.now() - signalled).toBeLessThan(8000);
    } finally {
      child.kill('SIGKILL');
    }
  }, 20_000);

  // Last: abandoning is for good, in this process.
  it('abandons requests under way when told to (shutdown), and fails later ones at once', async () => {
    registry.route('stalled', (_kind, _ref, _req, res) => drip(res));
    const pulling = fetchOci(`oci://${registry.host}/stalled:v1`, await options());
    setTimeout(abandonRegistryRequests, 300);
    await expect(pulling).rejects.toMatchObject({ code: 'REGISTRY_UNREACHABLE', message: expect.stringContaining('abandoned: the host is shutting down') });
    await expect(fetchOci(`oci://${registry.host}/stalled:v2`, await options())).rejects.toThrow('abandoned: the host is shutting down');
  });
});

