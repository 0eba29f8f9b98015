// The host's access to the cluster: deploy/10-rbac.yaml is enough (run as that ServiceAccount,
// with a real token), a missing grant is reported with the verb and resource to grant, an
// unreachable apiserver never stops reviews, and certificate rotation publishes the new CA
// before the new certificate is presented.
import { readFile, writeFile } from 'node:fs/promises';
import { connect } from 'node:tls';
import { join } from 'node:path';
import { Agent, request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { selfSigned } from '../../host/src/server/tls.ts';
import { admissionReview } from '../helpers/server.ts';
import {
  configMap, getMutating, getObject, getValidating, hookNames, kubeconfig, kubectl, kubectlOk, policy, prepareNamespaces,
  removeWebhookConfigurations, root, startHost, stopAllHosts, tempDir, waitFor, WORK_NAMESPACE, type Host,
} from './helpers.ts';

const requireLabels = policy('require-labels', {
  modes: ['validate'], settings: { labels: { team: 'unowned' } },
  rules: [{ operations: ['CREATE'], apiGroups: [''], apiVersions: ['v1'], resources: ['configmaps'] }],
});

beforeAll(async () => {
  await removeWebhookConfigurations();
  await prepareNamespaces();
});

afterAll(async () => {
  await stopAllHosts();
  await removeWebhookConfigurations();
  await kubectl(['delete', 'validatingwebhookconfigurations,mutatingwebhookconfigurations', 'portcullis.dev', '--ignore-not-found']);
});

/** A kubeconfig for the same apiserver with another identity (or another server). */
async function writeKubeconfig(user: Record<string, unknown>, server?: string): Promise<string> {
  const admin = await readFile(kubeconfig(), 'utf8');
  const url = server ?? /server: "?([^"\s}]+)"?/.exec(admin)![1]!;
  const dir = await tempDir('portcullis-e2e-kubeconfig-');
  const file = join(dir, 'kubeconfig');
  await writeFile(file, JSON.stringify({
    apiVersion: 'v1', kind: 'Config', 'current-context': 'c',
    clusters: [{ name: 'c', cluster: { server: url, 'insecure-skip-tls-verify': true } }],
    users: [{ name: 'u', user }],
    contexts: [{ name: 'c', context: { cluster: 'c', user: 'u' } }],
  }));
  return file;
}

async function review(host: Host, ca: string): Promise<{ allowed: boolean; message?: string }> {
  const agent = new Agent({ connect: { ca } });
  try {
    const res = await request(`${host.url}/validate/require-labels`, {
      method: 'POST', dispatcher: agent, headers: { 'content-type': 'application/json' },
      body: JSON.stringify(admissionReview({ kind: 'ConfigMap', metadata: { name: 'x' } })),
    });
    const body = JSON.parse(await res.body.text()) as { response: { allowed: boolean; status?: { message: string } } };
    return { allowed: body.response.allowed, ...(body.response.status ? { message: body.response.status.message } : {}) };
  } finally {
    await agent.close();
  }
}

