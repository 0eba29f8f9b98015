// A second, plain-HTTP listener for Prometheus and the kubelet's probes (server.metricsPort):
// scrapers and probes then need neither the webhook's CA nor a route to the webhook port, and
// it answers only GET /metrics, /healthz and /readyz (never a review).
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Metrics } from './metrics.ts';
import { limitConnections } from './connections.ts';
import { nodeHttp } from '../util/node-http.ts';

export interface MetricsListenerDeps {
  metrics: Metrics;
  isReady(): { ready: boolean; detail: Record<string, unknown> };
  /** See HttpDeps.isAlive. */
  isAlive?(): { alive: boolean; detail: Record<string, unknown> };
}

export function listenMetrics(host: string, port: number, deps: MetricsListenerDeps): Promise<Server> {
  // Checked every second (Node: every 30 s), so a slow request goes after ~5 s.
  const server = nodeHttp.createServer({ connectionsCheckingInterval: 1000 }, (req, res) => {
    const path = (req.url ?? '/').split('?')[0];
    const json = (status: number, body: unknown) => {
      res.writeHead(status, { 'content-type': 'application/json' });
      res.end(JSON.stringify(body));
    };
    if (req.method !== 'GET' && req.method !== 'HEAD') return json(405, { code: 'METHOD_NOT_ALLOWED', message: `${path} takes GET` });
    if (path === '/healthz') {
      const { alive, detail } = deps.isAlive?.() ?? { alive: true, detail: {} };
      return json(alive ? 200 : 503, { status: alive ? 'ok' : 'unhealthy', ...detail });
    }
    if (path === '/readyz') {
      const { ready, detail } = deps.isReady();
      return json(ready ? 200 : 503, { status: ready ? 'ready' : 'not ready', ...detail });
    }
    if (path === '/metrics') {
      deps.metrics.registry.metrics().then((text) => {
        res.writeHead(200, { 'content-type': deps.metrics.registry.contentType });
        res.end(text);
      }, (error: unknown) => json(500, { code: 'INTERNAL_ERROR', message: String(error) }));
      return;
    }
    json(404, { code: 'NOT_FOUND', message: `the metrics port serves only /metrics, /healthz and /readyz, not ${path}` });
  });
  server.keepAliveTimeout = 30_000;
  // Scrapers and probes need a handful of connections; anyone who can reach the port must not
  // hold them all: 256 idle sockets from one client failed every kubelet probe (re-test), and the
  // Deployment restarts a pod whose probes fail. Per address, then idle ones evicted near the cap.
  limitConnections(server, { maxConnections: 1024, maxConnectionsPerAddress: 32 }, false, () => {});
  // A socket that sends nothing is not subject to the headers timeout (it starts at the first
  // byte): any socket silent for 5 s goes. Scrapers and probes reconnect.
  server.timeout = 5_000;
  server.headersTimeout = 5_000;
  server.requestTimeout = 10_000;
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      server.off('error', reject);
      resolve(server);
    });
  });
}

export function metricsUrl(server: Server): string {
  const { address, port } = server.address() as AddressInfo;
  return `http://${address === '0.0.0.0' || address === '::' ? '127.0.0.1' : address}:${port}`;
}
