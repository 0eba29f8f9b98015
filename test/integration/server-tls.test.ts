// TLS modes: self-signed (with cadump), certificate files (rotated live), plain HTTP only on
// request, and client-certificate verification that reaches policies as `sslpeer`.
import { execFileSync } from 'node:child_process';
import { createPrivateKey, X509Certificate } from 'node:crypto';
import { chmod, chown, lstat, mkdtemp, readdir, readFile, rename, rm, stat, symlink, utimes, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import { generate } from 'selfsigned';
import { Agent, request } from 'undici';
import { afterEach, describe, expect, it, onTestFinished } from 'vitest';
import { keptSelfSigned, selfSigned } from '../../host/src/server/tls.ts';
import { admissionReview, policyYaml, startServer, type TestServer } from '../helpers/server.ts';

const showAuth = policyYaml('show-auth');
let servers: TestServer[] = [];
afterEach(async () => {
  await Promise.all(servers.map((s) => s.close()));
  servers = [];
});
async function start(yaml: string): Promise<TestServer> {
  const s = await startServer(yaml);
  servers.push(s);
  return s;
}

async function peerSubject(url: string, agent: Agent): Promise<string[]> {
  const res = await request(`${url}/validate/show-auth`, { method: 'POST', dispatcher: agent, headers: { 'content-type': 'application/json' }, body: JSON.stringify(admissionReview({ kind: 'ConfigMap', metadata: { name: 'x' } })) });
  return (JSON.parse(await res.body.text()) as { response: { warnings: string[] } }).response.warnings;
}

describe('self-signed', () => {
  it('serves a certificate for the configured names, verifiable with the dumped CA', async () => {
    const t = await start(`server: { tls: { mode: self-signed, hostnames: [127.0.0.1, localhost], cadump: ca.pem } }\npolicies:\n${showAuth}`);
    const ca = await readFile(join(t.dir, 'ca.pem'), 'utf8');
    expect(ca).toBe(t.server.tls!.caBundle);
    // Its own trust anchor, and no CA: its key cannot sign a certificate for anything else.
    expect(new X509Certificate(ca).ca).toBe(false);
    const trusting = new Agent({ connect: { ca } });
    expect((await request(`${t.server.url}/healthz`, { dispatcher: trusting })).statusCode).toBe(200);
    await trusting.close();
    const untrusting = new Agent();
    await expect(request(`${t.server.url}/healthz`, { dispatcher: untrusting })).rejects.toThrow(/self.signed|unable to verify|certificate/i);
    await untrusting.close();
  });
});

describe('the kept development certificate', () => {
  const names = ['127.0.0.1', 'localhost'];
  const fingerprint = (pem: string) => new X509Certificate(pem).fingerprint256;
  const DAY = 24 * 3600 * 1000;

  it('is made once, readable only by this user, and reused while it serves the same names and has a month left', async () => {
    const folder = await mkdtemp(join(tmpdir(), 'portcullis-kept-'));
    onTestFinished(() => rm(folder, { recursive: true, force: true }));
    const first = await keptSelfSigned(names, join(folder, 'tls'));
    const file = first.origin.keptIn!;
    expect(file).toMatch(/\/tls\/self-signed-[0-9a-f]{16}\.pem$/);
    expect((await stat(file)).mode & 0o777).toBe(0o600);
    expect((await stat(join(folder, 'tls'))).mode & 0o777).toBe(0o700);
    const again = await keptSelfSigned(names, join(folder, 'tls'));
    expect(again.origin).toEqual({ reusedFrom: file });
    expect(fingerprint(again.material.cert)).toBe(fingerprint(first.material.cert));
    expect(new X509Certificate(again.material.cert).checkPrivateKey(createPrivateKey(again.material.key))).toBe(true);
    expect(again.material.caBundle).toBe(again.material.cert);
    // The same names in another order, or case: the same file.
    expect((await keptSelfSigned(['LOCALHOST', '127.0.0.1'], join(folder, 'tls'))).origin).toEqual({ reusedFrom: file });
    // Other names: a certificate of their own, in a file of their own.
    const other = await keptSelfSigned(['10.1.2.3'], join(folder, 'tls'));
    expect(other.origin.keptIn).not.toBe(file);
    expect(new X509Certificate(other.material.cert).checkIP('10.1.2.3')).toBe('10.1.2.3');
    // 31 days before it expires it is still used; 29 days before, a new one replaces it.
    const validTo = new Date(new X509Certificate(first.material.cert).validTo).getTime();
    expect((await keptSelfSigned(names, join(folder, 'tls'), new Date(validTo - 31 * DAY))).origin).toEqual({ reusedFrom: file });
    const renewed = await keptSelfSigned(names, join(folder, 'tls'), new Date(validTo - 29 * DAY));
    expect(renewed.origin).toEqual({ keptIn: file, replaced: true });
    expect(fingerprint(renewed.material.cert)).not.toBe(fingerprint(first.material.cert));
    expect(fingerprint((await keptSelfSigned(names, join(folder, 'tls'))).material.cert)).toBe(fingerprint(renewed.material.cert));
  });

  it('is made anew when others may read it, another user owns it, it is damaged, its key is another\'s, or it is a FIFO; a folder that cannot be written costs only the reuse', async () => {
    const folder = await mkdtemp(join(tmpdir(), 'portcullis-kept-'));
    onTestFinished(() => rm(folder, { recursive: true, force: true }));
    const kept = join(folder, 'tls');
    const { origin: { keptIn: file } } = await keptSelfSigned(names, kept);
    const current = async () => fingerprint((await readFile(file!, 'utf8')).replace(/^[\s\S]*?(?=-----BEGIN CERTIFICATE)/, ''));
    const expectMadeAnew = async (before: string) => {
      const next = await keptSelfSigned(names, kept);
      expect(next.origin).toEqual({ keptIn: file, replaced: true });
      expect(fingerprint(next.material.cert)).not.toBe(before);
      expect(await current()).toBe(fingerprint(next.material.cert));
      expect((await stat(file!)).mode & 0o777).toBe(0o600);
    };
    await chmod(file!, 0o640);
    await expectMadeAnew(await current());
    if (process.getuid?.() === 0) {
      await chown(file!, 4242, 4242);
      await expectMadeAnew(await current());
    }
    let before = await current();
    await writeFile(file!, 'not PEM at all', { mode: 0o600 });
    await expectMadeAnew(before);
    // The certificate with another certificate's key.
    const stranger = await selfSigned(names);
    before = await current();
    await writeFile(file!, `${stranger.key}${(await readFile(file!, 'utf8')).replace(/^[\s\S]*?(?=-----BEGIN CERTIFICATE)/, '')}`, { mode: 0o600 });
    await expectMadeAnew(before);
    // A link to a kept file is not followed, and is replaced by a file.
    before = await current();
    await rename(file!, join(kept, 'elsewhere.pem'));
    await symlink(join(kept, 'elsewhere.pem'), file!);
    await expectMadeAnew(before);
    expect((await lstat(file!)).isFile()).toBe(true);
    // Larger than a key and a certificate could be.
    before = await current();
    await writeFile(file!, `${await readFile(file!, 'utf8')}${'#'.repeat(17 * 1024)}\n`, { mode: 0o600 });
    await expectMadeAnew(before);
    // A CA, as an earlier build kept: replaced by one that cannot sign other certificates.
    const authority = await generate([{ name: 'commonName', value: '127.0.0.1' }], {
      keyType: 'ec', curve: 'P-256', algorithm: 'sha256', notAfterDate: new Date(Date.now() + 300 * 24 * 3600 * 1000),
      extensions: [{ name: 'basicConstraints', cA: true, critical: true }, { name: 'keyUsage', keyCertSign: true, digitalSignature: true },
        { name: 'subjectAltName', altNames: [{ type: 7, ip: '127.0.0.1' }, { type: 2, value: 'localhost' }] }],
    });
    await writeFile(file!, `${authority.private.trimEnd()}\n${authority.cert.trimEnd()}\n`, { mode: 0o600 });
    await expectMadeAnew(fingerprint(authority.cert));
    expect(new X509Certificate((await keptSelfSigned(names, kept)).material.cert).ca).toBe(false);
    // A FIFO is not waited on.
    await rm(file!);
    execFileSync('mkfifo', ['-m', '600', file!]);
    const fromFifo = await keptSelfSigned(names, kept);
    expect(fromFifo.origin).toEqual({ keptIn: file, replaced: true });
    expect((await stat(file!)).isFile()).toBe(true);
    // A folder others may change: its file is not trusted, and nothing is written there.
    before = await current();
    await chmod(kept, 0o777);
    const shared = await keptSelfSigned(names, kept);
    expect(shared.origin).toEqual({});
    expect(fingerprint(shared.material.cert)).not.toBe(before);
    expect(await current()).toBe(before);
    await chmod(kept, 0o700);
    // The folder is a file: nothing kept, a certificate all the same.
    await writeFile(join(folder, 'plain'), '');
    const unkept = await keptSelfSigned(names, join(folder, 'plain', 'tls'));
    expect(unkept.origin).toEqual({});
    expect(new X509Certificate(unkept.material.cert).checkHost('localhost')).toBe('localhost');
  });

  it('two starts at once agree on the one kept', async () => {
    const folder = await mkdtemp(join(tmpdir(), 'portcullis-kept-'));
    onTestFinished(() => rm(folder, { recursive: true, force: true }));
    const [a, b] = await Promise.all([keptSelfSigned(names, folder), keptSelfSigned(names, folder)]);
    expect(fingerprint(a.material.cert)).toBe(fingerprint(b.material.cert));
    const file = a.origin.keptIn ?? a.origin.reusedFrom!;
    expect([a.origin, b.origin]).toEqual(expect.arrayContaining([{ keptIn: file }, { reusedFrom: file }]));
    expect(fingerprint((await readFile(file, 'utf8')).replace(/^[\s\S]*?(?=-----BEGIN CERTIFICATE)/, ''))).toBe(fingerprint(a.material.cert));
  });

  it('a temporary key file left by a start that crashed is removed by the next start once it is a minute old', async () => {
    const folder = await mkdtemp(join(tmpdir(), 'portcullis-kept-'));
    onTestFinished(() => rm(folder, { recursive: true, force: true }));
    await chmod(folder, 0o700);
    const stale = join(folder, 'self-signed-0123456789abcdef.pem.8d3c0c4e-58f5-4f5e-9a0e-3f1f6b2d1c11.tmp');
    const fresh = join(folder, 'self-signed-0123456789abcdef.pem.0f1e2d3c-4b5a-4968-8776-655443322110.tmp');
    const unrelated = join(folder, 'notes.tmp');
    for (const path of [stale, fresh, unrelated]) await writeFile(path, 'a key', { mode: 0o600 });
    const twoMinutesAgo = new Date(Date.now() - 120_000);
    for (const path of [stale, unrelated]) await utimes(path, twoMinutesAgo, twoMinutesAgo);
    const kept = await keptSelfSigned(names, folder);
    // One start in the folder, with or without a certificate to reuse: the stale one is gone.
    expect((await readdir(folder)).sort()).toEqual([basename(kept.origin.keptIn!), basename(fresh), 'notes.tmp'].sort());
    await writeFile(stale, 'a key', { mode: 0o600 });
    await utimes(stale, twoMinutesAgo, twoMinutesAgo);
    expect((await keptSelfSigned(names, folder)).origin).toEqual({ reusedFrom: kept.origin.keptIn });
    expect(await readdir(folder)).not.toContain(basename(stale));
  });

  it('serve keeps it: a second start presents the same certificate and says where it was kept', async () => {
    // A cache of its own (the real one is the developer's): an AssemblyScript policy needs no transpiling there.
    const cache = await mkdtemp(join(tmpdir(), 'portcullis-kept-cache-'));
    const saved = process.env.PORTCULLIS_CACHE;
    process.env.PORTCULLIS_CACHE = cache;
    onTestFinished(async () => {
      if (saved === undefined) delete process.env.PORTCULLIS_CACHE;
      else process.env.PORTCULLIS_CACHE = saved;
      await rm(cache, { recursive: true, force: true });
    });
    const yaml = `server: { tls: { mode: self-signed, hostnames: [127.0.0.1, localhost] } }\npolicies:\n${policyYaml('no-delete')}`;
    const one = await start(yaml);
    const oneLine = one.logs.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.msg === 'TLS');
    expect(oneLine?.source).toBe(`generated at start for 127.0.0.1, localhost (development only); kept in ${cache}/tls/${(await readdir(join(cache, 'tls')))[0]} for the next start`);
    const two = await start(yaml);
    expect(fingerprint(two.server.tls!.cert)).toBe(fingerprint(one.server.tls!.cert));
    const tlsLine = two.logs.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.msg === 'TLS');
    expect(tlsLine?.source).toMatch(/^kept from an earlier start for 127\.0\.0\.1, localhost \(development only; delete \S+\/tls\/self-signed-[0-9a-f]{16}\.pem for a new one\)$/);
  });
});

