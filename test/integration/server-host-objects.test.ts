// The host's own Lease and certificate Secret are allowed without policies: a policy that covers
// them (no rules: everything) denied the host's lease renewals, and the host, deposed by its own
// webhook, stopped managing its webhooks (outsider run on 1.20, where the host's namespace is
// not excluded until labelled).
import { writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { admissionReview, policyYaml, startServer, type TestServer } from '../helpers/server.ts';

let t: TestServer;
beforeAll(async () => {
  // Credentials that do not say who the host is (a static token, as the test apiserver's admin has).
  const kubeconfig = join(tmpdir(), `portcullis-static-token-${process.pid}.kubeconfig`);
  await writeFile(kubeconfig, JSON.stringify({
    apiVersion: 'v1', kind: 'Config', 'current-context': 'c',
    clusters: [{ name: 'c', cluster: { server: 'https://127.0.0.1:1' } }],
    users: [{ name: 'u', user: { token: 'opaque-static-token' } }],
    contexts: [{ name: 'c', context: { cluster: 'c', user: 'u' } }],
  }));
  process.env.KUBECONFIG = kubeconfig;
  t = await startServer(`
webhooks: { managed: guard.portcullis.dev, url: "https://127.0.0.1:1", namespace: portcullis, leaderElection: true }
server: { tls: { mode: self-signed, hostnames: [127.0.0.1] } }
policies:
${policyYaml('require-labels', 'settings: { labels: { team: x } }')}
`);
});
afterAll(() => t.close());

const lease = (name: string, namespace: string, operation = 'UPDATE') => admissionReview(
  { apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', metadata: { name, namespace } },
  { kind: { group: 'coordination.k8s.io', version: 'v1', kind: 'Lease' }, resource: { group: 'coordination.k8s.io', version: 'v1', resource: 'leases' }, name, namespace, operation },
);

it('allows the host\'s own Lease without evaluating a policy that covers it', async () => {
  for (const operation of ['CREATE', 'UPDATE']) {
    const { body } = await t.post('/validate', lease('guard.portcullis.dev', 'portcullis', operation));
    expect(body.response).toMatchObject({ allowed: true });
    expect(body.response.warnings).toBeUndefined();
  }
  const { body: perPolicy } = await t.post('/validate/require-labels', lease('guard.portcullis.dev', 'portcullis'));
  expect(perPolicy.response.allowed).toBe(true);
  // A policy this replica does not have is answered as such, not as exempt.
  const { body: unknown } = await t.post('/validate/no-such-policy', lease('guard.portcullis.dev', 'portcullis'));
  expect(unknown.response.warnings).toEqual([expect.stringContaining('policy "no-such-policy" (validate) is not configured on this webhook replica')]);
  expect(t.logs.some((line) => line.includes('the host writes this object itself') && line.includes("the host's own leader-election Lease portcullis/guard.portcullis.dev"))).toBe(true);
});

it('puts any other Lease to the policies: another name, another namespace (other operations: test/unit/host-objects)', async () => {
  for (const review of [lease('guard.portcullis.dev', 'default'), lease('other', 'portcullis')]) {
    const { body } = await t.post('/validate', review);
    expect(body.response.allowed).toBe(false);
    expect(body.response.status.message).toBe('policy "require-labels": missing required label: team');
  }
});

it('exempts them only when the host asks, where its credentials name its user', async () => {
  const own = 'system:serviceaccount:portcullis:portcullis';
  const checked = await startServer(`
webhooks: { managed: guard.portcullis.dev, url: "https://127.0.0.1:1", namespace: portcullis, leaderElection: true }
server: { tls: { mode: self-signed, hostnames: [127.0.0.1] } }
policies:
${policyYaml('require-labels', 'settings: { labels: { team: x } }')}
`, { requester: own });
  try {
    const as = (username: string) => {
      const review = lease('guard.portcullis.dev', 'portcullis') as { request: { userInfo: { username: string } } };
      review.request.userInfo = { ...review.request.userInfo, username };
      return review;
    };
    expect((await checked.post('/validate', as(own))).body.response).toMatchObject({ allowed: true });
    const other = await checked.post('/validate', as('system:serviceaccount:portcullis:intruder'));
    expect(other.body.response.allowed).toBe(false);
    expect(other.body.response.status.message).toBe('policy "require-labels": missing required label: team');
    expect(checked.logs.some((line) => line.includes('skip the policies when it writes them itself') && line.includes(own))).toBe(true);
  } finally {
    await checked.close();
  }
  // Without a user to check (the suite's host has no credentials that name one), it says so.
  expect(t.logs.some((line) => line.includes('cannot tell which username the apiserver gives this host'))).toBe(true);
});
