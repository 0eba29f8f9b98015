// Publishing one policy: upload the config and the .wasm (skipping blobs the registry already
// has), then tag a manifest naming them. See policyManifest for the shape and why.
import { OCI_MANIFEST, policyManifest } from './artifact.ts';
import { sha256Digest } from './cache.ts';
import type { RegistryClient } from './client.ts';
import { RegistryError } from './errors.ts';
import { formatReference, type OciReference } from './reference.ts';

const CONFIG = new TextEncoder().encode('{}');

/** Returns the manifest digest, which pins exactly what was pushed. */
export async function pushPolicy(client: RegistryClient, ref: OciReference, wasm: Uint8Array, title: string): Promise<string> {
  const where = formatReference(ref);
  if (!ref.tag || ref.digest) throw new RegistryError('BAD_REFERENCE', `${where}: push needs a tag (oci://REGISTRY/REPO:TAG), not a digest`);
  const layer = { digest: sha256Digest(wasm), size: wasm.length, title };
  const config = { digest: sha256Digest(CONFIG), size: CONFIG.length };
  for (const [blob, bytes, name] of [[layer, wasm, title], [config, CONFIG, 'config']] as const) {
    const what = `blob ${blob.digest} (${name}) of ${where}`;
    if (!(await client.hasBlob(blob.digest, what))) await client.putBlob(blob.digest, bytes, what);
  }
  const manifest = policyManifest(layer, config);
  const digest = sha256Digest(manifest);
  const stored = await client.putManifest(ref.tag, manifest, OCI_MANIFEST, `manifest of ${where}`);
  if (stored && stored !== digest) {
    throw new RegistryError('DIGEST_MISMATCH', `manifest of ${where}: the registry stored it as ${stored}, not ${digest}`);
  }
  return digest;
}