describe('certificate files', () => {
  it('a certificate and key written one after the other, or a certificate its CA file does not verify, keep the current one', async () => {
    // Red team: a reload that saw the new certificate with the old key crashed the host (its Fail
    // webhooks left behind); one from another CA was served silently (apiserver: x509 errors).
    const certDir = await mkdtemp(join(tmpdir(), 'portcullis-certs-'));
    onTestFinished(() => rm(certDir, { recursive: true, force: true }));
    const ca = await generate([{ name: 'commonName', value: 'ca-one' }], { keyType: 'ec', curve: 'P-256', algorithm: 'sha256', extensions: [{ name: 'basicConstraints', cA: true }, { name: 'keyUsage', keyCertSign: true, digitalSignature: true }] });
    const leaf = (signer: { private: string; cert: string }) => generate([{ name: 'commonName', value: '127.0.0.1' }], {
      keyType: 'ec', curve: 'P-256', algorithm: 'sha256', ca: { key: signer.private, cert: signer.cert }, extensions: [{ name: 'subjectAltName', altNames: [{ type: 7, ip: '127.0.0.1' }] }],
    });
    const first = await leaf(ca);
    await writeFile(join(certDir, 'tls.crt'), first.cert);
    await writeFile(join(certDir, 'tls.key'), first.private);
    await writeFile(join(certDir, 'ca.crt'), ca.cert);
    const t = await start(`server: { tls: { certFile: ${certDir}/tls.crt, keyFile: ${certDir}/tls.key, caFile: ${certDir}/ca.crt } }\npolicies:\n${showAuth}`);
    const reloadFailures = () => t.logs.filter((l) => l.includes('TLS certificate reload failed; keeping the current one'));
    const waitFor = async (what: () => boolean) => {
      for (let i = 0; i < 60 && !what(); i++) await new Promise((r) => setTimeout(r, 100));
    };
    // Same CA, new pair, written in two steps with a poll in between.
    const second = await leaf(ca);
    await writeFile(join(certDir, 'tls.crt'), second.cert);
    await waitFor(() => reloadFailures().length > 0);
    expect(reloadFailures().at(-1)).toContain('the key does not belong to the certificate');
    expect(t.server.tls?.cert).toBe(first.cert);
    await writeFile(join(certDir, 'tls.key'), second.private);
    await waitFor(() => t.server.tls?.cert === second.cert);
    expect(t.server.tls?.cert).toBe(second.cert);
    // Another CA, ca.crt unchanged: refused, and the current certificate still served.
    const other = await generate([{ name: 'commonName', value: 'ca-two' }], { keyType: 'ec', curve: 'P-256', algorithm: 'sha256', extensions: [{ name: 'basicConstraints', cA: true }, { name: 'keyUsage', keyCertSign: true, digitalSignature: true }] });
    const foreign = await leaf(other);
    const before = reloadFailures().length;
    await writeFile(join(certDir, 'tls.key'), foreign.private);
    await writeFile(join(certDir, 'tls.crt'), foreign.cert);
    await waitFor(() => reloadFailures().some((l, i) => i >= before && l.includes('does not verify the certificate')));
    expect(t.server.tls?.cert).toBe(second.cert);
    const trusting = new Agent({ connect: { ca: ca.cert } });
    expect((await request(`${t.server.url}/healthz`, { dispatcher: trusting })).statusCode).toBe(200);
    await trusting.close();
  }, 30_000);

  it('serves them and picks up a rotated certificate without dropping connections', async () => {
    const first = await selfSigned(['127.0.0.1']);
    const certDir = await mkdtemp(join(tmpdir(), 'portcullis-certs-'));
    onTestFinished(() => rm(certDir, { recursive: true, force: true }));
    await writeFile(join(certDir, 'tls.crt'), first.cert);
    await writeFile(join(certDir, 'tls.key'), first.key);
    const t = await start(`server: { tls: { certFile: ${certDir}/tls.crt, keyFile: ${certDir}/tls.key } }\npolicies:\n${showAuth}`);
    const both = await selfSigned(['127.0.0.1']);
    const agent = new Agent({ connect: { ca: [first.cert, both.cert] }, pipelining: 1, connections: 1 });
    const fingerprint = async () => {
      const res = await request(`${t.server.url}/healthz`, { dispatcher: agent, reset: true });
      await res.body.text();
      return res.statusCode;
    };
    expect(await fingerprint()).toBe(200);
    let published = '';
    t.server.onCertificate((tls) => { published = tls.caBundle; });
    // A long-lived keep-alive connection opened before the rotation must keep working.
    const keepAlive = new Agent({ connect: { ca: [first.cert, both.cert] }, connections: 1 });
    expect((await request(`${t.server.url}/healthz`, { dispatcher: keepAlive })).statusCode).toBe(200);
    await writeFile(join(certDir, 'tls.crt'), both.cert);
    await writeFile(join(certDir, 'tls.key'), both.key);
    for (let i = 0; i < 100 && t.server.tls?.cert !== both.cert; i++) await new Promise((r) => setTimeout(r, 100));
    expect(t.server.tls?.cert).toBe(both.cert);
    expect(published).toBe(both.cert);
    const fresh = new Agent({ connect: { ca: both.cert } });
    expect((await request(`${t.server.url}/healthz`, { dispatcher: fresh })).statusCode).toBe(200);
    const oldOnly = new Agent({ connect: { ca: first.cert } });
    await expect(request(`${t.server.url}/healthz`, { dispatcher: oldOnly })).rejects.toThrow();
    expect((await request(`${t.server.url}/healthz`, { dispatcher: keepAlive })).statusCode).toBe(200);
    await Promise.all([agent.close(), keepAlive.close(), fresh.close(), oldOnly.close()]);
  });

  it('refuses to start with a certificate the apiserver could not verify: from another CA than the CA file, or not for the name the webhooks call', async () => {
    // Red team: both were registered, /readyz said ready, and every call the apiserver made
    // failed with an x509 error (a replacement was already refused the same way).
    const certDir = await mkdtemp(join(tmpdir(), 'portcullis-certs-'));
    onTestFinished(() => rm(certDir, { recursive: true, force: true }));
    const authority = (name: string) => generate([{ name: 'commonName', value: name }], { keyType: 'ec', curve: 'P-256', algorithm: 'sha256', extensions: [{ name: 'basicConstraints', cA: true }, { name: 'keyUsage', keyCertSign: true, digitalSignature: true }] });
    const [one, two] = [await authority('ca-one'), await authority('ca-two')];
    const leaf = await generate([{ name: 'commonName', value: 'localhost' }], {
      keyType: 'ec', curve: 'P-256', algorithm: 'sha256', ca: { key: two.private, cert: two.cert }, extensions: [{ name: 'subjectAltName', altNames: [{ type: 2, value: 'localhost' }] }],
    });
    await writeFile(join(certDir, 'tls.crt'), leaf.cert);
    await writeFile(join(certDir, 'tls.key'), leaf.private);
    await writeFile(join(certDir, 'one.crt'), one.cert);
    await writeFile(join(certDir, 'two.crt'), two.cert);
    const files = (ca: string) => `tls: { certFile: ${certDir}/tls.crt, keyFile: ${certDir}/tls.key, caFile: ${certDir}/${ca} }`;
    await expect(startServer(`server: { ${files('one.crt')} }\npolicies: []`))
      .rejects.toThrow(`server.tls: ${certDir}/tls.crt cannot be served to the apiserver: the CA bundle the apiserver is given does not verify the certificate`);
    const byIp = 'webhooks: { managed: portcullis.example.com, url: "https://127.0.0.1:1" }';
    await expect(startServer(`${byIp}\nserver: { ${files('two.crt')} }\npolicies: []`))
      .rejects.toThrow('cannot be served to the apiserver: the certificate does not cover 127.0.0.1, the name the apiserver calls');
    // The same files, called by the name the certificate has: served.
    const byName = await start(`webhooks: { managed: portcullis.example.com, url: "https://localhost:1" }\nserver: { ${files('two.crt')} }\npolicies: []`);
    expect(byName.server.tls?.cert).toBe(leaf.cert);
  });

  it('refuses to start with an unreadable or non-PEM certificate, naming the file', async () => {
    await expect(startServer('server: { tls: { certFile: /nonexistent.crt, keyFile: /nonexistent.key } }\npolicies: []')).rejects.toThrow('cannot use the TLS certificate file /nonexistent.crt: no such file');
  });

  it('a FIFO or a device as a certificate file is refused at once, at start and when it replaces the served one (red team 5)', async () => {
    // Each change read the files again and a FIFO was waited on: four of them held every libuv
    // thread, after which no file in the host could be read, and the host did not exit.
    const certDir = await mkdtemp(join(tmpdir(), 'portcullis-certs-'));
    onTestFinished(() => rm(certDir, { recursive: true, force: true }));
    execFileSync('mkfifo', [join(certDir, 'fifo.crt')]);
    await expect(startServer(`server: { tls: { certFile: ${certDir}/fifo.crt, keyFile: /dev/zero } }\npolicies: []`))
      .rejects.toThrow(`cannot use the TLS certificate file ${certDir}/fifo.crt: it is not a regular file (a FIFO or a device?)`);
    const first = await selfSigned(['127.0.0.1']);
    await writeFile(join(certDir, 'tls.crt'), first.cert);
    await writeFile(join(certDir, 'tls.key'), first.key);
    const t = await start(`server: { tls: { certFile: ${certDir}/tls.crt, keyFile: ${certDir}/tls.key } }\npolicies:\n${showAuth}`);
    for (let i = 0; i < 5; i++) {
      await rm(join(certDir, 'tls.crt'));
      execFileSync('mkfifo', [join(certDir, 'tls.crt')]);
      await new Promise((r) => setTimeout(r, 1300));
    }
    const failures = t.logs.filter((l) => l.includes('TLS certificate reload failed; keeping the current one'));
    expect(failures.length).toBeGreaterThan(0);
    expect(failures.at(-1)).toContain(`cannot use the TLS certificate file ${certDir}/tls.crt: it is not a regular file (a FIFO or a device?)`);
    expect(t.server.tls?.cert).toBe(first.cert);
    // Files are still read: a good pair written back is taken.
    const next = await selfSigned(['127.0.0.1']);
    await rm(join(certDir, 'tls.crt'));
    await writeFile(join(certDir, 'tls.key'), next.key);
    await writeFile(join(certDir, 'tls.crt'), next.cert);
    for (let i = 0; i < 100 && t.server.tls?.cert !== next.cert; i++) await new Promise((r) => setTimeout(r, 100));
    expect(t.server.tls?.cert).toBe(next.cert);
  }, 30_000);

  it('says which setting failed when the self-signed certificate cannot be written to cadump', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'portcullis-cadump-'));
    onTestFinished(() => rm(dir, { recursive: true, force: true }));
    await expect(startServer(`server: { tls: { mode: self-signed, hostnames: [127.0.0.1], cadump: ${dir} } }\npolicies: []`))
      .rejects.toThrow(new RegExp(`^cannot write the self-signed certificate to server\\.tls\\.cadump ${dir}: EISDIR`));
  });
});

