// Two replicas against one apiserver: only the Lease holder writes; a graceful exit hands over
// at once (released lease), a crash after the lease expires; a replica that loses the lease
// stops writing. Each host has its own url, so the configuration shows who manages it.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  getObject, getValidating, HOST_NAMESPACE, kubectl, kubectlOk, leaderIdentity, policy, prepareNamespaces, removeWebhookConfigurations, startHost,
  stopAllHosts, waitFor, type Host,
} from './helpers.ts';

const NAME = 'leader.e2e.dev';
const policies = [policy('require-labels', { modes: ['validate'], failurePolicy: 'Ignore', settings: { labels: { team: 'x' } }, rules: [{ operations: ['CREATE'], apiGroups: [''], apiVersions: ['v1'], resources: ['configmaps'] }] })];

interface Lease {
  metadata: { resourceVersion: string };
  spec: { holderIdentity?: string; leaseDurationSeconds: number; leaseTransitions: number; renewTime: string; acquireTime: string };
}
const lease = async () => (await getObject<Lease>('lease', NAME, HOST_NAMESPACE))!;
const managedBy = async (host: Host) => (await getValidating(NAME))?.webhooks?.[0]?.clientConfig.url?.startsWith(host.url) === true;

beforeAll(async () => {
  await removeWebhookConfigurations();
  await prepareNamespaces();
});

afterAll(async () => {
  await stopAllHosts();
  await removeWebhookConfigurations();
});

