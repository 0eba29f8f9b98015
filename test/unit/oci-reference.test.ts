import { describe, expect, it } from 'vitest';
import { formatReference, parseReference, pinnedReference } from '../../host/src/oci/reference.ts';

const hex = 'a'.repeat(64);

describe('oci:// references', () => {
  it.each([
    ['oci://ghcr.io/acme/policies/no-delete:v1.2', { registry: 'ghcr.io', repository: 'acme/policies/no-delete', tag: 'v1.2', digest: undefined }],
    ['oci://localhost:5000/no-delete', { registry: 'localhost:5000', repository: 'no-delete', tag: 'latest', digest: undefined }],
    [`oci://127.0.0.1:5000/a/b@sha256:${hex}`, { registry: '127.0.0.1:5000', repository: 'a/b', tag: undefined, digest: `sha256:${hex}` }],
    [`oci://Registry.Example.com/a_b/c-d:T_1@sha256:${hex}`, { registry: 'registry.example.com', repository: 'a_b/c-d', tag: 'T_1', digest: `sha256:${hex}` }],
    ['oci://[::1]:5000/x:y', { registry: '[::1]:5000', repository: 'x', tag: 'y', digest: undefined }],
  ])('parses %s', (text, expected) => {
    expect(parseReference(text)).toEqual(expected);
  });

  it.each([
    ['ghcr.io/acme/x:v1', 'it needs oci://'],
    ['oci://ghcr.io', 'it needs oci://'],
    ['oci://ghcr.io/Acme/x', '"Acme/x" is not a repository name'],
    ['oci://ghcr.io/acme/x:-bad', '"-bad" is not a tag'],
    ['oci://ghcr.io/acme/x@sha512:abc', 'only sha256 digests are supported'],
    ['oci://ghcr.io/acme/x@sha256:ABC', 'is not sha256: followed by 64 lowercase hex digits'],
    ['oci://bad_host/acme/x', '"bad_host" is not a host[:port]'],
  ])('refuses %s', (text, why) => {
    expect(() => parseReference(text)).toThrow(why);
    expect(() => parseReference(text)).toThrow('(expected oci://REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST])');
  });

  it('formats references back, and pins them to a digest', () => {
    expect(formatReference(parseReference('oci://localhost:5000/a/b'))).toBe('oci://localhost:5000/a/b:latest');
    expect(pinnedReference(parseReference('oci://localhost:5000/a/b:v1'), `sha256:${hex}`)).toBe(`oci://localhost:5000/a/b@sha256:${hex}`);
  });
});
