// deploy/ installed as an operator would, then the host run exactly as the Deployment's pods
// run it: as the portcullis ServiceAccount (a TokenRequest token), with POD_NAMESPACE/POD_NAME,
// the ConfigMap's configuration and the certificate Secret it fills itself, and webhooks whose
// clientConfig names the Service. The apiserver really dials the Service:
//   kube-apiserver 1.20 never resolves a Service's DNS name for a webhook. It asks a resolver:
//   by default the Service's ClusterIP (nothing listens there without kube-proxy), or, with
//   --enable-aggregator-routing, an address from the Service's Endpoints. Endpoints may not
//   hold loopback addresses (validation refuses 127.0.0.0/8), so the "pods" run in a network
//   namespace this test creates (a veth pair, 198.51.100.1 on this side, 198.51.100.2 in the
//   namespace: the test's own test host, and the only non-loopback address it talks to), and the
//   test writes the Endpoints object the endpoints controller would. The TLS name checked is still portcullis.portcullis.svc.
// That needs its own control plane: the shared script with the same apiserver binary plus
// --enable-aggregator-routing (a wrapper passed as KUBE_APISERVER), not the suite's one.
import { spawn, type ChildProcess } from 'node:child_process';
import { X509Certificate } from 'node:crypto';
import { existsSync } from 'node:fs';
import { chmod, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { connect } from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse, stringify } from 'yaml';
import { freePort, run, type Run } from '../helpers/process.ts';
import { root, waitFor } from './helpers.ts';

const NS = 'portcullis';
const WORK = 'e2e-deploy';
const SERVICE_NAME = 'portcullis.portcullis.svc';
const script = process.env.PORTCULLIS_LOCAL_APISERVER ?? resolve(root, '../shared/tools/local-apiserver.sh');

let dir: string;
let kubeconfig: string;
let apiEnv: NodeJS.ProcessEnv;
const hosts: Replica[] = [];

const kubectl = (args: string[], input?: string): Promise<Run> => run('kubectl', args, { env: { KUBECONFIG: kubeconfig }, ...(input ? { input } : {}) });
async function kubectlOk(args: string[], input?: string): Promise<string> {
  const result = await kubectl(args, input);
  if (result.code !== 0) throw new Error(`kubectl ${args.join(' ')} failed (${result.code}): ${result.stderr}`);
  return result.stdout;
}
async function getJson<T>(args: string[]): Promise<T | undefined> {
  const result = await kubectl([...args, '-o', 'json']);
  if (result.code !== 0) {
    if (/NotFound|not found/.test(result.stderr)) return undefined;
    throw new Error(`kubectl ${args.join(' ')}: ${result.stderr}`);
  }
  return JSON.parse(result.stdout) as T;
}

/** The "pods" run in a network namespace of the test's own, reached over a veth pair. */
const NETNS = `portcullis-e2e-${process.pid}`;
const VETH = `pcv${process.pid % 100000}`;
const NODE_IP = '198.51.100.1';
const POD_IP = '198.51.100.2';
const podIp = (): string => POD_IP;

async function ip(args: string[]): Promise<void> {
  const result = await run('ip', args);
  if (result.code !== 0) throw new Error(`ip ${args.join(' ')} failed: ${result.stderr.trim()} (this test needs root and iproute2)`);
}

async function createPodNetwork(): Promise<void> {
  await run('ip', ['netns', 'del', NETNS]);
  await ip(['netns', 'add', NETNS]);
  await ip(['link', 'add', `${VETH}a`, 'type', 'veth', 'peer', 'name', `${VETH}b`]);
  await ip(['link', 'set', `${VETH}b`, 'netns', NETNS]);
  await ip(['addr', 'add', `${NODE_IP}/30`, 'dev', `${VETH}a`]);
  await ip(['link', 'set', `${VETH}a`, 'up']);
  await ip(['netns', 'exec', NETNS, 'ip', 'addr', 'add', `${POD_IP}/30`, 'dev', `${VETH}b`]);
  await ip(['netns', 'exec', NETNS, 'ip', 'link', 'set', `${VETH}b`, 'up']);
  await ip(['netns', 'exec', NETNS, 'ip', 'link', 'set', 'lo', 'up']);
}

