// What a policy artifact looks like in a registry: the manifest shapes we read (oras,
// Kubewarden, CNCF Wasm, Docker v2), how the one Wasm layer is found in them, and the shape
// `portcullis push` writes.
import { foreignText } from '../util/text.ts';
import { nestedDeeperThan, parsedCostOf } from '../util/json-bytes.ts';
import { RegistryError } from './errors.ts';
import { DIGEST } from './reference.ts';

export const OCI_MANIFEST = 'application/vnd.oci.image.manifest.v1+json';
export const OCI_INDEX = 'application/vnd.oci.image.index.v1+json';
/** Withdrawn from the spec, but early oras releases wrote it; its `blobs` are layers to us. */
export const OCI_ARTIFACT_MANIFEST = 'application/vnd.oci.artifact.manifest.v1+json';
export const DOCKER_MANIFEST = 'application/vnd.docker.distribution.manifest.v2+json';
export const DOCKER_LIST = 'application/vnd.docker.distribution.manifest.list.v2+json';
export const MANIFEST_TYPES = [OCI_MANIFEST, OCI_INDEX, OCI_ARTIFACT_MANIFEST, DOCKER_MANIFEST, DOCKER_LIST] as const;

export const EMPTY_CONFIG = { mediaType: 'application/vnd.oci.empty.v1+json', bytes: new TextEncoder().encode('{}') };
export const WASM_CONFIG = 'application/vnd.wasm.config.v1+json';
export const WASM_LAYER = 'application/vnd.wasm.content.layer.v1+wasm';
export const TITLE = 'org.opencontainers.image.title';

/** Layer media types that mean "this is the Wasm": Kubewarden/wasm-to-oci, CNCF TAG Runtime, old wasm-to-oci. */
const WASM_LAYER_TYPES = new Set([WASM_LAYER, 'application/wasm', 'application/vnd.module.wasm.content.layer.v1+wasm']);
/**
 * Compressed tarballs: a container image's layers, never a policy. (Plain ...layer.v1.tar is
 * what `oras push` labels any file with, so it stays a candidate; the \0asm check follows.)
 */
const IMAGE_LAYER = /^application\/vnd\.(oci\.image\.layer\.(nondistributable\.)?v1\.tar\+|docker\.image\.rootfs\.)/;

export interface Descriptor {
  mediaType: string;
  digest: string;
  size: number;
  annotations?: Record<string, string>;
}

export interface ImageManifest {
  mediaType: string;
  artifactType: string | undefined;
  config: Descriptor | undefined;
  layers: Descriptor[];
}

/** Deepest a manifest may nest: the object, its layers, a descriptor, its annotations, with room to spare. */
export const MAX_MANIFEST_DEPTH = 16;
/** Most heap a manifest may parse into (parsedCostOf): ~85,000 containers, far past any artifact's. */
const MAX_MANIFEST_PARSED_BYTES = 8 * 2 ** 20;

