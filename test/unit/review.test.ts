import { describe, expect, it } from 'vitest';
import { ReviewError } from '../../host/src/errors.ts';
import { MAX_BODY_DEPTH, nestedDeeperThan, parsedCostOf, parseReviewText } from '../../host/src/review/parse.ts';
import { respond } from '../../host/src/review/respond.ts';

const good = {
  apiVersion: 'admission.k8s.io/v1', kind: 'AdmissionReview',
  request: { uid: 'u-1', kind: { group: '', version: 'v1', kind: 'Pod' }, resource: { group: '', version: 'v1', resource: 'pods' }, operation: 'CREATE', userInfo: {}, object: {} },
};
const withRequest = (patch: Record<string, unknown>) => JSON.stringify({ ...good, request: { ...good.request, ...patch } });

describe('parsing an AdmissionReview', () => {
  it('accepts v1 and v1beta1', () => {
    expect(parseReviewText(JSON.stringify(good)).apiVersion).toBe('admission.k8s.io/v1');
    expect(parseReviewText(JSON.stringify({ ...good, apiVersion: 'admission.k8s.io/v1beta1' })).apiVersion).toBe('admission.k8s.io/v1beta1');
  });

  it.each([
    ['{"apiVersion":', /^the body is not JSON/],
    ['[1,2]', 'the body is not a JSON object, so not an AdmissionReview'],
    [JSON.stringify({ ...good, kind: 'Pod' }), 'expected kind "AdmissionReview", got "Pod"'],
    [JSON.stringify({ ...good, apiVersion: 'admission.k8s.io/v2' }), 'unsupported apiVersion "admission.k8s.io/v2"; expected admission.k8s.io/v1 or admission.k8s.io/v1beta1'],
    [JSON.stringify({ ...good, request: undefined }), 'the AdmissionReview has no "request" object'],
    [JSON.stringify({ ...good, apiVersion: undefined }), 'the AdmissionReview has no apiVersion; expected admission.k8s.io/v1 or admission.k8s.io/v1beta1'],
    [withRequest({ uid: '' }), 'request.uid is missing or not a non-empty string'],
    // Echoed in every error, answer and log line about the request (red team: 4 MiB of it).
    [withRequest({ uid: 'u'.repeat(257) }), 'request.uid is 257 characters long; the API server\'s are 36 and this host takes at most 256'],
    [withRequest({ operation: 'PATCH' }), 'request u-1: request.operation must be CREATE, UPDATE, DELETE or CONNECT'],
    [withRequest({ kind: 'Pod' }), 'request u-1: request.kind must be {group, version, kind} strings'],
    [withRequest({ object: 'x' }), 'request u-1: request.object must be an object or null'],
  ])('refuses %s', (body, message) => {
    let error: unknown;
    try {
      parseReviewText(body);
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(ReviewError);
    if (typeof message === 'string') expect((error as Error).message).toBe(message);
    else expect((error as Error).message).toMatch(message);
  });
});

describe('a body nested deeper than the API server sends', () => {
  // The review and its request are two levels; `levels` more are the object's. Padded past the
  // 64 KiB below which the nesting is not looked at (too small to cost much).
  const body = (levels: number, open: string) => {
    const object = open === '[' ? `{"a":${'['.repeat(levels - 1)}${']'.repeat(levels - 1)}}` : `${'{"a":'.repeat(levels)}1${'}'.repeat(levels)}`;
    const text = withRequest({ object: '@', annotations: { pad: 'x'.repeat(80_000) } }).replace('"@"', object);
    expect(text.length).toBeGreaterThan(64 * 1024);
    return text;
  };

  it.each(['{', '['])('is refused before it is parsed (%s)', (open) => {
    // Red team: 1.4 million levels in 2.8 MB took 260 ms of the main thread and 150 MB to parse.
    expect(() => parseReviewText(body(MAX_BODY_DEPTH - 1, open))).toThrow(
      new ReviewError(`the body nests objects or arrays more than ${MAX_BODY_DEPTH} levels deep; the API server sends nothing that deep`));
    expect(() => parseReviewText(body(1_400_000, open))).toThrow(ReviewError);
  });

  it('is parsed up to the limit, and brackets inside strings do not count', () => {
    expect(parseReviewText(body(MAX_BODY_DEPTH - 2, '{')).request.uid).toBe('u-1');
    const quoted = withRequest({ object: { text: `\\"${'['.repeat(20_000)}` }, annotations: { pad: 'x'.repeat(80_000) } });
    expect(parseReviewText(quoted).request.uid).toBe('u-1');
    // As bytes (what the server passes), with non-ASCII text: the same answers.
    expect(parseReviewText(Buffer.from(quoted.replace('"pad":"x', '"pad":"ü€😀'))).request.uid).toBe('u-1');
    expect(() => parseReviewText(Buffer.from(body(MAX_BODY_DEPTH - 1, '[')))).toThrow(ReviewError);
  });

  it('costs the same on the hundredth large body as on the first (a denial of service, not a speed target)', () => {
    // Red team: over a string the guard fell, at random after a few dozen 1-3 MB bodies, into
    // ~6 µs a character for the rest of the process (15-20 s a review; 3 of 3 runs of these
    // bodies here). Over bytes each call took ~4 ms. The bound is 500 times that.
    const object = (fill: Record<string, unknown>) => Buffer.from(withRequest({ object: fill }));
    const bodies = [
      object({ metadata: { annotations: Object.fromEntries(Array.from({ length: 60_000 }, (_, i) => [`k${i}`, 'v'.repeat(30)])) } }),
      object({ spec: { x: Array.from({ length: 700_000 }, () => 1) } }),
      object({ spec: { containers: Array.from({ length: 12_000 }, (_, i) => ({ name: `c${i}`, image: 'nginx', resources: { limits: { cpu: '1' } } })) } }),
    ];
    let slowest = 0;
    for (let round = 0; round < 12; round++) {
      for (const bytes of bodies) {
        const started = performance.now();
        nestedDeeperThan(bytes, MAX_BODY_DEPTH);
        slowest = Math.max(slowest, performance.now() - started);
      }
    }
    expect(slowest).toBeLessThan(2000);
  });
});

it('responds in the version asked, with a base64 JSONPatch', () => {
  const review = respond('admission.k8s.io/v1beta1', 'u-1', { allowed: true, warnings: ['w'], patch: [{ op: 'add', path: '/a', value: 1 }] });
  expect(review).toEqual({
    apiVersion: 'admission.k8s.io/v1beta1', kind: 'AdmissionReview',
    response: { uid: 'u-1', allowed: true, warnings: ['w'], patch: Buffer.from('[{"op":"add","path":"/a","value":1}]').toString('base64'), patchType: 'JSONPatch' },
  });
  expect(respond('admission.k8s.io/v1', 'u-2', { allowed: false, status: { code: 403, message: 'no' }, warnings: [], patch: [] }).response).toEqual({ uid: 'u-2', allowed: false, status: { code: 403, message: 'no' } });
});

it('estimates what parsing costs beyond the bytes: containers and elements outside strings', () => {
  expect(parsedCostOf(Buffer.from('[{},{},[]]'))).toBe(4 * 96 + 2 * 16);
  // Brackets and commas inside strings, escaped quotes included, are text.
  expect(parsedCostOf(Buffer.from('{"a":"[{,}]\\"[,"}'))).toBe(96);
});