interface Replica {
  name: string;
  port: number;
  metricsPort: number;
  child: ChildProcess;
  output(): string;
  exited: Promise<number | null>;
  stop(signal?: NodeJS.Signals): Promise<number | null>;
}

interface Secret { metadata: { annotations?: Record<string, string> }; data?: Record<string, string> }
interface WebhookConfiguration {
  webhooks?: {
    name: string; failurePolicy?: string; objectSelector?: Record<string, unknown>;
    clientConfig: { url?: string; caBundle?: string; service?: Record<string, unknown> };
  }[];
}

const decode = (b64: string | undefined) => Buffer.from(b64 ?? '', 'base64').toString('utf8');

/** The certificate a replica presents for the Service's name, verified against `ca` as the apiserver would. */
function servedFingerprint(port: number, ca: string): Promise<string> {
  return new Promise((ok, fail) => {
    const socket = connect({ host: podIp(), port, servername: SERVICE_NAME, ca, rejectUnauthorized: true }, () => {
      const cert = socket.getPeerX509Certificate();
      socket.end();
      if (cert) ok(cert.fingerprint256);
      else fail(new Error('no peer certificate'));
    });
    socket.setTimeout(5000, () => socket.destroy(new Error('TLS handshake timed out')));
    socket.on('error', fail);
  });
}

