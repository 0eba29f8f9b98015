// A short fingerprint of a value, small enough for a warning: the length of its JSON text and
// an FNV-1a hash of it. Shared by the echo-request fixture policy (in the guest) and the tests
// that compute the same from the bodies they send.
export function fnv1a(text: string): string {
  let hash = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    hash ^= text.charCodeAt(i);
    hash = Math.imul(hash, 0x01000193) >>> 0;
  }
  return hash.toString(16).padStart(8, '0');
}

export function digest(value: unknown): string {
  const text = JSON.stringify(value) ?? 'undefined';
  return `${text.length}:${fnv1a(text)}`;
}
