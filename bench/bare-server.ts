// The smallest HTTPS JSON server the comparison servers share: the same TLS (self-signed
// P-256, as `portcullis serve --tls-self-signed`), keep-alive, body read, JSON out, /readyz.
// Prints {"port":N} on stdout once listening.
import type { IncomingMessage, ServerResponse } from 'node:http';
import { createServer } from 'node:https';
import type { AddressInfo } from 'node:net';
import { parseArgs } from 'node:util';
import { selfSigned } from '../host/src/server/tls.ts';

export type Handler = (path: string, body: string) => unknown;

export async function serve(handler: Handler): Promise<void> {
  const { values } = parseArgs({ options: { port: { type: 'string', default: '0' } } });
  const { key, cert } = await selfSigned(['localhost', '127.0.0.1']);
  const server = createServer({ key, cert }, (req: IncomingMessage, res: ServerResponse) => {
    if (req.method === 'GET') return send(res, req.url === '/readyz' ? 200 : 404, { status: 'ready' });
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => {
      try {
        const answer = handler(req.url ?? '/', Buffer.concat(chunks).toString('utf8'));
        // Only bench/inline-server.ts answers later; the limit keeps its synchronous path.
        if (answer instanceof Promise) answer.then((a) => send(res, 200, a), (error) => send(res, 400, { error: String(error) }));
        else send(res, 200, answer);
      } catch (error) {
        send(res, 400, { error: String(error) });
      }
    });
  });
  server.keepAliveTimeout = 30_000;
  server.listen(Number(values.port), '127.0.0.1', () => {
    process.stdout.write(`${JSON.stringify({ port: (server.address() as AddressInfo).port })}\n`);
  });
  process.once('SIGTERM', () => {
    server.close();
    server.closeAllConnections();
  });
}

function send(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}