describe('plain HTTP', () => {
  it('is used only when asked for, with a warning', async () => {
    const t = await start(`server: { tls: { mode: insecure } }\npolicies:\n${showAuth}`);
    expect(t.server.url).toMatch(/^http:\/\//);
    expect(t.logs.some((l) => l.includes('serving plain HTTP (insecure)'))).toBe(true);
    expect((await request(`${t.server.url}/healthz`)).statusCode).toBe(200);
  });
});

describe('client certificates', () => {
  it('verifies them against the CA file and hands the peer to policies', async () => {
    const ca = await generate([{ name: 'commonName', value: 'client-ca' }], { keyType: 'ec', curve: 'P-256', algorithm: 'sha256', extensions: [{ name: 'basicConstraints', cA: true }, { name: 'keyUsage', keyCertSign: true, digitalSignature: true }] });
    const client = await generate([{ name: 'commonName', value: 'kube-apiserver' }], { keyType: 'ec', curve: 'P-256', algorithm: 'sha256', ca: { key: ca.private, cert: ca.cert }, extensions: [{ name: 'extKeyUsage', clientAuth: true }] });
    const grouped = await generate([{ name: 'commonName', value: 'alice' }, { name: 'organizationName', value: 'a' }, { name: 'organizationName', value: 'system:masters' }], { keyType: 'ec', curve: 'P-256', algorithm: 'sha256', ca: { key: ca.private, cert: ca.cert }, extensions: [{ name: 'extKeyUsage', clientAuth: true }] });
    const stranger = await generate([{ name: 'commonName', value: 'mallory' }], { keyType: 'ec', curve: 'P-256', algorithm: 'sha256' });
    const dir = await mkdtemp(join(tmpdir(), 'portcullis-client-ca-'));
    onTestFinished(() => rm(dir, { recursive: true, force: true }));
    const caFile = join(dir, 'client-ca.pem');
    await writeFile(caFile, ca.cert);
    const t = await start(`server: { tls: { mode: self-signed, hostnames: [127.0.0.1], clientCA: ${caFile} } }\npolicies:\n${showAuth}`);
    const serverCa = t.server.tls!.caBundle;
    const good = new Agent({ connect: { ca: serverCa, cert: client.cert, key: client.private } });
    expect(await peerSubject(t.server.url, good)).toEqual(['policy "show-auth": TLS peer: CN=kube-apiserver', 'policy "show-auth": Authorization header: absent']);
    // Two O attributes reach the policy as a list, not as the string "a, system:masters".
    const twoGroups = new Agent({ connect: { ca: serverCa, cert: grouped.cert, key: grouped.private } });
    expect(await peerSubject(t.server.url, twoGroups)).toContain('policy "show-auth": TLS peer groups (O): ["a","system:masters"]');
    await twoGroups.close();
    const none = new Agent({ connect: { ca: serverCa } });
    await expect(peerSubject(t.server.url, none)).rejects.toThrow();
    const bad = new Agent({ connect: { ca: serverCa, cert: stranger.cert, key: stranger.private } });
    await expect(peerSubject(t.server.url, bad)).rejects.toThrow();
    await Promise.all([good.close(), none.close(), bad.close()]);
  });
});
