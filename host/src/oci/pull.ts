// Pulling one policy: resolve the reference to a manifest, check it against a pinned digest,
// find the Wasm layer, and take its bytes from the cache or the registry, checking every blob
// against its descriptor before it is used or cached. A layer larger than the module limit is
// refused before it is asked for, and nothing refused is cached.
import { mib } from '../util/text.ts';
import { isWasm, layerName, MANIFEST_TYPES, parseManifest, wasmLayer, type Descriptor } from './artifact.ts';
import { sha256Digest, type BlobCache } from './cache.ts';
import { MAX_SMALL, type RegistryClient } from './client.ts';
import { RegistryError } from './errors.ts';
import type { ModuleLimit } from './options.ts';
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

export async function pullPolicy(
  client: RegistryClient, ref: OciReference, cache: BlobCache, limit: ModuleLimit, onCacheError: (error: unknown) => void,
): Promise<PulledPolicy> {
  const where = formatReference(ref);
  const manifest = await client.getManifest(manifestReference(ref), MANIFEST_TYPES, `manifest of ${where}`);
  const manifestDigest = sha256Digest(manifest.bytes);
  if (ref.digest && manifestDigest !== ref.digest) {
    throw new RegistryError('DIGEST_MISMATCH', `${where}: the registry's manifest hashes to ${manifestDigest}, not the pinned digest; refusing it`);
  }
  const layer = wasmLayer(parseManifest(manifest.bytes, manifest.mediaType, where), where);
  const what = `layer ${layerName(layer)} of ${where}`;
  requireSize(layer, limit, what);
  const cached = await cache.getBlob(layer.digest, layer.size);
  const bytes = cached && isWasm(cached) ? cached : await download(client, cache, layer, what, onCacheError);
  // The manifest last, so a cached manifest always has its layer beside it.
  await cache.putBlob(manifestDigest, manifest.bytes).catch(onCacheError);
  const key = tagKey(ref);
  if (key) await cache.setTag(key, manifestDigest).catch(onCacheError);
  return { bytes, manifestDigest, layer };
}

/** The policy as cached under a manifest digest, if the manifest and its layer are both there. */
export async function cachedPolicy(cache: BlobCache, manifestDigest: string, where: string, limit: ModuleLimit): Promise<PulledPolicy | undefined> {
  const manifest = await cache.getBlob(manifestDigest, MAX_SMALL);
  if (!manifest) return undefined;
  const layer = wasmLayer(parseManifest(manifest, undefined, where), where);
  // Cached before the limit was lowered: not worth reading into memory only to be refused.
  if (layer.size > limit.maxBytes) return undefined;
  const bytes = await cache.getBlob(layer.digest, layer.size);
  return bytes && isWasm(bytes) ? { bytes, manifestDigest, layer } : undefined;
}

// Policies naming one tag load in parallel: one download of their layer, not one each (red
// team: three policies on a 1 GiB tag fetched it three times at once). The same digest and
// size from the same repository is the same blob; the first caller's client fetches it.
const downloads = new Map<string, Promise<Uint8Array>>();

function download(client: RegistryClient, cache: BlobCache, layer: Descriptor, what: string, onCacheError: (error: unknown) => void): Promise<Uint8Array> {
  const key = [cache.dir, client.registry, client.repository, layer.digest, layer.size].join('\0');
  let pending = downloads.get(key);
  if (!pending) {
    pending = (async () => {
      const bytes = verify(await client.getBlob(layer.digest, layer.size, what, (head) => requireWasm(head, what)), layer, what);
      requireWasm(bytes, what);
      await cache.putBlob(layer.digest, bytes).catch(onCacheError);
      return bytes;
    })().finally(() => downloads.delete(key));
    downloads.set(key, pending);
  }
  return pending;
}

// The manifest's size is the registry's word: the transport also stops reading past it.
function requireSize(layer: Descriptor, limit: ModuleLimit, what: string): void {
  if (layer.size <= limit.maxBytes) return;
  throw new RegistryError('MODULE_TOO_LARGE', `${what} is ${mib(layer.size)} MiB, above ${limit.setting} (${mib(limit.maxBytes)} MiB); `
    + `refused without downloading it (raise ${limit.setting} if the policy really is that large)`);
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
