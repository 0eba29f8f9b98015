// A reload that removes a policy keeps answering it (its webhook may still be registered) until
// it retires; and a policy removed while a request's body is being read answers 404, not 500.
import { connect } from 'node:tls';
import { writeFile } from 'node:fs/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { admissionReview, policyYaml, startServer, type TestServer } from '../helpers/server.ts';

// cache: the reloads read these, and only a test about the cache prunes the shared one.
const both = `
cache: { maxMiB: 0 }
server: { tls: { mode: self-signed, hostnames: [127.0.0.1] } }
policies:
${policyYaml('require-labels', 'settings: { labels: { team: x } }')}${policyYaml('no-delete')}`;
const onlyNoDelete = `
cache: { maxMiB: 0 }
server: { tls: { mode: self-signed, hostnames: [127.0.0.1] } }
policies:
${policyYaml('no-delete')}`;
const configMap = () => admissionReview({ kind: 'ConfigMap', metadata: { name: 'p', labels: {} } });

describe('removed policies retire, not vanish', () => {
  let t: TestServer;
  beforeAll(async () => { t = await startServer(both); });
  afterAll(() => t.close());

  it('answers /validate/<removed> after the reload, and 404 once retired', async () => {
    await writeFile(t.configPath, onlyNoDelete);
    expect(await t.server.reload()).toBe(true);
    expect(t.server.registry.current.byName.has('require-labels')).toBe(false);
    const still = await t.post('/validate/require-labels', configMap());
    expect(still.status).toBe(200);
    expect(still.body.response).toMatchObject({ allowed: false, status: { message: 'policy "require-labels": missing required label: team' } });
    // Its webhook is gone (the manager says so after a sync, or the grace period ends).
    t.server.registry.retire();
    const gone = await t.post('/validate/require-labels', configMap());
    expect(gone.status).toBe(404);
    expect(gone.body).toMatchObject({ error: { code: 'UNKNOWN_POLICY', message: 'no policy named "require-labels" is configured' } });
  });

  it('a policy that disappears while its body is still being read answers 404, not 500', async () => {
    await writeFile(t.configPath, both);
    expect(await t.server.reload()).toBe(true);
    t.server.registry.retire();
    const body = JSON.stringify(configMap());
    const { port } = t.server.address;
    const socket = connect({ host: '127.0.0.1', port, rejectUnauthorized: false });
    await new Promise<void>((resolve) => socket.once('secureConnect', () => resolve()));
    let response = '';
    socket.on('data', (chunk: Buffer) => (response += chunk.toString()));
    const closed = new Promise<void>((resolve) => socket.once('close', () => resolve()));
    // Headers and half the body: the HTTP layer's early check passes while the policy is still there.
    socket.write(`POST /validate/require-labels HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n`);
    socket.write(body.slice(0, 20));
    await new Promise((r) => setTimeout(r, 200));
    await writeFile(t.configPath, onlyNoDelete);
    expect(await t.server.reload()).toBe(true);
    t.server.registry.retire();
    socket.write(body.slice(20));
    await closed;
    expect(response).toMatch(/^HTTP\/1\.1 404 /);
    expect(response).toContain('UNKNOWN_POLICY');
  });
});

describe('when a removed policy stops being answered', () => {
  const managed = (yaml: string) => yaml.replace('server:', 'webhooks: { managed: portcullis.example.com, url: "https://127.0.0.1:1" }\nserver:');

  it('without managed webhooks: after the grace period', async () => {
    const t = await startServer(both, { retireGraceMs: 100 });
    try {
      await writeFile(t.configPath, onlyNoDelete);
      expect(await t.server.reload()).toBe(true);
      await new Promise((r) => setTimeout(r, 400));
      expect((await t.post('/validate/require-labels', configMap())).status).toBe(404);
    } finally {
      await t.close();
    }
  });

  it('with managed webhooks: not on a timer, only once a sync has removed its webhook', async () => {
    // Red team: a sync that failed left the Fail webhook registered while the host answered 404
    // after 30 s, so every request it covered was denied. No manager runs here: no sync succeeds.
    const t = await startServer(managed(both), { retireGraceMs: 100 });
    try {
      await writeFile(t.configPath, managed(onlyNoDelete));
      expect(await t.server.reload()).toBe(true);
      await new Promise((r) => setTimeout(r, 400));
      expect((await t.post('/validate/require-labels', configMap())).status).toBe(200);
      t.server.retireRemovedPolicies(performance.now(), 0);
      await new Promise((r) => setTimeout(r, 50));
      expect(t.server.registry.lookup('require-labels', 'validate')).toBeUndefined();
    } finally {
      await t.close();
    }
  });

  it('with managed webhooks, a policy this replica does not have is allowed with a warning, not 404', async () => {
    // Red team: mid-rollout, replicas without a Fail policy the leader registered (added there,
    // or removed here) answered 404, and the apiserver denied every request it covered.
    const t = await startServer(managed(onlyNoDelete));
    try {
      for (const path of ['/validate/require-labels', '/mutate/no-delete', '/validate/never-configured']) {
        const res = await t.post(path, configMap());
        expect(res.status, path).toBe(200);
        expect(res.body.response).toMatchObject({ allowed: true, warnings: [expect.stringMatching(/is not configured on this webhook replica, so it was not evaluated/)] });
      }
      expect(t.logs.some((l) => l.includes('a webhook called a policy this replica does not have; allowed'))).toBe(true);
      // A review that is not one is still refused.
      expect((await t.post('/validate/never-configured', '{"kind":"Pod"}')).status).toBe(400);
    } finally {
      await t.close();
    }
  });
});
