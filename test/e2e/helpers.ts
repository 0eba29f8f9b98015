// What the e2e tests share: kubectl against the test control plane, real `portcullis serve`
// processes with management on, and waiting for the cluster to reach a state.
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { inject } from 'vitest';
import { root } from '../helpers/policies.ts';
import { freePort, run, type Run } from '../helpers/process.ts';

export { root };

export const kubeconfig = (): string => inject('kubeconfig');

export type { Run };
export { freePort };

export function kubectl(args: string[], options: { input?: string; env?: NodeJS.ProcessEnv } = {}): Promise<Run> {
  return run('kubectl', args, { ...options, env: { KUBECONFIG: kubeconfig(), ...options.env } });
}

/** kubectl that must succeed; returns stdout. */
export async function kubectlOk(args: string[], options: { input?: string } = {}): Promise<string> {
  const result = await kubectl(args, options);
  if (result.code !== 0) throw new Error(`kubectl ${args.join(' ')} failed (${result.code}): ${result.stderr}`);
  return result.stdout;
}

/** An object as JSON, or undefined when it does not exist. */
export async function getObject<T>(kind: string, name: string, namespace?: string): Promise<T | undefined> {
  const result = await kubectl(['get', kind, name, '-o', 'json', ...(namespace ? ['-n', namespace] : [])]);
  if (result.code !== 0) {
    if (/NotFound|not found/.test(result.stderr)) return undefined;
    throw new Error(`kubectl get ${kind} ${name}: ${result.stderr}`);
  }
  return JSON.parse(result.stdout) as T;
}

export function configMap(name: string, namespace: string, labels: Record<string, string> = {}): string {
  return JSON.stringify({ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name, namespace, labels }, data: { k: 'v' } });
}

export async function waitFor<T>(what: string, probe: () => Promise<T | undefined | false>, timeoutMs = 20_000, intervalMs = 250): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const value = await probe();
      if (value !== undefined && value !== false) return value;
    } catch (error) {
      last = error;
    }
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last ? `: ${JSON.stringify(last)}` : ''}`);
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}

export const HOST_NAMESPACE = 'portcullis-system';
export const WORK_NAMESPACE = 'e2e';

/**
 * Namespaces the tests use. Kubernetes 1.20 does not set kubernetes.io/metadata.name (1.21+
 * does), so the tests label them as a newer apiserver would; the managed webhooks' NotIn
 * exclusion depends on that label.
 */
export async function prepareNamespaces(): Promise<void> {
  for (const ns of [HOST_NAMESPACE, WORK_NAMESPACE, 'e2e-ignored']) {
    const exists = await kubectl(['get', 'namespace', ns]);
    if (exists.code !== 0) await kubectlOk(['create', 'namespace', ns]);
  }
  for (const ns of [HOST_NAMESPACE, WORK_NAMESPACE, 'e2e-ignored', 'kube-system', 'default']) {
    await kubectlOk(['label', '--overwrite', 'namespace', ns, `kubernetes.io/metadata.name=${ns}`]);
  }
  await kubectlOk(['label', '--overwrite', 'namespace', 'e2e-ignored', 'portcullis.dev/ignore=true']);
}

/** Removes every webhook configuration the tests may have left, so no later kubectl call is sent to a host that is gone. */
export async function removeWebhookConfigurations(): Promise<void> {
  await kubectl(['delete', 'validatingwebhookconfigurations,mutatingwebhookconfigurations', '--all', '--wait=false']);
  await kubectl(['delete', 'leases', '--all', '-n', HOST_NAMESPACE, '--wait=false']);
}

export function policy(name: string, extra: Record<string, unknown> = {}): Record<string, unknown> {
  return { name, module: `${root}policies/${name}/${name}.wasm`, ...extra };
}

export interface HostOptions {
  managed: string;
  policies: Record<string, unknown>[];
  webhooks?: Record<string, unknown>;
  server?: Record<string, unknown>;
  env?: NodeJS.ProcessEnv;
  dir?: string;
}

export interface Host {
  port: number;
  url: string;
  dir: string;
  configFile: string;
  caFile: string;
  child: ChildProcess;
  output(): string;
  /** Rewrites the configuration file (the server watches it and reloads). */
  rewrite(change: (config: Record<string, unknown>) => void): Promise<void>;
  waitForLog(pattern: RegExp, timeoutMs?: number): Promise<string>;
  /** Sends the signal and resolves with the exit code (null if killed by a signal). */
  stop(signal?: NodeJS.Signals): Promise<number | null>;
  exited: Promise<number | null>;
}

const hosts = new Set<Host>();
const tempDirs = new Set<string>();

/** Kills every host still running and removes their temporary files, for afterAll. */
export async function stopAllHosts(): Promise<void> {
  await Promise.all([...hosts].map((h) => h.stop('SIGKILL')));
  await Promise.all([...tempDirs].map((dir) => rm(dir, { recursive: true, force: true })));
  tempDirs.clear();
}

/** A temporary directory that stopAllHosts removes. */
export async function tempDir(prefix: string): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), prefix));
  tempDirs.add(dir);
  return dir;
}

export function hostConfig(port: number, dir: string, options: HostOptions): Record<string, unknown> {
  return {
    server: { host: '127.0.0.1', port, tls: { mode: 'self-signed', hostnames: ['127.0.0.1', 'localhost'], cadump: join(dir, 'ca.pem') }, ...options.server },
    logLevel: 'debug',
    webhooks: {
      managed: options.managed, url: `https://127.0.0.1:${port}`, namespace: HOST_NAMESPACE, leaseDurationSeconds: 3, timeoutSeconds: 5,
      ...options.webhooks,
    },
    policies: options.policies,
  };
}

