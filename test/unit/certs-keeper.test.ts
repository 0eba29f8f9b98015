// The in-cluster certificate: issuing and checking bundles, and the keeper's rules against an
// in-memory Secret with the apiserver's optimistic concurrency (409 on a stale resourceVersion).
import { X509Certificate } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { CertificateInvalidError, checkBundle, issueBundle, renewalTime, serviceDnsNames, type CertificateBundle, type CheckedBundle } from '../../host/src/certs/issue.ts';
import { CertificateKeeper, CertificateSecretError, type CertificateHooks } from '../../host/src/certs/keeper.ts';
import type { SecretApi, StoredSecret } from '../../host/src/certs/secret-store.ts';
import { createLogger } from '../../host/src/util/log.ts';
import { KubeApiError } from '../../host/src/webhooks/kube.ts';

const names = serviceDnsNames('portcullis', 'portcullis');
const DAY = 24 * 3600_000;

class FakeSecret implements SecretApi {
  readonly ref = 'portcullis/portcullis-tls';
  version = 1;
  bundle: CertificateBundle | undefined;
  rotateRequested = false;
  missing = false;
  writes = 0;
  events: string[] = [];
  /** Runs between a writer's read and its write, to simulate a racing replica. */
  beforeWrite: (() => void) | undefined;

  async read(): Promise<StoredSecret> {
    if (this.missing) throw new KubeApiError({ verb: 'get', resource: 'secrets', name: 'portcullis-tls', namespace: 'portcullis' }, 404, '404 Not Found', false);
    return { resourceVersion: String(this.version), bundle: this.bundle ? { ...this.bundle } : undefined, rotateRequested: this.rotateRequested };
  }

  async write(resourceVersion: string, bundle: CertificateBundle): Promise<StoredSecret> {
    const race = this.beforeWrite;
    this.beforeWrite = undefined;
    race?.();
    if (resourceVersion !== String(this.version)) throw new KubeApiError({ verb: 'update', resource: 'secrets', name: 'portcullis-tls', namespace: 'portcullis' }, 409, '409 Conflict', true);
    this.version++;
    this.writes++;
    this.bundle = { cert: bundle.cert, key: bundle.key, ca: bundle.ca };
    this.rotateRequested = false;
    this.events.push('secret written');
    return this.read();
  }
}

const quiet = () => createLogger('error', () => undefined);
const fingerprint = (pem: string) => new X509Certificate(pem).fingerprint256;

