// oci://HOST[:PORT]/REPO[:TAG][@sha256:HEX] — the registry is always written out (no implicit
// Docker Hub), the tag defaults to "latest", and a digest, when given, is what is fetched
// (the tag is then only a label for people).
import { RegistryError } from './errors.ts';

export interface OciReference {
  /** host[:port] as the user wrote it (lowercased): also the key for credentials and "insecure". */
  registry: string;
  repository: string;
  tag: string | undefined;
  digest: string | undefined;
}

// The grammar of github.com/distribution/reference, so a typo fails here, not as a registry 404.
const COMPONENT = '[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*';
const REPOSITORY = new RegExp(`^${COMPONENT}(?:/${COMPONENT})*$`);
const TAG = /^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$/;
const HOST = /^(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*|\[[0-9a-f:.]+\])(?::\d{1,5})?$/;
export const DIGEST = /^sha256:[a-f0-9]{64}$/;

export function parseReference(text: string): OciReference {
  const bad = (why: string): never => {
    throw new RegistryError('BAD_REFERENCE', `"${text}" is not a usable OCI reference: ${why} (expected oci://REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST])`);
  };
  const match = /^oci:\/\/([^/]+)\/(.+)$/i.exec(text.trim());
  if (!match) return bad('it needs oci://, a registry host and a repository');
  const registry = match[1]!.toLowerCase();
  if (!HOST.test(registry)) bad(`"${registry}" is not a host[:port]`);
  let rest = match[2]!;
  let digest: string | undefined;
  const at = rest.indexOf('@');
  if (at >= 0) {
    digest = rest.slice(at + 1);
    rest = rest.slice(0, at);
    if (!digest.startsWith('sha256:')) bad(`only sha256 digests are supported, not "${digest}"`);
    if (!DIGEST.test(digest)) bad(`"${digest}" is not sha256: followed by 64 lowercase hex digits`);
  }
  // Repository components cannot hold ':', so the last one separates the tag.
  const colon = rest.lastIndexOf(':');
  const repository = colon >= 0 ? rest.slice(0, colon) : rest;
  const tag = colon >= 0 ? rest.slice(colon + 1) : undefined;
  if (!REPOSITORY.test(repository)) bad(`"${repository}" is not a repository name (lowercase letters, digits, . _ - separated by /)`);
  if (tag !== undefined && !TAG.test(tag)) bad(`"${tag}" is not a tag (up to 128 of A-Z a-z 0-9 _ . -, not starting with . or -)`);
  return { registry, repository, tag: tag ?? (digest ? undefined : 'latest'), digest };
}

/** What goes after /manifests/ in the API: the digest if pinned, else the tag. */
export function manifestReference(ref: OciReference): string {
  return ref.digest ?? ref.tag ?? 'latest';
}

export function formatReference(ref: OciReference): string {
  return `oci://${ref.registry}/${ref.repository}${ref.tag ? `:${ref.tag}` : ''}${ref.digest ? `@${ref.digest}` : ''}`;
}

/** The same artifact pinned to the digest we actually got, for logs and for `push`'s output. */
export function pinnedReference(ref: OciReference, digest: string): string {
  return `oci://${ref.registry}/${ref.repository}@${digest}`;
}

/** Docker Hub is the one registry whose API host differs from its name. */
export function apiHost(registry: string): string {
  return registry === 'docker.io' || registry === 'index.docker.io' ? 'registry-1.docker.io' : registry;
}