/** Parses manifest bytes; an index (or anything not a single artifact) is refused with a way out. */
export function parseManifest(bytes: Uint8Array, contentType: string | undefined, where: string): ImageManifest {
  let json: Record<string, unknown>;
  const text = Buffer.from(bytes).toString('utf8');
  // An object or nothing: 4 MB of nested arrays, parsed, took 320 MiB and was then called "not
  // JSON" (red team). The first character says which without parsing.
  if (!/^[\s\uFEFF]*\{/.test(text.slice(0, 1024))) {
    throw new RegistryError('UNSUPPORTED_MANIFEST', `${where}: the manifest is not a JSON object (an OCI manifest starts with "{")`);
  }
  // Nor what parses to far more than a manifest: red team 12, 4 MiB of `{"a":[[[...` took a pull
  // to 368 MB and eight policies on one such registry a reload to 1 GB. An OCI manifest is an
  // object of descriptors: a few levels deep, and a few KB even with hundreds of layers.
  if (nestedDeeperThan(bytes, MAX_MANIFEST_DEPTH) || parsedCostOf(bytes) > MAX_MANIFEST_PARSED_BYTES) {
    throw new RegistryError('UNSUPPORTED_MANIFEST', `${where}: the manifest nests deeper than ${MAX_MANIFEST_DEPTH} levels or holds more than a manifest would; it was not read`);
  }
  try {
    json = JSON.parse(text) as Record<string, unknown>;
  } catch {
    throw new RegistryError('UNSUPPORTED_MANIFEST', `${where}: the manifest is not JSON`);
  }
  // The body's own mediaType wins: registries are not always careful with Content-Type.
  const mediaType = typeof json.mediaType === 'string' ? json.mediaType : contentType ?? OCI_MANIFEST;
  if (mediaType === OCI_INDEX || mediaType === DOCKER_LIST || Array.isArray(json.manifests)) {
    const entries = Array.isArray(json.manifests) ? (json.manifests as Partial<Descriptor>[]) : [];
    const example = entries.find((entry) => typeof entry.digest === 'string' && DIGEST.test(entry.digest))?.digest;
    throw new RegistryError('UNSUPPORTED_MANIFEST', `${where} is an image index of ${entries.length} manifest(s), not a single policy artifact; `
      + `reference one manifest by digest${example ? ` (for example @${example})` : ''}`);
  }
  if (mediaType !== OCI_MANIFEST && mediaType !== DOCKER_MANIFEST && mediaType !== OCI_ARTIFACT_MANIFEST) {
    throw new RegistryError('UNSUPPORTED_MANIFEST', `${where}: manifest type ${foreignText(mediaType)} is not supported (expected ${OCI_MANIFEST})`);
  }
  const layers = mediaType === OCI_ARTIFACT_MANIFEST ? json.blobs ?? [] : json.layers;
  if (!Array.isArray(layers)) throw new RegistryError('UNSUPPORTED_MANIFEST', `${where}: the manifest has no layers list`);
  return {
    mediaType,
    artifactType: typeof json.artifactType === 'string' ? json.artifactType : undefined,
    config: json.config === undefined ? undefined : descriptor(json.config, where, 'config'),
    layers: layers.map((layer, i) => descriptor(layer, where, `layer ${i}`)),
  };
}

function descriptor(value: unknown, where: string, which: string): Descriptor {
  const d = value as Partial<Descriptor> | null;
  const bad = (why: string): never => {
    throw new RegistryError('UNSUPPORTED_MANIFEST', `${where}: the manifest's ${which} ${why}`);
  };
  if (!d || typeof d !== 'object') return bad('is not a descriptor');
  if (typeof d.mediaType !== 'string') bad('has no mediaType');
  if (typeof d.digest !== 'string') bad('has no digest');
  if (!DIGEST.test(d.digest!)) bad(`has digest ${foreignText(d.digest!)}: only sha256 digests are supported`);
  if (!Number.isSafeInteger(d.size) || d.size! < 0) bad('has no valid size');
  const annotations = d.annotations === undefined || d.annotations === null ? undefined : d.annotations as unknown;
  // The spec says string to string; the title is read as one (red team: a number in it gave
  // "toLowerCase is not a function").
  if (annotations !== undefined) {
    if (typeof annotations !== 'object' || Array.isArray(annotations)) bad('has annotations that are not an object of strings');
    for (const [key, value] of Object.entries(annotations as Record<string, unknown>)) {
      if (typeof value !== 'string') bad(`has annotation ${foreignText(key)} of type ${Array.isArray(value) ? 'array' : value === null ? 'null' : typeof value}, not a string`);
    }
  }
  return { mediaType: d.mediaType!, digest: d.digest!, size: d.size!, ...(annotations ? { annotations: annotations as Record<string, string> } : {}) };
}

/**
 * The layer holding the policy: the one with a Wasm media type, else the one whose title ends
 * in .wasm (oras with an arbitrary type), else the only layer (unless it is a container image
 * layer). Two candidates at the same step are refused: guessing could run the wrong module.
 */
export function wasmLayer(manifest: ImageManifest, where: string): Descriptor {
  const describe = (layer: Descriptor) => `${layerName(layer)} (${foreignText(layer.mediaType)})`;
  // The registry chooses how many layers there are: name a few (red team: 10,000 named at once).
  const list = (layers: Descriptor[]) => layers.slice(0, LISTED).map(describe).join(', ') + (layers.length > LISTED ? ` and ${layers.length - LISTED} more` : '');
  const steps = [
    manifest.layers.filter((layer) => WASM_LAYER_TYPES.has(layer.mediaType)),
    manifest.layers.filter((layer) => layer.annotations?.[TITLE]?.toLowerCase().endsWith('.wasm')),
    manifest.layers.length === 1 && !IMAGE_LAYER.test(manifest.layers[0]!.mediaType) ? manifest.layers : [],
  ];
  for (const found of steps) {
    if (found.length === 1) return found[0]!;
    if (found.length > 1) {
      throw new RegistryError('SEVERAL_WASM_LAYERS', `${where} has ${found.length} Wasm layers: ${list(found)}; a policy artifact must hold exactly one (push each policy separately)`);
    }
  }
  const seen = manifest.layers.length ? `its layers are ${list(manifest.layers)}` : 'it has no layers';
  throw new RegistryError('NO_WASM_LAYER', `${where} holds no Wasm layer (${seen}); push the policy with \`portcullis push\` or \`oras push REF policy.wasm\``);
}

const LISTED = 5;

/** A layer as messages name it: its title if it has one, else its digest (registry text, made safe to print). */
export function layerName(layer: Descriptor): string {
  return foreignText(layer.annotations?.[TITLE] ?? layer.digest);
}

/** Both core modules and components start with "\0asm". */
export function isWasm(bytes: Uint8Array): boolean {
  return bytes.length >= 8 && bytes[0] === 0 && bytes[1] === 0x61 && bytes[2] === 0x73 && bytes[3] === 0x6d;
}

/**
 * The manifest `portcullis push` writes. An OCI image manifest whose config has Kubewarden's
 * media type (application/vnd.wasm.config.v1+json, holding `{}`) and one layer of media type
 * application/vnd.wasm.content.layer.v1+wasm with an org.opencontainers.image.title:
 * - Kubewarden's fetcher (oci-client) only accepts manifests whose every layer has that
 *   media type, so the layer type is chosen for it; it does not look at the config's content.
 * - `oras pull` writes out every layer that has a title, whatever its media type.
 * - The config type already says what the artifact is, so no `artifactType` (the spec only
 *   requires one with the empty config), and no creation timestamp: the same .wasm pushed
 *   twice gives the same manifest digest.
 */
export function policyManifest(layer: { digest: string; size: number; title: string }, config: { digest: string; size: number }): Uint8Array {
  const manifest = {
    schemaVersion: 2,
    mediaType: OCI_MANIFEST,
    config: { mediaType: WASM_CONFIG, digest: config.digest, size: config.size },
    layers: [{ mediaType: WASM_LAYER, digest: layer.digest, size: layer.size, annotations: { [TITLE]: layer.title } }],
  };
  return new TextEncoder().encode(JSON.stringify(manifest));
}
