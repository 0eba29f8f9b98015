// Bad input never crashes the server or hangs a socket: every case gets a clear 4xx JSON
// error, and afterwards a valid review is still answered correctly.
import { Readable } from 'node:stream';
import { connect as tlsConnect } from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { request } from 'undici';
import { admissionReview, policyYaml, startServer, type TestServer } from '../helpers/server.ts';

let t: TestServer;
beforeAll(async () => {
  t = await startServer(`
server: { tls: { mode: self-signed, hostnames: [127.0.0.1] }, maxBodyBytes: 65536, headersTimeoutMs: 500, requestTimeoutMs: 1000 }
policies:
${policyYaml('require-labels', 'settings: { labels: { team: unowned } }')}
`);
});
afterAll(() => t.close());

const valid = () => admissionReview({ kind: 'ConfigMap', metadata: { name: 'ok', labels: { team: 'a' } } });

async function raw(body: string | Buffer, headers: Record<string, string> = { 'content-type': 'application/json' }) {
  const res = await request(`${t.server.url}/validate`, { method: 'POST', body, headers, dispatcher: t.agent });
  const text = await res.body.text();
  return { status: res.statusCode, body: text ? JSON.parse(text) : undefined };
}

describe('clear 4xx errors', () => {
  it.each([
    ['a body that is not JSON', '{"apiVersion": "admiss', 400, /^the body is not JSON/],
    ['JSON that is not an AdmissionReview', '{"kind":"Pod","apiVersion":"v1"}', 400, /^expected kind "AdmissionReview", got "Pod"$/],
    ['a review without request.uid', JSON.stringify({ ...valid(), request: { ...valid().request, uid: undefined } }), 400, /^request\.uid is missing/],
    ['an empty body', '', 400, /^the body is not JSON/],
    // The object is parsed only when read; the body is still checked whole before any policy runs.
    ['a body broken only inside the object', JSON.stringify(valid()).replace('"name":"ok"', '"name":ok'), 400, /^the body is not JSON/],
    ['a raw tab inside a string of the object', JSON.stringify(valid()).replace('"name":"ok"', '"name":"o\tk"'), 400, /^the body is not JSON/],
  ])('%s', async (_, body, status, message) => {
    const res = await raw(body);
    expect(res.status).toBe(status);
    expect(res.body.error.code).toBe('BAD_ADMISSION_REVIEW');
    expect(res.body.error.message).toMatch(message);
  });

  it('a per-policy path that is not valid percent-encoding is 404, not a 500 (red team)', async () => {
    const res = await request(`${t.server.url}/validate/%E0%A4%A`, { method: 'POST', body: JSON.stringify(valid()), headers: { 'content-type': 'application/json' }, dispatcher: t.agent });
    expect(res.statusCode).toBe(404);
    expect(await res.body.json()).toEqual({ error: { code: 'NOT_FOUND', message: 'no such endpoint /validate/%E0%A4%A: its policy name is not valid percent-encoding' } });
  });

  it('an object nested deeper than JSON.stringify recurses is still evaluated, when the host must serialize it itself (red team)', async () => {
    // Without userInfo the host serializes the request itself instead of passing its bytes on.
    // 9,000 levels: within what the API server sends (MAX_BODY_DEPTH), past what JSON.stringify
    // recurses. It was a 400, which failurePolicy Fail made a denial of a valid object.
    const deep = '{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":"deep-1",' +
      '"kind":{"group":"","version":"v1","kind":"ConfigMap"},"resource":{"group":"","version":"v1","resource":"configmaps"},' +
      `"operation":"CREATE","object":{"kind":"ConfigMap","metadata":{"name":"d"},"data":${'['.repeat(9_000)}${']'.repeat(9_000)}}}}`;
    const res = await raw(deep);
    expect(res.status).toBe(200);
    expect(res.body.response).toMatchObject({ uid: 'deep-1', allowed: false, status: { message: expect.stringContaining('missing required label: team') as unknown } });
    const ok = await raw(JSON.stringify(valid()));
    expect(ok.body.response.allowed).toBe(true);
  });

  it('a wrong content type is 415', async () => {
    const res = await raw(JSON.stringify(valid()), { 'content-type': 'text/plain' });
    expect(res).toEqual({ status: 415, body: { error: { code: 'UNSUPPORTED_MEDIA_TYPE', message: 'expected Content-Type application/json, got "text/plain"' } } });
  });

  it('a body over the limit is 413, declared or streamed', async () => {
    const big = JSON.stringify({ ...valid(), padding: 'x'.repeat(70_000) });
    expect(await raw(big)).toEqual({ status: 413, body: { error: { code: 'BODY_TOO_LARGE', message: 'the body is larger than the 65536-byte limit' } } });
    const chunked = await request(`${t.server.url}/validate`, {
      method: 'POST', dispatcher: t.agent, headers: { 'content-type': 'application/json' },
      body: Readable.from((function* () { for (let i = 0; i < 20; i++) yield Buffer.alloc(8192, 32); })()),
    }).then(async (res) => ({ status: res.statusCode, text: await res.body.text() }), (error: Error) => ({ status: 0, text: error.message }));
    // Either the 413 arrives, or the server closed the connection on the rest of the body.
    expect([413, 0]).toContain(chunked.status);
  });
});

