// Policies in a real registry (CNCF distribution over plain HTTP): what `portcullis push`
// writes comes back byte for byte; artifacts in the shapes oras and Kubewarden write are
// pulled and run; anything that does not hash to what it claims is refused.
import { mkdtemp, readFile, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { evaluatePolicy } from '../../host/src/evaluate/evaluate.ts';
import { fetchOci, fetchOciModule, type OciOptions } from '../../host/src/oci/fetcher.ts';
import { openClient, resolveOptions } from '../../host/src/oci/options.ts';
import { pushPolicy } from '../../host/src/oci/push.ts';
import { parseReference } from '../../host/src/oci/reference.ts';
import { SandboxPool } from '../../host/src/sandbox/pool.ts';
import { input, options as policyOptions, wasm } from '../helpers/policies.ts';
import { loadPolicy } from '../../host/src/policy/load.ts';
import { blobDataPath, putManifest, sha256, startRegistry, uploadBlob, type TestRegistry } from '../helpers/registry.ts';

let registry: TestRegistry;
let pool: SandboxPool;
const noDelete = await readFile(wasm('no-delete'));
const numbers = await readFile(wasm('numbers'));

beforeAll(async () => {
  registry = await startRegistry();
  pool = new SandboxPool(1);
});
afterAll(async () => {
  await pool?.close();
  await registry?.stop();
});

/** Each test its own cache, so nothing is served from another test's pulls. */
async function options(extra: Partial<OciOptions> = {}): Promise<OciOptions> {
  return { insecure: [registry.host], cacheDir: await mkdtemp(join(tmpdir(), 'portcullis-oci-cache-')), ...extra };
}

async function push(reference: string, bytes: Uint8Array, title: string): Promise<string> {
  const ref = parseReference(reference);
  const client = await openClient(ref, await resolveOptions({ insecure: [registry.host] }), 'pull,push');
  try {
    return await pushPolicy(client, ref, bytes, title);
  } finally {
    await client.close();
  }
}

async function manifestOf(repository: string, reference: string): Promise<Record<string, unknown>> {
  const response = await fetch(`${registry.url}/v2/${repository}/manifests/${reference}`, { headers: { accept: 'application/vnd.oci.image.manifest.v1+json' } });
  return (await response.json()) as Record<string, unknown>;
}

/**
 * The module plus a custom section naming the test: distribution shares blobs across
 * repositories, so a test that damages one must own it.
 */
function unique(bytes: Uint8Array, label: string): Uint8Array {
  const name = new TextEncoder().encode(`portcullis-test:${label}`);
  return new Uint8Array([...bytes, 0, name.length + 1, name.length, ...name]);
}

const EMPTY = { mediaType: 'application/vnd.oci.empty.v1+json', digest: 'sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a', size: 2 };

describe('push and pull', () => {
  it.each([['no-delete', noDelete], ['numbers', numbers]])('round-trips %s byte for byte', async (name, bytes) => {
    const digest = await push(`oci://${registry.host}/policies/${name}:v1`, bytes, `${name}.wasm`);
    const pulled = await fetchOci(`oci://${registry.host}/policies/${name}:v1`, await options());
    expect(Buffer.from(pulled.bytes).equals(bytes)).toBe(true);
    expect(pulled.manifestDigest).toBe(digest);
    expect(pulled.fromCache).toBe(false);
  });

  it('writes an OCI manifest with the Kubewarden media types and an oras title', async () => {
    await push(`oci://${registry.host}/policies/shape:v1`, noDelete, 'no-delete.wasm');
    expect(await manifestOf('policies/shape', 'v1')).toEqual({
      schemaVersion: 2,
      mediaType: 'application/vnd.oci.image.manifest.v1+json',
      config: { mediaType: 'application/vnd.wasm.config.v1+json', digest: EMPTY.digest, size: 2 },
      layers: [{
        mediaType: 'application/vnd.wasm.content.layer.v1+wasm', digest: sha256(noDelete), size: noDelete.length,
        annotations: { 'org.opencontainers.image.title': 'no-delete.wasm' },
      }],
    });
  });

  it('pushes the same .wasm twice to the same digest, skipping blobs the registry has', async () => {
    const first = await push(`oci://${registry.host}/policies/again:a`, numbers, 'numbers.wasm');
    const second = await push(`oci://${registry.host}/policies/again:b`, numbers, 'numbers.wasm');
    expect(second).toBe(first);
  });

  it('picks up a re-pushed tag on the next fetch', async () => {
    const reference = `oci://${registry.host}/policies/moving:stable`;
    const opts = await options();
    await push(reference, noDelete, 'no-delete.wasm');
    expect(Buffer.from(await fetchOciModule(reference, opts)).equals(noDelete)).toBe(true);
    await push(reference, numbers, 'numbers.wasm');
    expect(Buffer.from(await fetchOciModule(reference, opts)).equals(numbers)).toBe(true);
  });
});

describe('artifact shapes people push', () => {
  const layer = (mediaType: string, title?: string) => ({ mediaType, ...(title ? { annotations: { 'org.opencontainers.image.title': title } } : {}) });
  // Byte for byte what each tool writes (key order, compact JSON, oras' inline empty config).
  const shapes: Record<string, (blob: { digest: string; size: number }, config: { digest: string; size: number }) => string> = {
    'oras push': (blob) => `{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","artifactType":"application/vnd.unknown.artifact.v1","config":{"mediaType":"application/vnd.oci.empty.v1+json","digest":"${EMPTY.digest}","size":2,"data":"e30="},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"${blob.digest}","size":${blob.size},"annotations":{"org.opencontainers.image.title":"policy.wasm"}}],"annotations":{"org.opencontainers.image.created":"2025-01-02T03:04:05Z"}}`,
    'oras push --artifact-type': (blob) => `{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","artifactType":"application/vnd.portcullis.policy.v1","config":{"mediaType":"application/vnd.oci.empty.v1+json","digest":"${EMPTY.digest}","size":2,"data":"e30="},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"${blob.digest}","size":${blob.size},"annotations":{"org.opencontainers.image.title":"policy.wasm"}}],"annotations":{"org.opencontainers.image.created":"2025-01-02T03:04:05Z"}}`,
    'kwctl push (Kubewarden)': (blob, config) => `{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.wasm.config.v1+json","digest":"${config.digest}","size":${config.size}},"layers":[{"mediaType":"application/vnd.wasm.content.layer.v1+wasm","digest":"${blob.digest}","size":${blob.size}}],"annotations":{"io.kubewarden.policy.title":"no-delete"}}`,
    'CNCF Wasm OCI artifact': (blob, config) => JSON.stringify({
      schemaVersion: 2, mediaType: 'application/vnd.oci.image.manifest.v1+json', artifactType: 'application/wasm',
      config: { mediaType: 'application/vnd.wasm.config.v0+json', digest: config.digest, size: config.size },
      layers: [{ ...layer('application/wasm', 'module.wasm'), digest: blob.digest, size: blob.size }],
    }),
  };

  it.each(Object.keys(shapes))('pulls and runs what %s writes', async (shape) => {
    const repository = `shapes/${shape.replace(/[^a-z]+/gi, '-').replace(/-$/, '').toLowerCase()}`;
    const blob = await uploadBlob(registry, repository, noDelete);
    await uploadBlob(registry, repository, '{}');
    const config = await uploadBlob(registry, repository, '{"created":"2025-01-02T03:04:05Z","architecture":"wasm","os":"wasip1"}');
    const text = shapes[shape]!(blob, config);
    const mediaType = 'application/vnd.oci.image.manifest.v1+json';
    const digest = await putManifest(registry, repository, 'v1', text, mediaType);
    const policy = await loadPolicy(pool, policyOptions('no-delete', { module: `oci://${registry.host}/${repository}:v1` }), undefined, await options());
    expect(policy.digest).toBe(sha256(noDelete).slice('sha256:'.length));
    const precious = { metadata: { name: 'precious', labels: { 'portcullis.dev/no-delete': 'true' } } };
    expect(await evaluatePolicy(pool, policy, 'validate', input({ operation: 'DELETE', oldObject: precious }))).toMatchObject({ status: 'denied' });
    expect(await evaluatePolicy(pool, policy, 'validate', input({ operation: 'UPDATE', object: precious, oldObject: precious }))).toMatchObject({ status: 'allowed' });
    // The same artifact pinned by its manifest digest.
    expect(Buffer.from(await fetchOciModule(`oci://${registry.host}/${repository}@${digest}`, await options())).equals(noDelete)).toBe(true);
  });

  async function artifact(repository: string, layers: { title?: string; mediaType: string; bytes: Uint8Array | string }[]): Promise<string> {
    const descriptors = [];
    for (const l of layers) descriptors.push({ ...layer(l.mediaType, l.title), ...(await uploadBlob(registry, repository, l.bytes)) });
    await uploadBlob(registry, repository, '{}');
    const text = JSON.stringify({
      schemaVersion: 2, mediaType: 'application/vnd.oci.image.manifest.v1+json', artifactType: 'application/vnd.unknown.artifact.v1',
      config: EMPTY, layers: descriptors,
    });
    await putManifest(registry, repository, 'v1', text, 'application/vnd.oci.image.manifest.v1+json');
    return `oci://${registry.host}/${repository}:v1`;
  }

  it('refuses an artifact with no Wasm layer, naming what it has', async () => {
    const reference = await artifact('shapes/docs', [
      { title: 'README.md', mediaType: 'text/markdown', bytes: '# hello' },
      { title: 'LICENSE', mediaType: 'text/plain', bytes: 'MIT' },
    ]);
    await expect(fetchOciModule(reference, await options())).rejects.toMatchObject({
      code: 'NO_WASM_LAYER',
      message: `${reference} holds no Wasm layer (its layers are README.md (text/markdown), LICENSE (text/plain)); push the policy with \`portcullis push\` or \`oras push REF policy.wasm\``,
    });
  });

  it('refuses a single layer that is not WebAssembly', async () => {
    const reference = await artifact('shapes/text', [{ title: 'notes', mediaType: 'application/vnd.oci.image.layer.v1.tar', bytes: 'not wasm at all' }]);
    await expect(fetchOciModule(reference, await options())).rejects.toMatchObject({ code: 'NO_WASM_LAYER', message: expect.stringContaining('layer notes of') });
  });

  it('refuses an artifact with two Wasm layers rather than guess', async () => {
    const reference = await artifact('shapes/two', [
      { title: 'no-delete.wasm', mediaType: 'application/vnd.oci.image.layer.v1.tar', bytes: noDelete },
      { title: 'numbers.wasm', mediaType: 'application/vnd.oci.image.layer.v1.tar', bytes: numbers },
    ]);
    await expect(fetchOciModule(reference, await options())).rejects.toMatchObject({
      code: 'SEVERAL_WASM_LAYERS', message: expect.stringMatching(/has 2 Wasm layers: no-delete\.wasm .*, numbers\.wasm .*; a policy artifact must hold exactly one/),
    });
  });

  it('refuses an image index, pointing at a manifest digest', async () => {
    const digest = await push(`oci://${registry.host}/shapes/index:single`, noDelete, 'no-delete.wasm');
    const index = JSON.stringify({
      schemaVersion: 2, mediaType: 'application/vnd.oci.image.index.v1+json',
      manifests: [{ mediaType: 'application/vnd.oci.image.manifest.v1+json', digest, size: (await manifestBytes('shapes/index', digest)).length }],
    });
    await putManifest(registry, 'shapes/index', 'multi', index, 'application/vnd.oci.image.index.v1+json');
    await expect(fetchOciModule(`oci://${registry.host}/shapes/index:multi`, await options())).rejects.toMatchObject({
      code: 'UNSUPPORTED_MANIFEST', message: `oci://${registry.host}/shapes/index:multi is an image index of 1 manifest(s), not a single policy artifact; reference one manifest by digest (for example @${digest})`,
    });
  });

  async function manifestBytes(repository: string, digest: string): Promise<Uint8Array> {
    const response = await fetch(`${registry.url}/v2/${repository}/manifests/${digest}`, { headers: { accept: 'application/vnd.oci.image.manifest.v1+json' } });
    return new Uint8Array(await response.arrayBuffer());
  }
});

describe('verification', () => {
  it('refuses a layer whose bytes were changed in the registry', async () => {
    const reference = `oci://${registry.host}/verify/tampered:v1`;
    const mine = unique(numbers, 'tampered');
    await push(reference, mine, 'numbers.wasm');
    const path = blobDataPath(registry, sha256(mine));
    const bytes = await readFile(path);
    bytes[bytes.length - 1]! ^= 0xff;
    await writeFile(path, bytes);
    await expect(fetchOciModule(reference, await options())).rejects.toMatchObject({
      code: 'DIGEST_MISMATCH',
      message: `layer numbers.wasm of ${reference}: the blob received (${mine.length} bytes, ${sha256(bytes)}) does not match its descriptor (${mine.length} bytes, ${sha256(mine)}); refusing the policy`,
    });
  });

  it('accepts a reference pinned by the right digest', async () => {
    const digest = await push(`oci://${registry.host}/verify/pinned:v1`, noDelete, 'no-delete.wasm');
    const pulled = await fetchOci(`oci://${registry.host}/verify/pinned@${digest}`, await options());
    expect(Buffer.from(pulled.bytes).equals(noDelete)).toBe(true);
    // tag@digest: the digest decides.
    expect((await fetchOci(`oci://${registry.host}/verify/pinned:whatever@${digest}`, await options())).manifestDigest).toBe(digest);
  });

  it('refuses a digest the registry does not have, saying the manifest is missing', async () => {
    const wrong = sha256('no such manifest');
    const reference = `oci://${registry.host}/verify/pinned@${wrong}`;
    await push(`oci://${registry.host}/verify/pinned:v1`, noDelete, 'no-delete.wasm');
    await expect(fetchOciModule(reference, await options())).rejects.toMatchObject({
      code: 'REGISTRY_NOT_FOUND', message: expect.stringMatching(new RegExp(`^manifest of ${reference.replace(/[.]/g, '\\.')}: the registry has no such manifest .*MANIFEST_UNKNOWN`)),
    });
  });

  it('refuses manifest bytes that do not hash to the pinned digest', async () => {
    const digest = await push(`oci://${registry.host}/verify/forged:v1`, unique(numbers, 'forged'), 'numbers.wasm');
    // The registry serves a manifest by digest from its blob store: change it behind its back.
    const path = blobDataPath(registry, digest);
    const text = (await readFile(path, 'utf8')).replace('numbers.wasm', 'numbers.wasn');
    await writeFile(path, text);
    await expect(fetchOciModule(`oci://${registry.host}/verify/forged@${digest}`, await options())).rejects.toMatchObject({
      code: 'DIGEST_MISMATCH', message: expect.stringContaining(`the registry's manifest hashes to ${sha256(text)}, not the pinned digest; refusing it`),
    });
  });

  it('says which blob is missing', async () => {
    const other = `oci://${registry.host}/verify/elsewhere:v1`;
    // distribution checks blobs when a manifest is PUT: unlink the layer from the repository after.
    const mine = unique(noDelete, 'missing');
    await push(other, mine, 'no-delete.wasm');
    const deleted = await fetch(`${registry.url}/v2/verify/elsewhere/blobs/${sha256(mine)}`, { method: 'DELETE' });
    expect(deleted.status).toBe(202);
    await expect(fetchOciModule(other, await options())).rejects.toMatchObject({
      code: 'REGISTRY_NOT_FOUND', message: expect.stringContaining(`layer no-delete.wasm of ${other}: blob ${sha256(mine)} listed by the manifest is missing from the repository`),
    });
  });
});

describe('reaching the registry', () => {
  it('refuses plain HTTP to a registry not listed as insecure, and says how to allow it', async () => {
    await push(`oci://${registry.host}/reach/plain:v1`, noDelete, 'no-delete.wasm');
    await expect(fetchOciModule(`oci://${registry.host}/reach/plain:v1`, await options({ insecure: [] }))).rejects.toMatchObject({
      code: 'REGISTRY_TLS', message: expect.stringMatching(/TLS error talking to 127\.0\.0\.1:\d+ \(https\).*list it as insecure/),
    });
  });
});