async function startReplica(name: string, configText: string, saKubeconfig: string): Promise<Replica> {
  const port = await freePort();
  const metricsPort = await freePort();
  // The ConfigMap's configuration, changed only where a pod differs from this test process:
  // its own address and ports, and where the image keeps the example policies (/app/policies).
  const config = parse(configText) as { server: Record<string, unknown>; policies: { module: string }[] };
  config.server.host = podIp();
  config.server.port = port;
  config.server.metricsPort = metricsPort;
  for (const p of config.policies) p.module = p.module.replace(/^\/app\/policies\//, `${root}policies/`);
  const file = join(dir, `${name}.yaml`);
  await writeFile(file, stringify(config));
  const child = spawn('ip', ['netns', 'exec', NETNS, process.execPath, `${root}host/bin/portcullis.js`, 'serve', '--config', file], {
    cwd: root, env: { ...process.env, KUBECONFIG: saKubeconfig, POD_NAMESPACE: NS, POD_NAME: name }, stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout.on('data', (d) => (output += d));
  child.stderr.on('data', (d) => (output += d));
  const exited = new Promise<number | null>((ok) => child.on('exit', (code) => ok(code)));
  const replica: Replica = {
    name, port, metricsPort, child, exited, output: () => output,
    async stop(signal = 'SIGTERM') {
      if (child.exitCode === null && child.signalCode === null) child.kill(signal);
      return exited;
    },
  };
  hosts.push(replica);
  await waitFor(`${name} to be ready`, async () => (await fetch(`http://${podIp()}:${metricsPort}/readyz`)).status === 200, 60_000, 250)
    .catch((error: unknown) => {
      throw new Error(`${String(error)}\n--- ${name} output ---\n${output.slice(-4000)}`);
    });
  return replica;
}

beforeAll(async () => {
  if (!existsSync(script)) throw new Error(`the e2e tests need ${script}`);
  await createPodNetwork();
  dir = await mkdtemp(join(tmpdir(), 'portcullis-e2e-deploy-'));
  const built = process.env.KUBE_APISERVER ?? (await run('bash', [resolve(root, 'scripts/kube-apiserver.sh')])).stdout.trim();
  const wrapper = join(dir, 'kube-apiserver');
  // Also listen where the pods' namespace reaches this machine (the later --bind-address wins).
  await writeFile(wrapper, `#!/bin/sh\nexec ${JSON.stringify(built)} "$@" --enable-aggregator-routing --bind-address 0.0.0.0\n`);
  await chmod(wrapper, 0o755);
  apiEnv = { KUBE_APISERVER: wrapper, ETCD_PORT: String(await freePort()), APISERVER_PORT: String(await freePort()) };
  const up = await run(script, ['up', dir], { env: apiEnv });
  if (up.code !== 0) throw new Error(`${script} up failed: ${up.stderr}`);
  kubeconfig = join(dir, 'kubeconfig');
}, 300_000);

afterAll(async () => {
  await Promise.all(hosts.map((h) => h.stop('SIGKILL')));
  await run('ip', ['netns', 'del', NETNS]);
  if (dir) {
    await run(script, ['down', dir], { env: apiEnv });
    await rm(dir, { recursive: true, force: true });
  }
});

describe('deploy/ in a cluster', () => {
  let configText: string;
  let saKubeconfig: string;
  let a: Replica;
  let b: Replica;

  it('kubectl apply -f deploy/ on a fresh cluster creates the Namespace first, then everything else', async () => {
    const result = await kubectl(['apply', '-f', `${root}deploy/`]);
    // Kubernetes 1.20 has no policy/v1 PodDisruptionBudget (1.21 added it, 1.25 removed v1beta1):
    // that object alone is refused here; everything else must be created on this first apply.
    const errors = result.stderr.split('\n').filter((l) => /error|not found/i.test(l));
    expect(errors.every((l) => /PodDisruptionBudget.*policy\/v1/.test(l)), result.stderr).toBe(true);
    expect(result.stdout).toMatch(/^namespace\/portcullis created$/m);
    for (const object of ['serviceaccount/portcullis', 'secret/portcullis-tls', 'role.rbac.authorization.k8s.io/portcullis', 'configmap/portcullis-config', 'service/portcullis', 'deployment.apps/portcullis']) {
      expect(result.stdout).toContain(`${object} created`);
    }
    // The same objects through kustomize, with the 1.20 overlay for the PodDisruptionBudget.
    const kustomized = await kubectl(['apply', '-k', `${root}deploy-overlays/kubernetes-1.20`]);
    expect(kustomized.code, kustomized.stderr).toBe(0);
    expect(kustomized.stdout).toMatch(/poddisruptionbudget.policy\/portcullis created/);
  });

  it('runs two replicas as the ServiceAccount, behind the Service, from the ConfigMap', async () => {
    // Kubernetes 1.20 does not label namespaces with their name; the webhooks' exclusion needs it.
    await kubectlOk(['create', 'namespace', WORK]);
    for (const ns of [WORK, 'kube-system', 'default']) await kubectlOk(['label', '--overwrite', 'namespace', ns, `kubernetes.io/metadata.name=${ns}`]);
    // What the endpoints controller writes for two ready pods.
    const ip = podIp();
    const token = JSON.parse(await kubectlOk(['create', '--raw', `/api/v1/namespaces/${NS}/serviceaccounts/portcullis/token`, '-f', '-'],
      JSON.stringify({ apiVersion: 'authentication.k8s.io/v1', kind: 'TokenRequest', spec: { expirationSeconds: 3600 } })))
      .status.token as string;
    // The pods reach the apiserver over the veth, at this machine's side of it.
    const server = /server: "?([^"\s]+)"?/.exec(await readFile(kubeconfig, 'utf8'))![1]!.replace('127.0.0.1', NODE_IP);
    saKubeconfig = join(dir, 'serviceaccount.kubeconfig');
    // In a pod: the token and ca.crt mounted at /var/run/secrets/kubernetes.io/serviceaccount. The
    // test apiserver's self-made certificate does not name the veth address, so it is not verified here.
    await writeFile(saKubeconfig, stringify({
      apiVersion: 'v1', kind: 'Config', 'current-context': 'sa',
      clusters: [{ name: 'local', cluster: { server, 'insecure-skip-tls-verify': true } }],
      users: [{ name: 'sa', user: { token } }],
      contexts: [{ name: 'sa', context: { cluster: 'local', user: 'sa', namespace: NS } }],
    }));
    // Least privilege: the ServiceAccount reads its own Secret but cannot list Secrets or read others.
    const as = ['--as', `system:serviceaccount:${NS}:portcullis`];
    expect((await kubectl(['auth', 'can-i', 'get', 'secret/portcullis-tls', '-n', NS, ...as])).stdout.trim()).toBe('yes');
    expect((await kubectl(['auth', 'can-i', 'list', 'secrets', '-n', NS, ...as])).stdout.trim()).toBe('no');
    expect((await kubectl(['auth', 'can-i', 'get', 'secret/other', '-n', NS, ...as])).stdout.trim()).toBe('no');

    configText = (await getJson<{ data: Record<string, string> }>(['get', 'configmap', 'portcullis-config', '-n', NS]))!.data['portcullis.yaml']!;
    a = await startReplica('portcullis-5d8c7-a', configText, saKubeconfig);
    b = await startReplica('portcullis-5d8c7-b', configText, saKubeconfig);
    await kubectlOk(['apply', '-f', '-'], JSON.stringify({
      apiVersion: 'v1', kind: 'Endpoints', metadata: { name: 'portcullis', namespace: NS },
      subsets: [a, b].map((r) => ({ addresses: [{ ip }], ports: [{ name: 'https', port: r.port }] })),
    }));

    // The first replica filled the Secret; both serve its certificate, for the Service's name.
    const secret = (await getJson<Secret>(['get', 'secret', 'portcullis-tls', '-n', NS]))!;
    const ca = decode(secret.data?.['ca.crt']);
    const fingerprint = new X509Certificate(decode(secret.data?.['tls.crt'])).fingerprint256;
    expect(await servedFingerprint(a.port, ca)).toBe(fingerprint);
    expect(await servedFingerprint(b.port, ca)).toBe(fingerprint);
    expect(a.output()).toMatch(/"msg":"TLS","mode":"secret","source":"Secret portcullis\/portcullis-tls/);
    expect(a.output()).toMatch(/"msg":"ready","loadMs":\d+/);
    // It knows its own user from the ServiceAccount token, so only its own writes of its Lease and Secret skip the policies.
    expect(a.output()).toContain(`"msg":"the host's own Lease and certificate Secret skip the policies when it writes them itself","username":"system:serviceaccount:${NS}:portcullis"`);

    // The leader's webhooks name the Service (not a URL) and trust the Secret's CA.
    const validating = await waitFor('the validating configuration', () => getJson<WebhookConfiguration>(['get', 'validatingwebhookconfiguration', 'portcullis.dev']), 30_000);
    expect(validating.webhooks!.map((w) => w.name).sort()).toEqual(['no-delete.portcullis.dev', 'require-labels.portcullis.dev']);
    for (const hook of validating.webhooks!) {
      expect(hook.clientConfig.url).toBeUndefined();
      expect(hook.clientConfig.service).toMatchObject({ name: 'portcullis', namespace: NS, port: 443 });
      expect(decode(hook.clientConfig.caBundle)).toContain(ca.trim());
      // The examples never fail closed (no replica answering must not stop the cluster's Pods).
      expect(hook.failurePolicy, hook.name).toBe('Ignore');
    }
    // Only the objects no-delete protects are sent to it: not every delete in the cluster.
    expect(validating.webhooks!.find((w) => w.name === 'no-delete.portcullis.dev')!.objectSelector).toEqual({ matchLabels: { 'portcullis.dev/no-delete': 'true' } });
    const mutating = (await getJson<WebhookConfiguration>(['get', 'mutatingwebhookconfiguration', 'portcullis.dev']))!;
    expect(mutating.webhooks!.map((w) => [w.name, w.failurePolicy])).toEqual([['added-by.portcullis.dev', 'Ignore']]);
    // Re-applying the manifests (an upgrade) keeps the certificate the host wrote into the Secret.
    await kubectlOk(['apply', '-k', `${root}deploy-overlays/kubernetes-1.20`]);
    const reapplied = (await getJson<Secret>(['get', 'secret', 'portcullis-tls', '-n', NS]))!;
    expect(new X509Certificate(decode(reapplied.data?.['tls.crt'])).fingerprint256).toBe(fingerprint);
    const leaders = await Promise.all([a, b].map(async (r) => /^portcullis_leader (\d)$/m.exec(await (await fetch(`http://${ip}:${r.metricsPort}/metrics`)).text())?.[1]));
    expect(leaders.sort()).toEqual(['0', '1']);
  });

  it('kubectl is mutated and warned through the Service', async () => {
    const created = JSON.parse(await kubectlOk(['-n', WORK, 'create', 'configmap', 'mutated', '--from-literal=a=b', '-o', 'json'])) as Secret;
    expect(created.metadata.annotations).toMatchObject({ 'portcullis.dev/added-by': 'portcullis' });
    // deploy/ ships require-labels with enforcement: warn (a first install must not stop every
    // unlabelled Pod of the cluster): admitted, and the user is told.
    const warned = await kubectl(['-n', WORK, 'run', 'unlabelled', '--image=registry.invalid/app:1', '--restart=Never']);
    expect(warned.code, warned.stderr).toBe(0);
    expect(warned.stderr).toMatch(/Warning: policy "require-labels": would deny \(enforcement: warn\): missing required label: team/);
    const labelled = await kubectl(['-n', WORK, 'run', 'labelled', '--image=registry.invalid/app:1', '--restart=Never', '--labels=team=a']);
    expect(labelled.code, labelled.stderr).toBe(0);
    expect(labelled.stderr).not.toMatch(/require-labels/);
  });

  it('a forced rotation switches both replicas with no failed request', async () => {
    const before = (await getJson<Secret>(['get', 'secret', 'portcullis-tls', '-n', NS]))!;
    const oldCa = decode(before.data?.['ca.crt']);
    const oldFingerprint = new X509Certificate(decode(before.data?.['tls.crt'])).fingerprint256;
    let stop = false;
    const failures: string[] = [];
    let requests = 0;
    // kubectl through the apiserver and the Service, back to back, for the whole rotation.
    const traffic = (async () => {
      for (let i = 0; !stop; i++) {
        const r = await kubectl(['-n', WORK, 'create', 'configmap', `rotation-${i}`, '--from-literal=a=b', '-o', 'jsonpath={.metadata.annotations}']);
        requests++;
        if (r.code !== 0 || !r.stdout.includes('portcullis.dev/added-by')) failures.push(`${r.code}: ${r.stderr}${r.stdout}`);
      }
    })();
    const started = Date.now();
    await kubectlOk(['-n', NS, 'annotate', '--overwrite', 'secret', 'portcullis-tls', 'portcullis.dev/rotate=now']);
    const after = await waitFor('the rotated Secret', async () => {
      const s = await getJson<Secret>(['get', 'secret', 'portcullis-tls', '-n', NS]);
      return s && decode(s.data?.['ca.crt']) !== oldCa ? s : undefined;
    }, 60_000, 500);
    const newCa = decode(after.data?.['ca.crt']);
    const newFingerprint = new X509Certificate(decode(after.data?.['tls.crt'])).fingerprint256;
    // Both replicas switch (the follower within its poll interval), each verifiable with the new CA.
    for (const r of [a, b]) await waitFor(`${r.name} to serve the new certificate`, async () => (await servedFingerprint(r.port, newCa)) === newFingerprint, 60_000, 500);
    const switchedMs = Date.now() - started;
    await new Promise((r) => setTimeout(r, 3000));
    stop = true;
    await traffic;
    process.stdout.write(`rotation: both replicas switched ${switchedMs} ms after the annotation; ${requests} kubectl requests, ${failures.length} failed\n`);
    expect(failures).toEqual([]);
    expect(requests).toBeGreaterThan(5);
    expect(newFingerprint).not.toBe(oldFingerprint);
    expect(after.metadata.annotations?.['portcullis.dev/rotate']).toBeUndefined();
    expect(after.metadata.annotations?.['portcullis.dev/not-after']).toMatch(/^\d{4}-/);
    // Published before served: the webhooks trust both CAs during the overlap.
    const validating = (await getJson<WebhookConfiguration>(['get', 'validatingwebhookconfiguration', 'portcullis.dev']))!;
    for (const hook of validating.webhooks!) {
      expect(decode(hook.clientConfig.caBundle)).toContain(newCa.trim());
      expect(decode(hook.clientConfig.caBundle)).toContain(oldCa.trim());
    }
    const apiserverLog = await readFile(join(dir, 'apiserver.log'), 'utf8');
    expect(apiserverLog).not.toMatch(/failed calling webhook|x509: /);
  });

  it('the overlays build with kubectl\'s kustomize and change what they say', async () => {
    const build = async (overlay: string) => (await kubectlOk(['kustomize', `${root}deploy-overlays/${overlay}`])).split(/^---$/m).map((d) => parse(d) as Record<string, any>); // eslint-disable-line @typescript-eslint/no-explicit-any
    const certManager = await build('cert-manager');
    const kinds = certManager.map((o) => `${o.kind}/${o.metadata.name}`);
    expect(kinds).toEqual(expect.arrayContaining(['Issuer/portcullis-selfsigned', 'Certificate/portcullis-ca', 'Issuer/portcullis-ca', 'Certificate/portcullis-serving']));
    expect(kinds).not.toContain('Secret/portcullis-tls');
    const pod = certManager.find((o) => o.kind === 'Deployment')!.spec.template.spec;
    expect(pod.volumes).toContainEqual({ name: 'tls', secret: { secretName: 'portcullis-serving-cert' } });
    expect(pod.containers[0].volumeMounts).toContainEqual({ name: 'tls', mountPath: '/etc/portcullis/tls', readOnly: true });
    expect(JSON.stringify(certManager.find((o) => o.kind === 'Role')!.rules)).not.toContain('secrets');
    expect(parse(certManager.find((o) => o.kind === 'ConfigMap')!.data['portcullis.yaml'])).toMatchObject({ server: { tls: { mode: 'files' } } });
    const single = await build('single-webhook');
    expect(parse(single.find((o) => o.kind === 'ConfigMap')!.data['portcullis.yaml'])).toMatchObject({ webhooks: { singleWebhook: true } });
    const monitor = (await build('servicemonitor')).find((o) => o.kind === 'ServiceMonitor')!;
    expect(monitor.spec.endpoints).toEqual([{ port: 'metrics', path: '/metrics', scheme: 'http', interval: '30s' }]);
  });

  it('uninstalling leaves no webhook configuration behind', async () => {
    await kubectlOk(['-n', NS, 'delete', 'deployment', 'portcullis']);
    // What the kubelet does to the Deployment's pods: SIGTERM, then wait for the exit.
    expect(await Promise.all([a.stop(), b.stop()])).toEqual([0, 0]);
    const removed = await kubectl(['delete', '-k', `${root}deploy-overlays/kubernetes-1.20`, '--ignore-not-found', '--wait=false']);
    expect(removed.code, removed.stderr).toBe(0);
    expect(await getJson(['get', 'validatingwebhookconfiguration', 'portcullis.dev'])).toBeUndefined();
    expect(await getJson(['get', 'mutatingwebhookconfiguration', 'portcullis.dev'])).toBeUndefined();
    expect(await getJson(['get', 'clusterrole', 'portcullis-webhooks'])).toBeUndefined();
    // Nothing intercepts requests any more: an unlabelled pod is accepted.
    const pod = await kubectl(['-n', WORK, 'run', 'after-uninstall', '--image=registry.invalid/app:1', '--restart=Never']);
    expect(pod.code, pod.stderr).toBe(0);
  });
});
