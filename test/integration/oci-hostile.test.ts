// The OCI client against a registry that misbehaves on purpose (red team, hostile registry):
// layers larger than the module limit, sizes that lie, layers that are not Wasm, and the
// same layer asked for by several policies at once.
import { mkdtemp, readdir } from 'node:fs/promises';
import type { ServerResponse } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { fetchOci, type OciOptions } from '../../host/src/oci/fetcher.ts';
import { readModule } from '../../host/src/policy/source.ts';
import { manifestOf, send, startHostileRegistry, wasmLayerOf, wasmOfSize, type HostileRegistry } from '../helpers/hostile-registry.ts';
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
