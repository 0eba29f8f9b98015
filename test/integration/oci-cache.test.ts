// The cache lets the host start when the registry is down: the last pulled copy of a tag is
// used, and the log says so. It never stands in while the registry answers.
import { mkdtemp, readFile, readdir, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { fetchOci, type OciOptions } from '../../host/src/oci/fetcher.ts';
import { openClient, resolveOptions } from '../../host/src/oci/options.ts';
import { pushPolicy } from '../../host/src/oci/push.ts';
import { parseReference } from '../../host/src/oci/reference.ts';
import { wasm } from '../helpers/policies.ts';
import { sha256, startRegistry, type TestRegistry } from '../helpers/registry.ts';

const noDelete = await readFile(wasm('no-delete'));
const numbers = await readFile(wasm('numbers'));
let registry: TestRegistry;
let cacheDir: string;
const logs: { level: string; message: string; fields?: Record<string, string> }[] = [];
let options: OciOptions;

beforeAll(async () => {
  registry = await startRegistry();
  cacheDir = await mkdtemp(join(tmpdir(), 'portcullis-oci-cache-'));
  options = { insecure: [registry.host], cacheDir, log: (level, message, fields) => logs.push({ level, message, ...(fields ? { fields } : {}) }) };
});
afterAll(() => registry?.stop());

async function push(reference: string, bytes: Uint8Array): Promise<string> {
  const ref = parseReference(reference);
  const client = await openClient(ref, await resolveOptions(options), 'pull,push');
  try {
    return await pushPolicy(client, ref, bytes, 'policy.wasm');
  } finally {
    await client.close();
  }
}

describe('the OCI cache', () => {
  let tagged: string;
  let pinned: string;
  let digest: string;

  it('stores blobs by digest and tags in an index', async () => {
    tagged = `oci://${registry.host}/cached/policy:v1`;
    digest = await push(tagged, noDelete);
    pinned = `oci://${registry.host}/cached/policy@${digest}`;
    await push(`oci://${registry.host}/cached/other:v1`, numbers);
    await fetchOci(tagged, options);
    await fetchOci(`oci://${registry.host}/cached/other:v1`, options);
    const blobs = await readdir(join(cacheDir, 'blobs', 'sha256'));
    expect(blobs).toEqual(expect.arrayContaining([digest, sha256(noDelete), sha256(numbers)].map((d) => d.slice(7))));
    expect(JSON.parse(await readFile(join(cacheDir, 'index.json'), 'utf8'))).toMatchObject({ [`${registry.host}/cached/policy:v1`]: digest });
    expect(logs.at(-1)).toMatchObject({ level: 'info', message: expect.stringMatching(/^pulled oci:\/\/.*cached\/other:v1 \(sha256:/) });
  });

  it('serves a digest reference from the cache without asking the registry', async () => {
    const pulled = await fetchOci(pinned, options);
    expect(pulled.fromCache).toBe(true);
    expect(Buffer.from(pulled.bytes).equals(noDelete)).toBe(true);
  });

  it('ignores a damaged cache file and fetches again', async () => {
    const path = join(cacheDir, 'blobs', 'sha256', sha256(noDelete).slice(7));
    await writeFile(path, 'garbage');
    const pulled = await fetchOci(tagged, options);
    expect(pulled.fromCache).toBe(false);
    expect(Buffer.from(pulled.bytes).equals(noDelete)).toBe(true);
    expect(Buffer.from(await readFile(path)).equals(noDelete)).toBe(true);
  });

  it('starts from the cache when the registry is down, and logs it', async () => {
    await registry.stop();
    logs.length = 0;
    const pulled = await fetchOci(tagged, options);
    expect(pulled).toMatchObject({ fromCache: true, manifestDigest: digest });
    expect(Buffer.from(pulled.bytes).equals(noDelete)).toBe(true);
    expect(logs).toEqual([{
      level: 'warn',
      message: `registry ${registry.host} unreachable; using cached ${digest} for ${tagged}`,
      fields: {
        registry: registry.host, repository: 'cached/policy', reference: 'v1', digest,
        error: expect.stringContaining(`manifest of ${tagged}: cannot reach ${registry.host} (http): connection refused`),
      },
    }]);
  });

  it('says so when the registry is down and nothing is cached', async () => {
    const reference = `oci://${registry.host}/cached/never-pulled:v1`;
    await expect(fetchOci(reference, options)).rejects.toMatchObject({
      code: 'REGISTRY_UNREACHABLE',
      message: `manifest of ${reference}: cannot reach ${registry.host} (http): connection refused (is the registry running, and on that port?); nothing is cached for ${reference} to start from`,
    });
  });
});
