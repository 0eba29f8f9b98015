import { describe, expect, it } from 'vitest';
import { ReviewError } from '../../host/src/errors.ts';
import { parseReviewText } from '../../host/src/review/parse.ts';
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
    [withRequest({ uid: '' }), 'request.uid is missing or not a non-empty string'],
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

it('responds in the version asked, with a base64 JSONPatch', () => {
  const review = respond('admission.k8s.io/v1beta1', 'u-1', { allowed: true, warnings: ['w'], patch: [{ op: 'add', path: '/a', value: 1 }] });
  expect(review).toEqual({
    apiVersion: 'admission.k8s.io/v1beta1', kind: 'AdmissionReview',
    response: { uid: 'u-1', allowed: true, warnings: ['w'], patch: Buffer.from('[{"op":"add","path":"/a","value":1}]').toString('base64'), patchType: 'JSONPatch' },
  });
  expect(respond('admission.k8s.io/v1', 'u-2', { allowed: false, status: { code: 403, message: 'no' }, warnings: [], patch: [] }).response).toEqual({ uid: 'u-2', allowed: false, status: { code: 403, message: 'no' } });
});