async function waitFor(what: string, probe: () => boolean, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!probe()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

function hooks(secret: FakeSecret, leader: { value: boolean }, publish = true): CertificateHooks & { served: CheckedBundle[]; published: string[] } {
  const served: CheckedBundle[] = [];
  const published: string[] = [];
  return {
    served, published,
    isLeader: () => leader.value,
    fence: async (what, write) => {
      if (!leader.value) throw new Error(`not the leader: not writing ${what}`);
      return write();
    },
    publishCa: async (ca) => {
      published.push(ca);
      secret.events.push('ca published');
      return publish;
    },
    serve: async (bundle) => {
      served.push(bundle);
      secret.events.push('served');
    },
  };
}

describe('issueBundle / checkBundle', () => {
  it('issues a CA-signed serving certificate for the Service names that checks out', async () => {
    const bundle = await issueBundle(names, 30);
    const checked = checkBundle(bundle, names);
    expect(checked.notAfter.getTime() - Date.now()).toBeGreaterThan(29 * DAY);
    const cert = new X509Certificate(bundle.cert);
    const ca = new X509Certificate(bundle.ca);
    expect(cert.verify(ca.publicKey)).toBe(true);
    expect(ca.ca).toBe(true);
    expect(cert.ca).toBe(false);
    expect(cert.checkHost('portcullis.portcullis.svc')).toBe('portcullis.portcullis.svc');
    // Renewal at two thirds of the lifetime: about 10 days before expiry for 30 days.
    expect(checked.notAfter.getTime() - renewalTime(checked).getTime()).toBeGreaterThan(9 * DAY);
  });

  it('refuses a key of another certificate, another CA, missing names, expiry and garbage', async () => {
    const a = await issueBundle(names, 30);
    const b = await issueBundle(names, 30);
    expect(() => checkBundle({ ...a, key: b.key }, names)).toThrow(/does not belong/);
    expect(() => checkBundle({ ...a, ca: b.ca }, names)).toThrow(/not signed by ca.crt/);
    expect(() => checkBundle(a, [...names, 'other.portcullis.svc'])).toThrow(/does not cover other.portcullis.svc/);
    expect(() => checkBundle(a, names, new Date(Date.now() + 31 * DAY))).toThrow(/expired/);
    expect(() => checkBundle({ ...a, cert: 'not a certificate' }, names)).toThrow(CertificateInvalidError);
    expect(() => checkBundle({ ...a, key: 'not a key' }, names)).toThrow(/not a usable private key/);
  });
});

describe('CertificateKeeper', () => {
  it('fills an empty Secret once; a second replica serves the same certificate', async () => {
    const secret = new FakeSecret();
    const first = await new CertificateKeeper({ secret, dnsNames: names, validityDays: 30, log: quiet() }).initial();
    const second = await new CertificateKeeper({ secret, dnsNames: names, validityDays: 30, log: quiet() }).initial();
    expect(secret.writes).toBe(1);
    expect(second.fingerprint).toBe(first.fingerprint);
  });

  it('two replicas racing on an empty Secret end up on the winner\'s certificate', async () => {
    const secret = new FakeSecret();
    const winner = await issueBundle(names, 30);
    // Another replica writes between this one's read and write: this write gets a 409.
    secret.beforeWrite = () => {
      secret.version++;
      secret.bundle = winner;
    };
    const got = await new CertificateKeeper({ secret, dnsNames: names, validityDays: 30, log: quiet() }).initial(10_000);
    expect(got.fingerprint).toBe(fingerprint(winner.cert));
    expect(secret.writes).toBe(0);
  });

  it('replaces data it cannot serve (garbage, wrong names) instead of failing', async () => {
    const secret = new FakeSecret();
    secret.bundle = { cert: 'garbage', key: 'garbage', ca: 'garbage' };
    const got = await new CertificateKeeper({ secret, dnsNames: names, validityDays: 30, log: quiet() }).initial();
    expect(secret.writes).toBe(1);
    expect(got.fingerprint).toBe(fingerprint(secret.bundle.cert));
    secret.bundle = await issueBundle(['someone-else.svc'], 30);
    await new CertificateKeeper({ secret, dnsNames: names, validityDays: 30, log: quiet() }).initial();
    expect(secret.writes).toBe(2);
  });

  it('a missing Secret is an error that says how to create it', async () => {
    const secret = new FakeSecret();
    secret.missing = true;
    const error = await new CertificateKeeper({ secret, dnsNames: names, validityDays: 30, log: quiet() }).initial(600).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(CertificateSecretError);
    expect((error as CertificateSecretError).code).toBe('CERTIFICATE_SECRET_UNUSABLE');
    expect((error as Error).message).toMatch(/portcullis\/portcullis-tls does not exist.*kubectl -n portcullis create secret generic portcullis-tls/);
  });

  it('a follower switches to what the Secret holds and never rotates, even when due', async () => {
    const secret = new FakeSecret();
    let now = new Date();
    const keeper = new CertificateKeeper({ secret, dnsNames: names, validityDays: 30, log: quiet(), pollMs: 10, now: () => now });
    await keeper.initial();
    const h = hooks(secret, { value: false });
    keeper.follow(h);
    const next = await issueBundle(names, 30);
    secret.bundle = next;
    secret.version++;
    await waitFor('the follower to serve the new certificate', () => h.served.length === 1);
    expect(h.served[0]!.fingerprint).toBe(fingerprint(next.cert));
    now = new Date(Date.now() + 25 * DAY);
    secret.rotateRequested = true;
    await new Promise((r) => setTimeout(r, 200));
    await keeper.stop();
    expect(secret.writes).toBe(1);
    expect(h.published).toEqual([]);
  });

  it('the leader rotates when due: publishes the new CA, then writes the Secret, then serves it', async () => {
    const secret = new FakeSecret();
    let now = new Date();
    const keeper = new CertificateKeeper({ secret, dnsNames: names, validityDays: 30, log: quiet(), pollMs: 10, now: () => now });
    const first = await keeper.initial();
    const h = hooks(secret, { value: true });
    keeper.follow(h);
    await new Promise((r) => setTimeout(r, 100));
    expect(h.published).toEqual([]);
    now = new Date(renewalTime(first).getTime() + 1000);
    await waitFor('a rotation', () => h.served.length === 1);
    await keeper.stop();
    expect(secret.events).toEqual(['secret written', 'ca published', 'secret written', 'served']);
    expect(h.published[0]).toBe(secret.bundle!.ca);
    expect(h.served[0]!.fingerprint).toBe(fingerprint(secret.bundle!.cert));
    expect(h.served[0]!.fingerprint).not.toBe(first.fingerprint);
    expect(keeper.current?.fingerprint).toBe(h.served[0]!.fingerprint);
  });

  it('the leader rotates on the rotate annotation and clears it', async () => {
    const secret = new FakeSecret();
    const keeper = new CertificateKeeper({ secret, dnsNames: names, validityDays: 30, log: quiet(), pollMs: 10 });
    await keeper.initial();
    const h = hooks(secret, { value: true });
    keeper.follow(h);
    secret.rotateRequested = true;
    await waitFor('a rotation', () => h.served.length === 1);
    await new Promise((r) => setTimeout(r, 100));
    await keeper.stop();
    expect(secret.rotateRequested).toBe(false);
    expect(secret.writes).toBe(2);
  });

  it('a rotation that loses a write race publishes the served CA again and serves on', async () => {
    const secret = new FakeSecret();
    const keeper = new CertificateKeeper({ secret, dnsNames: names, validityDays: 30, log: quiet(), pollMs: 10 });
    const first = await keeper.initial();
    const h = hooks(secret, { value: true });
    // Someone changes the Secret between the leader's read and its write (409), once.
    secret.beforeWrite = () => {
      secret.version++;
    };
    keeper.follow(h);
    secret.rotateRequested = true;
    await waitFor('the retried rotation', () => h.served.length === 1);
    await keeper.stop();
    // publish new CA -> write refused -> publish the served CA again -> next round rotates.
    expect(h.published[0]).not.toBe(first.ca);
    expect(h.published[1]).toBe(first.ca);
    expect(h.published[2]).toBe(secret.bundle!.ca);
    expect(h.served[0]!.fingerprint).toBe(fingerprint(secret.bundle!.cert));
  });

  it('does not write a new certificate whose CA could not be published', async () => {
    const secret = new FakeSecret();
    const keeper = new CertificateKeeper({ secret, dnsNames: names, validityDays: 30, log: quiet(), pollMs: 10 });
    const first = await keeper.initial();
    const h = hooks(secret, { value: true }, false);
    keeper.follow(h);
    secret.rotateRequested = true;
    await waitFor('a publication attempt', () => h.published.length >= 4);
    await keeper.stop();
    // Every failed attempt is followed by publishing the served CA again.
    expect(h.published.filter((_, i) => i % 2 === 1).every((ca) => ca === first.ca)).toBe(true);
    expect(h.published[0]).not.toBe(first.ca);
    expect(secret.writes).toBe(1);
    expect(h.served).toEqual([]);
    expect(fingerprint(secret.bundle!.cert)).toBe(first.fingerprint);
  });

  it('a leader whose lease lapses between publishing the CA and writing writes nothing (the fence)', async () => {
    const secret = new FakeSecret();
    const keeper = new CertificateKeeper({ secret, dnsNames: names, validityDays: 30, log: quiet(), pollMs: 10 });
    const first = await keeper.initial();
    const leader = { value: true };
    const h = hooks(secret, leader);
    // isLeader still says yes (as of the last round), but the fence, checked at the write, says no.
    h.fence = async (what) => {
      throw new Error(`not the leader: not writing ${what}`);
    };
    keeper.follow(h);
    secret.rotateRequested = true;
    await waitFor('the publication and its undo', () => h.published.length >= 2);
    await keeper.stop();
    expect(secret.writes).toBe(1);
    expect(h.published[1]).toBe(first.ca);
    expect(h.served).toEqual([]);
  });
});
