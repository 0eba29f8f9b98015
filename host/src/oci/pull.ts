// Pulling one policy: resolve the reference to a manifest, check it against a pinned digest,
// find the Wasm layer, and take its bytes from the cache or the registry, checking every blob
// against its descriptor before it is used or cached.
import { isWasm, MANIFEST_TYPES, parseManifest, wasmLayer, type Descriptor } from './artifact.ts';
import { sha256Digest, type BlobCache } from './cache.ts';
import type { RegistryClient } from './client.ts';
import { RegistryError } from './errors.ts';
import { formatReference, manifestReference, type OciReference } from './reference.ts';

export interface PulledPolicy {
  bytes: Uint8Array;
  /** What the reference resolved to: pin it with oci://REG/REPO@<manifestDigest>. */
  manifestDigest: string;
  layer: Descriptor;
}

/** The cache key for a tag; digests need none, they are their own key. */
export function tagKey(ref: OciReference): string | undefined {
  return ref.tag && !ref.digest ? `${ref.registry}/${ref.repository}:${ref.tag}` : undefined;
}

export async function pullPolicy(client: RegistryClient, ref: OciReference, cache: BlobCache, onCacheError: (error: unknown) => void): Promise<PulledPolicy> {
  const where = formatReference(ref);
  const manifest = await client.getManifest(manifestReference(ref), MANIFEST_TYPES, `manifest of ${where}`);
  const manifestDigest = sha256Digest(manifest.bytes);
  if (ref.digest && manifestDigest !== ref.digest) {
    throw new RegistryError('DIGEST_MISMATCH', `${where}: the registry's manifest hashes to ${manifestDigest}, not the pinned digest; refusing it`);
  }
  const layer = wasmLayer(parseManifest(manifest.bytes, manifest.mediaType, where), where);
  const what = `layer ${layer.annotations?.['org.opencontainers.image.title'] ?? layer.digest} of ${where}`;
  let bytes = await cache.getBlob(layer.digest);
  if (!bytes) {
    bytes = verify(await client.getBlob(layer.digest, layer.size, what), layer, what);
    await cache.putBlob(layer.digest, bytes).catch(onCacheError);
  }
  requireWasm(bytes, what);
  // The manifest last, so a cached manifest always has its layer beside it.
  await cache.putBlob(manifestDigest, manifest.bytes).catch(onCacheError);
  const key = tagKey(ref);
  if (key) await cache.setTag(key, manifestDigest).catch(onCacheError);
  return { bytes, manifestDigest, layer };
}

/** The policy as cached under a manifest digest, if the manifest and its layer are both there. */
export async function cachedPolicy(cache: BlobCache, manifestDigest: string, where: string): Promise<PulledPolicy | undefined> {
  const manifest = await cache.getBlob(manifestDigest);
  if (!manifest) return undefined;
  const layer = wasmLayer(parseManifest(manifest, undefined, where), where);
  const bytes = await cache.getBlob(layer.digest);
  return bytes && isWasm(bytes) ? { bytes, manifestDigest, layer } : undefined;
}

function verify(bytes: Uint8Array, descriptor: Descriptor, what: string): Uint8Array {
  const digest = sha256Digest(bytes);
  if (digest !== descriptor.digest || bytes.length !== descriptor.size) {
    throw new RegistryError('DIGEST_MISMATCH', `${what}: the blob received (${bytes.length} bytes, ${digest}) does not match its descriptor (${descriptor.size} bytes, ${descriptor.digest}); refusing the policy`);
  }
  return bytes;
}

function requireWasm(bytes: Uint8Array, what: string): void {
  if (!isWasm(bytes)) throw new RegistryError('NO_WASM_LAYER', `${what} is not WebAssembly (it does not start with \\0asm)`);
}
