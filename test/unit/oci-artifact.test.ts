import { describe, expect, it } from 'vitest';
import { MAX_MANIFEST_DEPTH, parseManifest, policyManifest, wasmLayer, type Descriptor } from '../../host/src/oci/artifact.ts';

const d = (n: number, mediaType: string, title?: string): Descriptor => ({
  mediaType, digest: `sha256:${String(n).repeat(64).slice(0, 64)}`, size: n, ...(title ? { annotations: { 'org.opencontainers.image.title': title } } : {}),
});
const manifest = (layers: Descriptor[], extra: Record<string, unknown> = {}) =>
  new TextEncoder().encode(JSON.stringify({ schemaVersion: 2, mediaType: 'application/vnd.oci.image.manifest.v1+json', config: d(2, 'application/vnd.oci.empty.v1+json'), layers, ...extra }));
const pick = (layers: Descriptor[]) => wasmLayer(parseManifest(manifest(layers), undefined, 'REF'), 'REF');

describe('finding the Wasm layer', () => {
  it('prefers a Wasm media type over titles', () => {
    expect(pick([d(1, 'text/plain', 'x.wasm'), d(3, 'application/vnd.wasm.content.layer.v1+wasm')])).toEqual(d(3, 'application/vnd.wasm.content.layer.v1+wasm'));
    expect(pick([d(1, 'text/plain', 'README'), d(4, 'application/wasm')]).size).toBe(4);
  });

  it('then a title ending in .wasm, whatever the media type', () => {
    expect(pick([d(1, 'text/plain', 'README.md'), d(5, 'application/vnd.oci.image.layer.v1.tar', 'Policy.WASM')]).size).toBe(5);
  });

  it('then the only layer, unless it is a container image layer', () => {
    expect(pick([d(6, 'application/octet-stream')]).size).toBe(6);
    expect(() => pick([d(7, 'application/vnd.oci.image.layer.v1.tar+gzip')])).toThrow('REF holds no Wasm layer (its layers are sha256:777');
    expect(() => pick([d(7, 'application/vnd.docker.image.rootfs.diff.tar.gzip')])).toThrow(/NO_WASM_LAYER|holds no Wasm layer/);
  });

  it('refuses none and several', () => {
    expect(() => pick([])).toThrow('REF holds no Wasm layer (it has no layers)');
    expect(() => pick([d(1, 'application/wasm', 'a.wasm'), d(2, 'application/wasm', 'b.wasm')])).toThrow(
      'REF has 2 Wasm layers: a.wasm (application/wasm), b.wasm (application/wasm); a policy artifact must hold exactly one',
    );
  });
});

describe('manifest shapes', () => {
  it('reads Docker v2 manifests and the withdrawn OCI artifact manifest', () => {
    const docker = new TextEncoder().encode(JSON.stringify({ schemaVersion: 2, mediaType: 'application/vnd.docker.distribution.manifest.v2+json', config: d(2, 'application/vnd.docker.container.image.v1+json'), layers: [d(3, 'application/wasm')] }));
    expect(wasmLayer(parseManifest(docker, undefined, 'REF'), 'REF').size).toBe(3);
    const artifact = new TextEncoder().encode(JSON.stringify({ mediaType: 'application/vnd.oci.artifact.manifest.v1+json', artifactType: 'x/y', blobs: [d(4, 'text/plain', 'p.wasm')] }));
    expect(wasmLayer(parseManifest(artifact, undefined, 'REF'), 'REF').size).toBe(4);
  });

  it('refuses an index with a way out, and descriptors it cannot check', () => {
    const index = new TextEncoder().encode(JSON.stringify({ schemaVersion: 2, mediaType: 'application/vnd.oci.image.index.v1+json', manifests: [d(9, 'application/vnd.oci.image.manifest.v1+json')] }));
    expect(() => parseManifest(index, undefined, 'REF')).toThrow(`REF is an image index of 1 manifest(s), not a single policy artifact; reference one manifest by digest (for example @sha256:${'9'.repeat(64)})`);
    expect(() => parseManifest(manifest([{ ...d(1, 'application/wasm'), digest: `sha512:${'1'.repeat(128)}` }]), undefined, 'REF')).toThrow("REF: the manifest's layer 0 has digest sha512:");
    expect(() => parseManifest(manifest([{ ...d(1, 'application/wasm'), size: -1 }]), undefined, 'REF')).toThrow('layer 0 has no valid size');
    expect(() => parseManifest(new TextEncoder().encode('<html>'), 'text/html', 'REF')).toThrow('REF: the manifest is not a JSON object (an OCI manifest starts with "{")');
    expect(() => parseManifest(new TextEncoder().encode('{"schemaVersion": 2,'), undefined, 'REF')).toThrow('REF: the manifest is not JSON');
  });

  it('refuses, before parsing, an object that nests deeper or holds more than a manifest would (red team 12: 4 MiB of it, 368 MB a pull)', () => {
    const refused = `REF: the manifest nests deeper than ${MAX_MANIFEST_DEPTH} levels or holds more than a manifest would; it was not read`;
    const deep = `{"a":${'['.repeat(2_000_000)}${']'.repeat(2_000_000)}}`;
    expect(() => parseManifest(new TextEncoder().encode(deep), undefined, 'REF')).toThrow(refused);
    const wide = `{"a":[${Array(1_000_000).fill('{}').join(',')}]}`;
    expect(() => parseManifest(new TextEncoder().encode(wide), undefined, 'REF')).toThrow(refused);
    // A manifest of 500 layers, each with annotations, and its brackets in strings, is read.
    const layers = Array.from({ length: 500 }, (_, i) => ({ ...d(i % 10, 'application/wasm'), annotations: { 'org.opencontainers.image.title': `[[[{{{${i}.wasm` } }));
    expect(parseManifest(manifest(layers), undefined, 'REF').layers).toHaveLength(500);
  });

  it('writes one Kubewarden-typed layer with an oras title, and nothing time-dependent', () => {
    const bytes = policyManifest({ digest: d(1, '').digest, size: 10, title: 'p.wasm' }, { digest: d(2, '').digest, size: 2 });
    expect(JSON.parse(new TextDecoder().decode(bytes))).toEqual({
      schemaVersion: 2, mediaType: 'application/vnd.oci.image.manifest.v1+json',
      config: { mediaType: 'application/vnd.wasm.config.v1+json', digest: d(2, '').digest, size: 2 },
      layers: [{ mediaType: 'application/vnd.wasm.content.layer.v1+wasm', digest: d(1, '').digest, size: 10, annotations: { 'org.opencontainers.image.title': 'p.wasm' } }],
    });
  });
});
