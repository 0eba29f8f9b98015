// Issue 14: through a real HTTPS server, a TypeScript policy reads the request's object and
// oldObject passed apart (each parsed when first read) exactly as the body had them: the same
// JSON text, key order included, for every shape of review the apiserver sends.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { request } from 'undici';
import { root } from '../helpers/policies.ts';
import { startServer, type TestServer } from '../helpers/server.ts';
import { digest } from '../helpers/digest.ts';
import { DEFER_FROM_BYTES } from '../../host/src/evaluate/evaluate.ts';

const echo = `${root}test/fixtures/policies/echo-request/echo-request.wasm`;
let t: TestServer;
beforeAll(async () => {
  t = await startServer(`
server: { tls: { mode: self-signed, hostnames: [127.0.0.1] } }
policies:
  - { name: echo, module: ${echo} }
  - { name: echo-old-first, module: ${echo}, settings: { read: old-first } }
  - { name: echo-nothing, module: ${echo}, settings: { read: nothing } }
`);
});
afterAll(() => t.close());

// Its metadata and spec, and their annotations and containers, are large enough to be passed
// apart (DEFER_FROM_BYTES); `tiny` is not.
const big = (letter: string) => letter.repeat(DEFER_FROM_BYTES);
const pod = (name: string, extra: Record<string, unknown> = {}) => ({
  apiVersion: 'v1', kind: 'Pod', metadata: { name, namespace: 'default', labels: { app: 'wéb', 'a/b': 'x"y', 'c~d': '1' }, annotations: { note: big('n') } },
  spec: { containers: [{ name: 'c', image: 'nginx', args: ['\u2028', '\\', 'ü€𝄞', big('a')] }] }, ...extra,
});
const tiny = { apiVersion: 'v1', kind: 'Pod', metadata: { name: 't' }, spec: {} };
const common = { kind: { group: '', version: 'v1', kind: 'Pod' }, resource: { group: '', version: 'v1', resource: 'pods' }, namespace: 'default', userInfo: { username: 'u' } };

const review = (request: Record<string, unknown>) => JSON.stringify({ apiVersion: 'admission.k8s.io/v1', kind: 'AdmissionReview', request: { ...common, ...request } });
// name, body, how the object and the oldObject reach the guest
const bodies: [string, string, string][] = [
  ['CREATE', review({ uid: 'a1', operation: 'CREATE', object: pod('a'), oldObject: null, dryRun: false }), 'object members+nested, oldObject no'],
  ['UPDATE', review({ uid: 'a2', operation: 'UPDATE', object: pod('b', { status: { phase: 'Running', conditions: [{ type: 'Ready', message: big('m') }] } }), oldObject: pod('b') }), 'object members+nested, oldObject members+nested'],
  ['DELETE (oldObject only)', review({ uid: 'a3', operation: 'DELETE', object: null, oldObject: pod('c') }), 'object no, oldObject members+nested'],
  ['UPDATE of small objects', review({ uid: 'a5', operation: 'UPDATE', object: tiny, oldObject: tiny }), 'object no, oldObject no'],
  ['UPDATE with oldObject first, pretty-printed', `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"a4","kind":{"group":"","version":"v1","kind":"Pod"},"resource":{"group":"","version":"v1","resource":"pods"},"operation":"UPDATE","userInfo":{"username":"u"},
    "oldObject" : ${JSON.stringify(pod('d', { n: [1e21, -0.5, 0] }), null, 2)} ,
    "object":${JSON.stringify(pod('d'))}}}`, 'object members+nested, oldObject members+nested'],
  // A member named twice: JSON.parse keeps the last; the host passes the object whole.
  ['UPDATE with spec named twice in the object', review({ uid: 'a6', operation: 'UPDATE', object: pod('e'), oldObject: pod('e') })
    .replace('"spec":{', `"spec":${JSON.stringify({ first: big('x') })},"spec":{`), 'object whole, oldObject members+nested'],
];

it.each(bodies)('a policy reads the %s review\'s objects as sent, in either order', async (_, body, apart) => {
  const res = await request(`${t.server.url}/validate`, { method: 'POST', body, headers: { 'content-type': 'application/json' }, dispatcher: t.agent });
  expect(res.statusCode).toBe(200);
  const review = (await res.body.json()) as { response: { allowed: boolean; warnings: string[] } };
  const sent = (JSON.parse(body) as { request: { operation: string; object?: unknown; oldObject?: unknown } }).request;
  expect(review.response).toMatchObject({ allowed: true });
  const taken = `apart: ${apart}`;
  expect(review.response.warnings).toEqual([
    `policy "echo": ${taken}`,
    `policy "echo": object ${digest(sent.object)}`,
    `policy "echo": oldObject ${digest(sent.oldObject)}`,
    `policy "echo": request ${digest(sent)}`,
    `policy "echo-old-first": ${taken}`,
    `policy "echo-old-first": oldObject ${digest(sent.oldObject)}`,
    `policy "echo-old-first": object ${digest(sent.object)}`,
    `policy "echo-old-first": request ${digest(sent)}`,
    `policy "echo-nothing": operation ${sent.operation}`,
  ]);
});

describe('with the default body limit', () => {
  let big: TestServer;
  beforeAll(async () => {
    big = await startServer(`
server: { tls: { mode: self-signed, hostnames: [127.0.0.1] } }
policies:
  - { name: echo-nothing, module: ${echo}, settings: { read: nothing } }
`);
  });
  afterAll(() => big.close());

  it('answers an UPDATE of a Secret at etcd\'s 1.5 MiB limit: the review carries it twice, in base64', async () => {
    // Red team: the old 3 MiB default answered 413, which the apiserver takes as the webhook failing.
    const data = Buffer.alloc(1.5 * 2 ** 20, 7).toString('base64');
    const secret = (v: string) => ({ apiVersion: 'v1', kind: 'Secret', metadata: { name: 's', namespace: 'default', resourceVersion: v }, data: { blob: data } });
    const body = JSON.stringify({
      apiVersion: 'admission.k8s.io/v1', kind: 'AdmissionReview',
      request: { uid: 'big', ...common, kind: { group: '', version: 'v1', kind: 'Secret' }, resource: { group: '', version: 'v1', resource: 'secrets' }, operation: 'UPDATE', object: secret('2'), oldObject: secret('1') },
    });
    expect(body.length).toBeGreaterThan(4 * 2 ** 20); // the old default was 3 MiB
    const res = await request(`${big.server.url}/validate`, { method: 'POST', body, headers: { 'content-type': 'application/json' }, dispatcher: big.agent });
    expect(res.statusCode).toBe(200);
    expect(await res.body.json()).toMatchObject({ response: { uid: 'big', allowed: true, warnings: ['policy "echo-nothing": operation UPDATE'] } });
  });
});