describe('slow clients are cut off', () => {
  function slowClient(send: (socket: ReturnType<typeof tlsConnect>) => void): Promise<{ closedAfterMs: number; response: string }> {
    return new Promise((resolve, reject) => {
      const { port } = t.server.address;
      const started = Date.now();
      let response = '';
      const socket = tlsConnect({ host: '127.0.0.1', port, ca: t.server.tls!.caBundle }, () => send(socket));
      socket.on('data', (d) => (response += d));
      socket.on('close', () => resolve({ closedAfterMs: Date.now() - started, response }));
      socket.on('error', reject);
      setTimeout(() => reject(new Error('socket still open after 10 s')), 10_000).unref();
    });
  }

  it('headers that never finish', async () => {
    const { closedAfterMs, response } = await slowClient((s) => s.write('POST /validate HTTP/1.1\r\nHost: x\r\n'));
    expect(closedAfterMs).toBeLessThan(5000);
    expect(response).toMatch(/^HTTP\/1\.1 408/);
  });

  it('a body that never finishes', async () => {
    const { closedAfterMs, response } = await slowClient((s) => s.write('POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"apiVersion"'));
    expect(closedAfterMs).toBeLessThan(5000);
    expect(response).toMatch(/^HTTP\/1\.1 408/);
  });
});

it('survives thousands of malformed and truncated bodies, then answers a valid review', async () => {
  const good = JSON.stringify(valid());
  let seed = 12345;
  const random = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
  const bodies: string[] = [];
  for (let i = 0; i < 3000; i++) {
    const kind = i % 5;
    if (kind === 0) bodies.push(good.slice(0, Math.floor(random() * good.length))); // truncated
    else if (kind === 1) bodies.push(Array.from(good, (c) => (random() < 0.02 ? String.fromCharCode(Math.floor(random() * 128)) : c)).join('')); // flipped characters
    else if (kind === 2) bodies.push(JSON.stringify({ ...valid(), request: { ...valid().request, [['kind', 'resource', 'operation', 'object', 'userInfo', 'uid'][i % 6]!]: [null, 42, 'x', [], {}][i % 5] } }));
    else if (kind === 3) bodies.push(Buffer.from(Array.from({ length: Math.floor(random() * 200) }, () => Math.floor(random() * 256))).toString('latin1'));
    else bodies.push(JSON.stringify([null, 1, 'AdmissionReview', { apiVersion: 'admission.k8s.io/v1', kind: 'AdmissionReview', request: 'x' }][i % 4]));
  }
  const statuses = new Map<number, number>();
  for (let i = 0; i < bodies.length; i += 50) {
    const batch = await Promise.all(bodies.slice(i, i + 50).map((b) => raw(b).then((r) => r.status, () => -1)));
    for (const s of batch) statuses.set(s, (statuses.get(s) ?? 0) + 1);
  }
  // Every response is a 400 or (when the mangled body still formed a valid review) a 200.
  expect([...statuses.keys()].every((s) => s === 400 || s === 200)).toBe(true);
  expect(statuses.get(400)).toBeGreaterThan(2500);
  const res = await raw(good);
  expect(res).toEqual({ status: 200, body: { apiVersion: 'admission.k8s.io/v1', kind: 'AdmissionReview', response: { uid: expect.any(String), allowed: true } } });
});

describe('a body written so that another parser could read it differently', () => {
  let protect: TestServer;
  beforeAll(async () => {
    protect = await startServer(`
server: { tls: { mode: self-signed, hostnames: [127.0.0.1] } }
policies:
${policyYaml('no-delete')}
`);
  });
  afterAll(() => protect.close());

  // The AssemblyScript SDK's JSON parser keeps escapes in keys as written; the host's JSON.parse
  // decodes them. Guests must see the request the host selected policies by (red-team finding):
  // a body with an escaped key is serialized again for them; one with a key given twice is
  // passed on as it came, and its guests must read it as JSON.parse does.
  it.each([
    ['an escape in the operation key', (text: string) => text.replace('"operation"', '"oper\\u0061tion"')],
    ['an escape in the label key', (text: string) => text.replace('"portcullis.dev/no-delete"', '"portcullis.dev\\/no-delete"')],
    ['an escape in the metadata key', (text: string) => text.replace('"metadata"', '"met\\u0061data"')],
    // A key given twice: JSON.parse keeps the last, and so must the guest's parser (json-as here).
    ['a second operation', (text: string) => text.replace('"operation":"DELETE"', '"operation":"CREATE","operation":"DELETE"')],
    ['a second label value', (text: string) => text.replace('"portcullis.dev/no-delete":"true"', '"portcullis.dev/no-delete":"false","portcullis.dev/no-delete":"true"')],
    ['a second labels map', (text: string) => text.replace('"labels":{', '"labels":{},"labels":{')],
    ['a second metadata', (text: string) => text.replace('"metadata":{', '"metadata":{},"metadata":{')],
    ['a second oldObject', (text: string) => text.replace('"oldObject":{', '"oldObject":{},"oldObject":{')],
  ])('%s does not get a protected object deleted', async (_, rewrite) => {
    const review = admissionReview(null, { operation: 'DELETE', oldObject: { kind: 'ConfigMap', metadata: { name: 'keep', labels: { 'portcullis.dev/no-delete': 'true' } } } });
    const plain = JSON.stringify(review);
    const escaped = rewrite(plain);
    expect(escaped).not.toBe(plain);
    expect(JSON.parse(escaped)).toEqual(JSON.parse(plain));
    for (const body of [plain, escaped]) {
      const { status, body: answer } = await protect.post('/validate', body);
      expect(status).toBe(200);
      expect(answer.response).toMatchObject({ uid: review.request.uid, allowed: false });
    }
  });
});