describe('leader election on a Lease', () => {
  let a: Host;
  let b: Host;

  it('lets only the first replica manage', async () => {
    a = await startHost({ managed: NAME, policies });
    await waitFor('A to manage', () => managedBy(a));
    b = await startHost({ managed: NAME, policies });
    // Three renewal periods (1 s each): B keeps reading a live lease and never writes.
    await new Promise((r) => setTimeout(r, 3_500));
    expect(await managedBy(a)).toBe(true);
    expect(b.output()).not.toMatch(/became the leader/);
    const held = await lease();
    expect(held.spec.holderIdentity).toBe(leaderIdentity(a));
    expect(held.spec.leaseDurationSeconds).toBe(3);
    expect(Date.now() - Date.parse(held.spec.renewTime)).toBeLessThan(3_000);
  });

  it('hands over at once when the leader exits gracefully', async () => {
    const transitions = (await lease()).spec.leaseTransitions;
    const stopped = Date.now();
    const exited = a.stop('SIGTERM');
    await waitFor('B to take over', () => managedBy(b), 10_000, 100);
    // A released the lease: B took it at its next round, well before the 3 s lease could expire,
    // while A still answers reviews for its shutdown delay (server.shutdownDelayMs).
    expect(Date.now() - stopped).toBeLessThan(3_000);
    expect(await exited).toBe(0);
    const taken = await lease();
    expect(taken.spec.holderIdentity).toBe(leaderIdentity(b));
    expect(taken.spec.leaseTransitions).toBe(transitions + 1);
    expect(a.output()).toMatch(/released the lease/);
  });

  it('takes over from a crashed leader once its lease expires', async () => {
    a = await startHost({ managed: NAME, policies });
    await new Promise((r) => setTimeout(r, 1_500));
    expect(a.output()).not.toMatch(/became the leader/);
    const killed = Date.now();
    await b.stop('SIGKILL');
    await waitFor('A to take over', () => managedBy(a), 15_000, 100);
    // Not before the lease ran out: 3 s unchanged as A's own clock measures it, counted from
    // B's last renewal, which can be up to one renew period (1 s) before the kill.
    expect(Date.now() - killed).toBeGreaterThanOrEqual(1_900);
    expect((await lease()).spec.holderIdentity).toBe(leaderIdentity(a));
  });

  it('stops writing when another holder takes the lease, and resumes once it is free', async () => {
    // Someone else (say, a replica that could reach the apiserver when A could not) holds it
    // now. A renews every second, so the write may race with A's: retry on conflict.
    await waitFor('the lease to be stolen', async () => {
      const current = await lease();
      const stolen = {
        apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', metadata: { name: NAME, namespace: HOST_NAMESPACE, resourceVersion: current.metadata.resourceVersion },
        spec: { ...current.spec, holderIdentity: 'intruder', leaseDurationSeconds: 600, renewTime: new Date().toISOString().replace('Z', '000Z'), leaseTransitions: current.spec.leaseTransitions + 1 },
      };
      return (await kubectl(['replace', '-f', '-'], { input: JSON.stringify(stolen) })).code === 0;
    }, 10_000, 50);
    await a.waitForLog(/lost the lease; no longer writing/, 10_000);
    const before = (await getValidating(NAME))!.metadata.resourceVersion;
    await a.rewrite((config) => {
      (config.policies as { failurePolicy: string }[])[0]!.failurePolicy = 'Fail';
    });
    await a.waitForLog(/configuration reloaded/, 10_000);
    await new Promise((r) => setTimeout(r, 1_500));
    expect((await getValidating(NAME))!.metadata.resourceVersion).toBe(before);
    // The intruder releases: A acquires again and applies what it missed.
    const stolen = await lease();
    await kubectlOk(['replace', '-f', '-'], {
      input: JSON.stringify({ apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', metadata: { name: NAME, namespace: HOST_NAMESPACE, resourceVersion: stolen.metadata.resourceVersion }, spec: { ...stolen.spec, holderIdentity: '' } }),
    });
    await waitFor('A to lead again and apply the reload', async () => (await getValidating(NAME))?.webhooks?.[0]?.failurePolicy === 'Fail', 10_000);
    expect((await lease()).spec.holderIdentity).toBe(leaderIdentity(a));
    expect(await a.stop('SIGTERM')).toBe(0);
    expect(await getValidating(NAME)).toBeUndefined();
  });
});

describe('a leader frozen past its lease (split brain)', () => {
  it('writes nothing when it resumes: the configurations keep the new leader\'s URL and CA', async () => {
    await removeWebhookConfigurations();
    // A resync every 2 s: by the time A resumes, its resync timer is due and fires at once.
    const a = await startHost({ managed: NAME, policies, webhooks: { resyncSeconds: 2 } });
    await waitFor('A to manage', () => managedBy(a));
    const b = await startHost({ managed: NAME, policies });
    await new Promise((r) => setTimeout(r, 1_500));
    a.child.kill('SIGSTOP');
    try {
      await waitFor('B to take over from the frozen A', () => managedBy(b), 20_000, 100);
      // While A is frozen, its configuration changes: the reload (and its timers) run the moment it resumes.
      await a.rewrite((config) => {
        (config.policies as { failurePolicy: string }[])[0]!.failurePolicy = 'Fail';
      });
      await new Promise((r) => setTimeout(r, 1_000));
      const before = (await getValidating(NAME))!;
      a.child.kill('SIGCONT');
      await a.waitForLog(/configuration reloaded/, 15_000);
      await new Promise((r) => setTimeout(r, 3_000));
      const after = (await getValidating(NAME))!;
      expect(after.metadata.resourceVersion).toBe(before.metadata.resourceVersion);
      expect(after.webhooks?.[0]?.clientConfig.url?.startsWith(b.url)).toBe(true);
      expect(after.webhooks?.[0]?.clientConfig.caBundle).toBe(before.webhooks?.[0]?.clientConfig.caBundle);
      expect(after.webhooks?.[0]?.failurePolicy).toBe('Ignore');
      expect((await lease()).spec.holderIdentity).toBe(leaderIdentity(b));
    } finally {
      a.child.kill('SIGCONT');
      await a.stop('SIGKILL');
      await b.stop('SIGTERM');
    }
  });
});

describe('a replica that does not lead, on exit', () => {
  const BLOCKER = 'lease-blocker.e2e.dev';
  afterAll(() => kubectl(['delete', 'validatingwebhookconfiguration', BLOCKER, '--ignore-not-found']));

  it('leaves the configurations to the leader', async () => {
    await removeWebhookConfigurations();
    const a = await startHost({ managed: NAME, policies });
    await waitFor('A to manage', () => managedBy(a));
    const b = await startHost({ managed: NAME, policies });
    await new Promise((r) => setTimeout(r, 1_500));
    expect(await b.stop('SIGTERM')).toBe(0);
    expect(b.output()).toMatch(/left to the replicas still running/);
    expect(await managedBy(a)).toBe(true);
    expect(await a.stop('SIGTERM')).toBe(0);
    expect(await getValidating(NAME)).toBeUndefined();
  });

  it('removes them when the Lease still names it and nobody took over: a host whose renewals failed does not leave its webhooks behind', async () => {
    await removeWebhookConfigurations();
    const a = await startHost({ managed: NAME, policies: [policy('require-labels', { modes: ['validate'], failurePolicy: 'Fail', settings: { labels: { team: 'x' } }, rules: [{ operations: ['CREATE'], apiGroups: [''], apiVersions: ['v1'], resources: ['configmaps'] }] })] });
    await waitFor('A to manage', () => managedBy(a));
    // Another webhook, which nobody serves, refuses every update of a Lease in the host's
    // namespace: A's renewals fail, as when a policy denied them (outsider run on 1.20).
    await kubectlOk(['apply', '-f', '-'], {
      input: JSON.stringify({
        apiVersion: 'admissionregistration.k8s.io/v1', kind: 'ValidatingWebhookConfiguration', metadata: { name: BLOCKER },
        webhooks: [{
          name: `block.${BLOCKER}`, clientConfig: { url: 'https://127.0.0.1:1/block' }, failurePolicy: 'Fail', sideEffects: 'None', admissionReviewVersions: ['v1'], timeoutSeconds: 2,
          rules: [{ operations: ['UPDATE'], apiGroups: ['coordination.k8s.io'], apiVersions: ['v1'], resources: ['leases'] }],
          namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': HOST_NAMESPACE } },
        }],
      }),
    });
    await a.waitForLog(/lost the lease; no longer writing/, 20_000);
    expect((await lease()).spec.holderIdentity).toBe(leaderIdentity(a));
    expect(await getValidating(NAME)).toBeDefined();
    expect(await a.stop('SIGTERM')).toBe(0);
    expect(a.output()).toMatch(/still holds the lease but could not renew it, and no replica took over; removing the webhooks of non-persistent policies as the last one out/);
    expect(await getValidating(NAME)).toBeUndefined();
  });
});
