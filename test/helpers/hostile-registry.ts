// A registry that misbehaves on purpose, for the OCI client's defences: a node:http server where
// each test says how one repository answers (a lying size, a body that never ends, a hostile
// media type). Normal behaviour is tested against the real docker-registry (registry.ts).
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { OCI_MANIFEST } from '../../host/src/oci/artifact.ts';
import { sha256 } from './registry.ts';

export type Handler = (kind: 'manifests' | 'blobs', reference: string, req: IncomingMessage, res: ServerResponse) => void;

export interface HostileRegistry {
  /** host:port, as it goes in oci:// references (list it as insecure). */
  host: string;
  /** Every request, as "METHOD /path". */
  requests: string[];
  route(repository: string, handler: Handler): void;
  close(): Promise<void>;
}

export async function startHostileRegistry(): Promise<HostileRegistry> {
  const routes = new Map<string, Handler>();
  const requests: string[] = [];
  const server: Server = createServer((req, res) => {
    requests.push(`${req.method} ${req.url}`);
    const match = /^\/v2\/(.+)\/(manifests|blobs)\/([^/?]+)/.exec(req.url ?? '');
    const handler = match ? routes.get(match[1]!) : undefined;
    if (!match || !handler) return void res.writeHead(404).end();
    handler(match[2] as 'manifests' | 'blobs', match[3]!, req, res);
  });
  // What a stalled registry holds open must not hold the test up at close.
  server.keepAliveTimeout = 100;
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    host: `127.0.0.1:${(server.address() as AddressInfo).port}`,
    requests,
    route: (repository, handler) => void routes.set(repository, handler),
    close: () => new Promise((resolve) => {
      server.closeAllConnections();
      server.close(() => resolve());
    }),
  };
}

export interface Layer {
  mediaType?: string;
  digest: string;
  size: number;
  annotations?: Record<string, unknown>;
}

export const wasmLayerOf = (bytes: Uint8Array, title = 'policy.wasm'): Layer => ({
  mediaType: 'application/vnd.wasm.content.layer.v1+wasm', digest: sha256(bytes), size: bytes.length, annotations: { 'org.opencontainers.image.title': title },
});

export function manifestOf(layers: Layer[], extra: Record<string, unknown> = {}): Buffer {
  const config = Buffer.from('{}');
  return Buffer.from(JSON.stringify({
    schemaVersion: 2, mediaType: OCI_MANIFEST,
    config: { mediaType: 'application/vnd.wasm.config.v1+json', digest: sha256(config), size: config.length },
    layers: layers.map((layer) => ({ mediaType: 'application/vnd.wasm.content.layer.v1+wasm', ...layer })),
    ...extra,
  }));
}

export function send(res: ServerResponse, body: Uint8Array, type = OCI_MANIFEST, status = 200): void {
  res.writeHead(status, { 'content-type': type, 'content-length': body.length }).end(body);
}

/** A core module of `size` bytes: the Wasm header, then one custom section of filler. */
export function wasmOfSize(size: number, fill = 0x61): Uint8Array {
  const bytes = new Uint8Array(size).fill(fill);
  bytes.set([0, 0x61, 0x73, 0x6d, 1, 0, 0, 0]);
  return bytes;
}
