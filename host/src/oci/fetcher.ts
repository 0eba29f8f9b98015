// fetchOciModule: what policy loading calls for an oci:// module. The registry is asked every
// time it can be (so a re-pushed tag is picked up); when it cannot be reached, the copy cached
// by the last successful pull is used and the log says so. A digest reference is immutable,
// so a cached copy of it is used without asking anyone.
import { errorMessage } from '../errors.ts';
import { BlobCache } from './cache.ts';
import { RegistryError } from './errors.ts';
import { openClient, resolveOptions, type OciOptions } from './options.ts';
import { cachedPolicy, pullPolicy, tagKey, type PulledPolicy } from './pull.ts';
import { formatReference, manifestReference, parseReference } from './reference.ts';

export type { OciOptions } from './options.ts';
export { abandonRegistryRequests } from './transport.ts';

export async function fetchOciModule(reference: string, options: OciOptions): Promise<Uint8Array> {
  return (await fetchOci(reference, options)).bytes;
}

export async function fetchOci(reference: string, options: OciOptions): Promise<PulledPolicy & { fromCache: boolean }> {
  const ref = parseReference(reference);
  const settings = await resolveOptions(options);
  const where = formatReference(ref);
  const fields = { registry: ref.registry, repository: ref.repository, reference: manifestReference(ref) };
  const cache = new BlobCache(settings.cacheDir);
  const fromCache = (digest: string) => cachedPolicy(cache, digest, where, settings.moduleLimit).catch(() => undefined);

  if (ref.digest) {
    const cached = await fromCache(ref.digest);
    if (cached) {
      settings.log('info', `using cached ${ref.digest} for ${where}`, { ...fields, digest: ref.digest });
      return { ...cached, fromCache: true };
    }
  }
  const client = await openClient(ref, settings, 'pull');
  try {
    const pulled = await pullPolicy(client, ref, cache, settings.moduleLimit, (error) => {
      settings.log('warn', `cannot write the OCI cache in ${settings.cacheDir}: ${errorMessage(error)}`, fields);
    });
    settings.log('info', `pulled ${where} (${pulled.manifestDigest})`, { ...fields, digest: pulled.manifestDigest });
    return { ...pulled, fromCache: false };
  } catch (error) {
    if (!(error instanceof RegistryError && error.transient)) throw error;
    const key = tagKey(ref);
    const digest = ref.digest ?? (key ? await cache.getTag(key) : undefined);
    const cached = digest ? await fromCache(digest) : undefined;
    if (!cached || !digest) throw new RegistryError(error.code, `${error.message}; nothing is cached for ${where} to start from`, { cause: error });
    settings.log('warn', `registry ${ref.registry} unreachable; using cached ${digest} for ${where}`, { ...fields, digest, error: error.message });
    return { ...cached, fromCache: true };
  } finally {
    await client.close();
  }
}
