// A server whose policies have context grants, with a cluster that cannot be reached: it
// serves, says it is not ready and why, and a policy's read fails as temporary (retry later),
// never as a crash or an allow.
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { request } from '@portcullis/sdk/testing';
import { freePort } from '../helpers/process.ts';
import { policyYaml, startServer, type TestServer } from '../helpers/server.ts';
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';

let server: TestServer;

beforeAll(async () => {
  const dir = await mkdtemp(join(tmpdir(), 'portcullis-kubeconfig-'));
  const port = await freePort(); // nothing listens there
  const kubeconfig = join(dir, 'config');
  await writeFile(kubeconfig, JSON.stringify({
    apiVersion: 'v1', kind: 'Config', 'current-context': 'x',
    clusters: [{ name: 'x', cluster: { server: `https://127.0.0.1:${port}`, 'insecure-skip-tls-verify': true } }],
    users: [{ name: 'x', user: { token: 'none' } }], contexts: [{ name: 'x', context: { cluster: 'x', user: 'x' } }],
  }));
  process.env.KUBECONFIG = kubeconfig;
  server = await startServer(`policies:\n${policyYaml('namespace-owner', 'context: [{ apiVersion: v1, kind: Namespace }]')}`);
});
afterAll(() => server.close());

describe('a server with context grants before its caches sync', () => {
  it('/readyz answers 503 and lists the kinds still syncing', async () => {
    const res = await server.get('/readyz');
    expect(res.status).toBe(503);
    expect(JSON.parse(res.text)).toMatchObject({ status: 'not ready', failed: [], context: [{ kind: 'v1 Namespace', synced: false, objects: 0 }] });
  });

  it('a policy that reads gets a temporary failure, so the request is refused, not allowed', async () => {
    const review = { apiVersion: 'admission.k8s.io/v1', kind: 'AdmissionReview', request: request({ namespace: 'shop', object: { metadata: { name: 'p' } } }) };
    const res = await server.post('/validate', review);
    expect(res.status).toBe(200);
    expect(res.body.response.allowed).toBe(false);
    expect(res.body.response.status.message).toContain('policy "namespace-owner": the host\'s cache of Namespace (v1) has not synced with the cluster yet; retry shortly');
  });

  it('logs why it cannot sync', () => {
    expect(server.logs.some((line) => line.includes('context: cannot discover a granted kind; retrying'))).toBe(true);
  });
});

describe('a server with context grants and no cluster credentials', () => {
  it('refuses to start, saying what to set', async () => {
    const saved = process.env.KUBECONFIG;
    process.env.KUBECONFIG = '/nonexistent/portcullis-kubeconfig';
    try {
      await expect(startServer(`policies:\n${policyYaml('namespace-owner', 'context: [{ apiVersion: v1, kind: Namespace }]')}`))
        .rejects.toThrow(/cannot load Kubernetes credentials for context grants: .*no such file.*; set KUBECONFIG or run in a Pod/);
    } finally {
      process.env.KUBECONFIG = saved;
    }
  });

  it('a server without grants needs no cluster at all', async () => {
    const saved = process.env.KUBECONFIG;
    process.env.KUBECONFIG = '/nonexistent/portcullis-kubeconfig';
    try {
      const plain = await startServer(`policies:\n${policyYaml('numbers')}`);
      expect((await plain.get('/readyz')).status).toBe(200);
      await plain.close();
    } finally {
      process.env.KUBECONFIG = saved;
    }
  });
});
