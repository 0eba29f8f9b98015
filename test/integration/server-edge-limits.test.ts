// What one caller can make the host hold is bounded by configuration, not by the caller (red
// team, network attacker): bodies held at once, connections (in all and per address), and TCP
// connections that never start their TLS handshake.
import { connect as netConnect, type Socket } from 'node:net';
import { connect as tlsConnect, type TLSSocket } from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { admissionReview, policyYaml, startServer, type TestServer } from '../helpers/server.ts';

let t: TestServer;
beforeAll(async () => {
  t = await startServer(`
server:
  tls: { mode: self-signed, hostnames: [127.0.0.1] }
  maxBodyBytes: 600000
  maxBodyBytesInFlight: 1048576
  maxConnections: 12
  maxConnectionsPerAddress: 6
  headersTimeoutMs: 500
  requestTimeoutMs: 5000
policies:
${policyYaml('require-labels', 'settings: { labels: { team: unowned } }')}
`);
});
afterAll(() => t.close());

const port = () => Number(new URL(t.server.url).port);
const open: Socket[] = [];
/** Closes every test connection, and waits for the server to have counted them closed. */
const closeAll = async () => {
  for (const s of open.splice(0)) s.destroy();
  await new Promise((r) => setTimeout(r, 300));
};

/** A TLS connection that completed its handshake, or the error that ended it. */
function tlsOpen(): Promise<TLSSocket | Error> {
  return new Promise((resolve) => {
    const socket = tlsConnect({ host: '127.0.0.1', port: port(), ca: t.server.tls!.caBundle, servername: '127.0.0.1' });
    open.push(socket);
    socket.once('secureConnect', () => resolve(socket));
    socket.once('error', (error) => resolve(error));
    socket.once('close', () => resolve(new Error('closed before the handshake')));
  });
}

/** Sends raw HTTP on a new TLS connection and resolves with what came back before it closed (or after `waitMs`). */
async function exchange(head: string, body: string, waitMs = 3000): Promise<string> {
  const socket = await tlsOpen();
  if (socket instanceof Error) throw socket;
  return new Promise((resolve) => {
    let got = '';
    socket.on('data', (d: Buffer) => (got += d.toString()));
    const done = () => resolve(got);
    socket.once('close', done);
    setTimeout(done, waitMs);
    socket.write(head + body);
  });
}

const post = (length: number) => `POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${length}\r\n\r\n`;

describe('request bodies held at once', () => {
  it('past maxBodyBytesInFlight a request is refused with 503 as its bytes arrive; the budget comes back', async () => {
    // Two bodies, each held short of its end: 579,000 + 500,000 bytes > 1 MiB.
    const first = await tlsOpen();
    if (first instanceof Error) throw first;
    first.write(post(580_000) + 'x'.repeat(579_000));
    await new Promise((r) => setTimeout(r, 300));
    const refused = await exchange(post(580_000), 'y'.repeat(500_000));
    expect(refused).toMatch(/^HTTP\/1\.1 503 /);
    expect(refused).toContain('"code":"SERVER_BUSY"');
    expect(refused.toLowerCase()).toContain('connection: close');
    // The held body goes with its connection; a review is answered again.
    first.destroy();
    await new Promise((r) => setTimeout(r, 200));
    const review = JSON.stringify(admissionReview({ kind: 'ConfigMap', metadata: { name: 'ok', labels: { team: 'a' } } }));
    const answered = await exchange(post(Buffer.byteLength(review)), review, 1000);
    expect(answered).toMatch(/^HTTP\/1\.1 200 /);
    expect(answered).toContain('"allowed":true');
    await closeAll();
  });

  it('declared lengths nobody sends reserve nothing: they cannot lock other callers out', async () => {
    // Red team re-test: 85 chunked requests that never sent a byte had reserved the whole budget.
    for (let i = 0; i < 4; i++) {
      const idle = await tlsOpen();
      if (idle instanceof Error) throw idle;
      idle.write(post(590_000));
    }
    await new Promise((r) => setTimeout(r, 200));
    const review = JSON.stringify(admissionReview({ kind: 'ConfigMap', metadata: { name: 'ok', labels: { team: 'a' } } }));
    expect(await exchange(post(Buffer.byteLength(review)), review, 1000)).toMatch(/^HTTP\/1\.1 200 /);
    await closeAll();
  });

  it('what parsing will cost counts too: a body of tiny containers is refused, an ordinary large review is not', async () => {
    // Red team re-test: 85 bodies of a million empty objects, within the byte budget, took 2.5 GB to parse.
    const empties = JSON.stringify(admissionReview({ kind: 'ConfigMap', metadata: { name: 'e' }, data: {} })).replace('"data":{}', `"data":{"x":[${Array(150_000).fill('{}').join(',')}]}`);
    expect(Buffer.byteLength(empties)).toBeLessThan(600_000);
    const refused = await exchange(post(Buffer.byteLength(empties)), empties, 2000);
    expect(refused).toMatch(/^HTTP\/1\.1 503 /);
    expect(refused).toContain('SERVER_BUSY');
    const large = JSON.stringify(admissionReview({ kind: 'ConfigMap', metadata: { name: 'l', labels: { team: 'a' } }, data: { blob: 'z'.repeat(500_000) } }));
    expect(await exchange(post(Buffer.byteLength(large)), large, 2000)).toMatch(/^HTTP\/1\.1 200 /);
    await closeAll();
  });
});

describe('bodies in tiny pieces', () => {
  it('a body in more pieces than one per 512 bytes of the limit is refused (413), as it arrives', async () => {
    // Red team: 1.5 MB sent as 1-byte chunks was 1.5 million Buffers kept, 700 MB for one connection.
    const head = 'POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n';
    const answer = await exchange(head, '1\r\n \r\n'.repeat(5000));
    expect(answer).toMatch(/^HTTP\/1\.1 413 /);
    expect(answer).toContain('the body came in too many small pieces');
    // A review of the same size in ordinary chunks is answered.
    const review = JSON.stringify(admissionReview({ kind: 'ConfigMap', metadata: { name: 'ok', labels: { team: 'a' } } }));
    const chunked = `${Buffer.byteLength(review).toString(16)}\r\n${review}\r\n0\r\n\r\n`;
    const ok = await exchange(head, chunked, 1000);
    expect(ok).toMatch(/^HTTP\/1\.1 200 /);
    await closeAll();
  });
});

describe('connections', () => {
  it('one address may hold maxConnectionsPerAddress; the next is closed at once, and a slot frees when one closes', async () => {
    const held = await Promise.all(Array.from({ length: 6 }, () => tlsOpen()));
    expect(held.every((s) => !(s instanceof Error))).toBe(true);
    expect(await tlsOpen()).toBeInstanceOf(Error);
    (held[0] as TLSSocket).destroy();
    await new Promise((r) => setTimeout(r, 200));
    expect(await tlsOpen()).not.toBeInstanceOf(Error);
    await closeAll();
  });

  it('a TCP connection that never starts its TLS handshake is closed after headersTimeoutMs', async () => {
    const started = performance.now();
    const closedAfter = await new Promise<number>((resolve) => {
      const socket = netConnect(port(), '127.0.0.1');
      open.push(socket);
      socket.on('error', () => {});
      socket.once('close', () => resolve(performance.now() - started));
    });
    // Node's default kept it 120 s.
    expect(closedAfter).toBeGreaterThanOrEqual(400);
    expect(closedAfter).toBeLessThan(5000);
    await closeAll();
  });
});