describe('RBAC: deploy/10-rbac.yaml, as a real ServiceAccount', () => {
  let saKubeconfig: string;

  beforeAll(async () => {
    await kubectlOk(['apply', '-f', `${root}deploy/00-namespace.yaml`, '-f', `${root}deploy/10-rbac.yaml`]);
    // A bound token for portcullis/portcullis: the apiserver authenticates and authorizes the
    // host exactly as it would in the Pod.
    const token = (await kubectlOk(['create', 'token', 'portcullis', '-n', 'portcullis', '--duration', '1h'])).trim();
    saKubeconfig = await writeKubeconfig({ token });
  });

  it('is enough for every call the host makes (create, get, patch, delete; lease create, get, update)', async () => {
    const host = await startHost({ managed: 'portcullis.dev', policies: [requireLabels], webhooks: { namespace: 'portcullis' }, env: { KUBECONFIG: saKubeconfig } });
    await waitFor('the configuration', async () => hookNames(await getValidating('portcullis.dev')).length === 1);
    await host.rewrite((config) => {
      config.policies = [requireLabels, policy('added-by', { rules: [{ operations: ['CREATE'], apiGroups: [''], apiVersions: ['v1'], resources: ['configmaps'] }] })];
    });
    await waitFor('the patch from the reload', async () => hookNames(await getMutating('portcullis.dev')).length === 1);
    expect(await host.stop('SIGTERM')).toBe(0);
    expect(await getValidating('portcullis.dev')).toBeUndefined();
    expect(await getMutating('portcullis.dev')).toBeUndefined();
    expect((await getObject<{ spec: { holderIdentity?: string } }>('lease', 'portcullis.dev', 'portcullis'))!.spec.holderIdentity ?? '').toBe('');
    expect(host.output()).not.toMatch(/40[13] (Forbidden|Unauthorized)/);
  });

  it('reports a missing grant with the verb and resource to grant, and keeps serving reviews', async () => {
    // Another name: resourceNames in the ClusterRole and Role do not cover it.
    const host = await startHost({ managed: 'other.e2e.dev', policies: [requireLabels], webhooks: { namespace: 'portcullis', leaderElection: false }, env: { KUBECONFIG: saKubeconfig } });
    await host.waitForLog(/403 Forbidden: cannot get validatingwebhookconfigurations \\"other\.e2e\.dev\\".*?grant the host's ServiceAccount 'get' on validatingwebhookconfigurations \(deploy\/10-rbac.yaml has the exact rules\)/);
    expect(host.output()).toMatch(/"retryInSeconds":1/);
    expect(await review(host, await readFile(host.caFile, 'utf8'))).toEqual({ allowed: false, message: 'policy "require-labels": missing required label: team' });
    const elected = await startHost({ managed: 'other.e2e.dev', policies: [requireLabels], webhooks: { namespace: 'portcullis' }, env: { KUBECONFIG: saKubeconfig } });
    await elected.waitForLog(/403 Forbidden: cannot get leases \\"other\.e2e\.dev\\" in namespace \\"portcullis\\".*?grant the host's ServiceAccount 'get' on leases in namespace \\"portcullis\\"/);
    expect(await host.stop('SIGTERM')).toBe(0);
    expect(await elected.stop('SIGTERM')).toBe(0);
  });
});

describe('an unreachable apiserver', () => {
  it('is retried and reported while reviews are served; exit does not hang', async () => {
    // Port 2: below the ephemeral range, so no test process listens there (a "free" port handed
    // back by the OS was once given to the host itself, which answered the lease calls with 404);
    // port 1 is on fetch's list of refused ports.
    const closed = 2;
    const nowhere = await writeKubeconfig({ token: 'x' }, `https://127.0.0.1:${closed}`);
    // A 1 s drain on SIGTERM (server.shutdownDelayMs; 5 s by default), so that what is timed
    // below is the webhook cleanup against an apiserver that never answers.
    const host = await startHost({ managed: 'down.e2e.dev', policies: [requireLabels], env: { KUBECONFIG: nowhere }, server: { shutdownDelayMs: 1000 } });
    await host.waitForLog(new RegExp(`cannot reach the apiserver at https://127.0.0.1:${closed} to get leases.*?ECONNREFUSED.*?admission reviews are still served; retrying`));
    expect(await review(host, await readFile(host.caFile, 'utf8'))).toMatchObject({ allowed: false });
    const started = Date.now();
    expect(await host.stop('SIGTERM')).toBe(0);
    expect(Date.now() - started).toBeLessThan(5_000);
  });
});

describe('certificate rotation', () => {
  it('publishes the new CA to the webhooks before presenting the new certificate', async () => {
    const dir = await tempDir('portcullis-e2e-certs-');
    const first = await selfSigned(['127.0.0.1', 'localhost']);
    await writeFile(join(dir, 'tls.crt'), first.cert);
    await writeFile(join(dir, 'tls.key'), first.key);
    const host = await startHost({
      managed: 'rotate.e2e.dev', policies: [requireLabels], dir,
      server: { tls: { mode: 'files', certFile: join(dir, 'tls.crt'), keyFile: join(dir, 'tls.key') } },
    });
    const bundle = async () => {
      const hook = (await getValidating('rotate.e2e.dev'))?.webhooks?.[0];
      return hook?.clientConfig.caBundle ? Buffer.from(hook.clientConfig.caBundle, 'base64').toString('utf8') : '';
    };
    await waitFor('the first CA', async () => (await bundle()) === first.cert);
    const denied = async () => (await kubectl(['create', '-f', '-'], { input: configMap(`rotate-${Date.now()}`, WORK_NAMESPACE) })).stderr;
    expect(await denied()).toContain('denied the request: policy "require-labels": missing required label: team');

    const second = await selfSigned(['127.0.0.1', 'localhost']);
    await writeFile(join(dir, 'tls.key'), second.key);
    await writeFile(join(dir, 'tls.crt'), second.cert);
    await host.waitForLog(/TLS certificate reloaded/);
    const log = host.output();
    expect(log.indexOf('published the new serving CA')).toBeGreaterThan(-1);
    expect(log.indexOf('published the new serving CA')).toBeLessThan(log.indexOf('TLS certificate reloaded'));
    // Both CAs during the overlap: connections and apiserver caches on either side verify.
    const published = await bundle();
    expect(published).toContain(second.cert.trim());
    expect(published).toContain(first.cert.trim());
    expect(await presented(host.port)).toBe(second.cert.replace(/\s+/g, ''));
    // The apiserver still reaches the host, now over the new certificate.
    expect(await denied()).toContain('denied the request: policy "require-labels": missing required label: team');
    expect(await host.stop('SIGTERM')).toBe(0);
    expect(await getValidating('rotate.e2e.dev')).toBeUndefined();
  });
});

function presented(port: number): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = connect({ host: '127.0.0.1', port, rejectUnauthorized: false }, () => {
      const raw = socket.getPeerX509Certificate()!.toString();
      socket.end();
      resolve(raw.replace(/\s+/g, ''));
    });
    socket.on('error', reject);
  });
}
