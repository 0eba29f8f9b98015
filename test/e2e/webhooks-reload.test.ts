// Removing or adding a `failurePolicy: Fail` policy by hot reload, under a steady stream of
// requests it covers, through the real apiserver: not one request fails. The removed policy is
// answered until its webhook is gone from the cluster; an added one is served before its
// webhook appears. A replica leaving on SIGTERM is answered through its shutdown delay.
import { readFile } from 'node:fs/promises';
import { Agent, request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  getValidating, kubeconfig, policy, prepareNamespaces, removeWebhookConfigurations, startHost, stopAllHosts, waitFor, WORK_NAMESPACE, type Host,
} from './helpers.ts';

const NAME = 'reload.e2e.dev';
const labels = policy('require-labels', {
  modes: ['validate'], failurePolicy: 'Fail', settings: { labels: { team: 'x' } },
  rules: [{ operations: ['CREATE'], apiGroups: [''], apiVersions: ['v1'], resources: ['configmaps'] }],
});
const noDelete = policy('no-delete', { failurePolicy: 'Fail' });

let server: string;
let token: string;
const agent = new Agent({ connect: { rejectUnauthorized: false }, connections: 8 });

beforeAll(async () => {
  await removeWebhookConfigurations();
  await prepareNamespaces();
  const text = await readFile(kubeconfig(), 'utf8');
  server = /server: "?([^"\s}]+)"?/.exec(text)![1]!;
  token = /token: "?([^"\s}]+)"?/.exec(text)![1]!;
});
afterAll(async () => {
  await stopAllHosts();
  await removeWebhookConfigurations();
  await agent.close();
});

/** Dry-run creates of a labelled ConfigMap (allowed by the policy) as fast as 4 clients can, until stopped. */
function stream(): { stop: () => Promise<{ sent: number; failures: string[] }> } {
  let running = true;
  let sent = 0;
  const failures: string[] = [];
  const body = JSON.stringify({ apiVersion: 'v1', kind: 'ConfigMap', metadata: { generateName: 'reload-', labels: { team: 'x' } } });
  const client = async () => {
    while (running) {
      sent++;
      const res = await request(`${server}/api/v1/namespaces/${WORK_NAMESPACE}/configmaps?dryRun=All`, {
        method: 'POST', dispatcher: agent, body, headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
      });
      const text = await res.body.text();
      if (res.statusCode !== 201) failures.push(`${res.statusCode} ${text.slice(0, 300)}`);
    }
  };
  const clients = [client(), client(), client(), client()];
  return { stop: async () => { running = false; await Promise.all(clients); return { sent, failures }; } };
}

const hasWebhook = async (name: string) => ((await getValidating(NAME))?.webhooks ?? []).some((w) => w.name === `${name}.${NAME}`);

describe('hot reload under a stream of requests (failurePolicy Fail)', () => {
  let host: Host;

  it('removing a policy fails no request: it is answered until its webhook is gone', async () => {
    host = await startHost({ managed: NAME, policies: [labels, noDelete] });
    await waitFor('the webhook of require-labels', () => hasWebhook('require-labels'));
    const load = stream();
    await new Promise((r) => setTimeout(r, 1_000));
    await host.rewrite((config) => {
      config.policies = [noDelete];
    });
    await waitFor('the webhook of require-labels to be removed', async () => !(await hasWebhook('require-labels')), 20_000);
    await host.waitForLog(/stopped answering removed policies; their webhooks are gone/, 20_000);
    await new Promise((r) => setTimeout(r, 1_000));
    const { sent, failures } = await load.stop();
    expect(failures).toEqual([]);
    expect(sent).toBeGreaterThan(50);
  });

  it('adding a policy fails no request: it is served before its webhook appears', async () => {
    const load = stream();
    await new Promise((r) => setTimeout(r, 1_000));
    await host.rewrite((config) => {
      config.policies = [noDelete, labels];
    });
    await waitFor('the webhook of require-labels to be added', () => hasWebhook('require-labels'), 20_000);
    await new Promise((r) => setTimeout(r, 2_000));
    const { sent, failures } = await load.stop();
    expect(failures).toEqual([]);
    expect(sent).toBeGreaterThan(50);
    expect(await host.stop('SIGTERM')).toBe(0);
  });
});

describe('a replica leaving (SIGTERM) under a stream of requests (failurePolicy Fail)', () => {
  it('fails no request during its shutdown delay: the apiserver is answered on the connections it keeps and the ones it opens', async () => {
    // Persistent, so the webhook stays and the apiserver goes on calling this host while it leaves.
    const kept = policy('require-labels', {
      modes: ['validate'], failurePolicy: 'Fail', persistent: true, settings: { labels: { team: 'x' } },
      rules: [{ operations: ['CREATE'], apiGroups: [''], apiVersions: ['v1'], resources: ['configmaps'] }],
    });
    const host = await startHost({ managed: NAME, policies: [kept], server: { shutdownDelayMs: 4000 } });
    await waitFor('the webhook of require-labels', () => hasWebhook('require-labels'));
    const load = stream();
    await new Promise((r) => setTimeout(r, 1_000));
    const exited = host.stop('SIGTERM');
    await host.waitForLog(/"msg":"shutting down","signal":"SIGTERM","drainMs":4000/);
    // With shutdownDelayMs 0 (the listener closed at once, as before) calls here fail with EOF
    // or connection refused.
    await new Promise((r) => setTimeout(r, 3_000));
    const { sent, failures } = await load.stop();
    expect(failures).toEqual([]);
    expect(sent).toBeGreaterThan(50);
    expect(host.output()).toMatch(/released the lease/);
    expect(await exited).toBe(0);
  });
});
