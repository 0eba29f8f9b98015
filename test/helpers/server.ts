// Starts a real Portcullis server in-process (HTTPS on a free loopback port) from YAML text,
// and gives an undici client that trusts its CA.
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Agent, request as undiciRequest, type Dispatcher } from 'undici';
import { loadConfigFile } from '../../host/src/config/load.ts';
import { PortcullisServer } from '../../host/src/server/app.ts';
import { createLogger, type Logger } from '../../host/src/util/log.ts';
import { root } from './policies.ts';

export interface TestServer {
  server: PortcullisServer;
  dir: string;
  configPath: string;
  agent: Agent;
  logs: string[];
  // eslint-disable-next-line @typescript-eslint/no-explicit-any -- tests assert on any response shape
  post(path: string, body: unknown, headers?: Record<string, string>): Promise<{ status: number; body: any }>;
  get(path: string): Promise<{ status: number; text: string }>;
  close(): Promise<void>;
}

export const POLICIES = `${root}policies`;

/** YAML for `policies:` items, with module paths pointing at the built example policies. */
export function policyYaml(name: string, extra = '', file = name): string {
  return `  - name: ${name}\n    module: ${POLICIES}/${file}/${file}.wasm\n${extra.split('\n').filter(Boolean).map((l) => `    ${l}`).join('\n')}\n`;
}

export interface StartServerOptions {
  watch?: boolean;
  log?: Logger;
  retireGraceMs?: number;
  requester?: string;
}

export async function startServer(yaml: string, options: StartServerOptions = {}): Promise<TestServer> {
  const dir = await mkdtemp(join(tmpdir(), 'portcullis-server-'));
  const configPath = join(dir, 'portcullis.yaml');
  // Tests share the developer's cache folder, from parallel processes: only a test about the
  // cache prunes it (in the file, so that a reload reads it too).
  await writeFile(configPath, /^cache:/m.test(yaml) ? yaml : `cache: { maxMiB: 0 }\n${yaml}`);
  const logs: string[] = [];
  const log = options.log ?? createLogger('debug', (line) => logs.push(line));
  const grace = {
    ...(options.retireGraceMs !== undefined ? { retireGraceMs: options.retireGraceMs } : {}),
    ...(options.requester !== undefined ? { requester: options.requester } : {}),
  };
  let server: PortcullisServer;
  try {
    const config = await loadConfigFile(configPath);
    config.server.port = 0;
    config.server.host = '127.0.0.1';
    server = await PortcullisServer.start({ config, log, watch: options.watch ?? false, ...grace });
  } catch (error) {
    await rm(dir, { recursive: true, force: true });
    throw error;
  }
  const agent = new Agent({ connect: { ca: server.tls?.caBundle ?? '', rejectUnauthorized: true } });
  const send = async (path: string, init: Dispatcher.RequestOptions<unknown>['method'], body?: string, headers: Record<string, string> = {}) =>
    undiciRequest(`${server.url}${path}`, { method: init, dispatcher: agent, ...(body !== undefined ? { body } : {}), headers });
  return {
    server, dir, configPath, agent, logs,
    async post(path, body, headers = {}) {
      const res = await send(path, 'POST', typeof body === 'string' ? body : JSON.stringify(body), { 'content-type': 'application/json', ...headers });
      const text = await res.body.text();
      return { status: res.statusCode, body: text ? JSON.parse(text) : undefined };
    },
    async get(path) {
      const res = await send(path, 'GET');
      return { status: res.statusCode, text: await res.body.text() };
    },
    async close() {
      await agent.close();
      await server.stop(2000);
      await rm(dir, { recursive: true, force: true });
    },
  };
}

let counter = 0;
/** An AdmissionReview for a namespaced object. */
export function admissionReview(object: Record<string, unknown> | null, overrides: Record<string, unknown> = {}, apiVersion = 'admission.k8s.io/v1') {
  const kind = (object?.kind as string | undefined) ?? 'ConfigMap';
  const resource = kind === 'Pod' ? 'pods' : kind === 'KopfExample' ? 'kopfexamples' : 'configmaps';
  const group = kind === 'KopfExample' ? 'kopf.dev' : '';
  return {
    apiVersion, kind: 'AdmissionReview',
    request: {
      uid: `uid-${++counter}`, kind: { group, version: 'v1', kind }, resource: { group, version: 'v1', resource },
      name: (object?.metadata as { name?: string } | undefined)?.name ?? 'obj', namespace: 'default', operation: 'CREATE',
      userInfo: { username: 'tester' }, object, oldObject: null, dryRun: false, ...overrides,
    },
  };
}

export function decodePatch(response: { patch?: string }): unknown {
  return response.patch ? JSON.parse(Buffer.from(response.patch, 'base64').toString('utf8')) : undefined;
}