/** Spawns the real CLI: `node host/bin/portcullis.js serve --config FILE`. */
export async function startHost(options: HostOptions): Promise<Host> {
  const dir = options.dir ?? await tempDir('portcullis-e2e-host-');
  const port = await freePort();
  const configFile = join(dir, 'portcullis.yaml');
  let config = hostConfig(port, dir, options);
  await writeFile(configFile, JSON.stringify(config, null, 2));
  const child = spawn(process.execPath, [`${root}host/bin/portcullis.js`, 'serve', '--config', configFile], {
    cwd: root, env: { ...process.env, KUBECONFIG: kubeconfig(), ...options.env }, stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout.on('data', (d) => (output += d));
  child.stderr.on('data', (d) => (output += d));
  const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
  const host: Host = {
    port, url: `https://127.0.0.1:${port}`, dir, configFile, caFile: join(dir, 'ca.pem'), child, exited,
    output: () => output,
    async rewrite(change) {
      config = structuredClone(config);
      change(config);
      await writeFile(configFile, JSON.stringify(config, null, 2));
    },
    waitForLog: (pattern, timeoutMs = 20_000) => waitFor(`log ${pattern} from host on port ${port}`, async () => pattern.exec(output)?.[0], timeoutMs, 100)
      .catch((error: unknown) => {
        throw new Error(`${String(error)}\n--- host output (end) ---\n${output.slice(-4000)}`);
      }),
    async stop(signal = 'SIGTERM') {
      if (child.exitCode === null && child.signalCode === null) child.kill(signal);
      const code = await exited;
      hosts.delete(host);
      return code;
    },
  };
  hosts.add(host);
  void exited.then(() => hosts.delete(host));
  await host.waitForLog(/"msg":"listening"/, 30_000).catch((error: unknown) => {
    throw new Error(`${String(error)}\n--- host output ---\n${output}`);
  });
  return host;
}

export async function readCa(host: Host): Promise<string> {
  return readFile(host.caFile, 'utf8');
}

/** The identity a host logged when it became the leader. */
export function leaderIdentity(host: Host): string | undefined {
  return /"msg":"leader election: became the leader[^}]*"identity":"([^"]+)"/.exec(host.output())?.[1];
}

export interface Webhook {
  name: string;
  clientConfig: { url?: string; service?: Record<string, unknown>; caBundle?: string };
  rules: Record<string, unknown>[];
  objectSelector?: Record<string, unknown>;
  namespaceSelector?: Record<string, unknown>;
  failurePolicy: string;
  sideEffects: string;
  timeoutSeconds: number;
  matchPolicy: string;
  admissionReviewVersions: string[];
  reinvocationPolicy?: string;
}

export interface WebhookConfiguration {
  metadata: { name: string; labels?: Record<string, string>; resourceVersion: string };
  webhooks?: Webhook[];
}

export const getValidating = (name: string) => getObject<WebhookConfiguration>('validatingwebhookconfiguration', name);
export const getMutating = (name: string) => getObject<WebhookConfiguration>('mutatingwebhookconfiguration', name);

export function hookNames(config: WebhookConfiguration | undefined): string[] {
  return (config?.webhooks ?? []).map((w) => w.name);
}
