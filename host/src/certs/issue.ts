// Issues the host's in-cluster serving certificate: a fresh CA and a certificate it signs for
// the Service's DNS names. Every rotation makes a new CA; its key is dropped right after
// signing, so the Secret never holds a key that could sign anything else.
import { X509Certificate, createPrivateKey } from 'node:crypto';
import { isIP } from 'node:net';
import { PortcullisError } from '../errors.ts';

/** What the Secret holds (its data keys: tls.crt, tls.key, ca.crt). */
export interface CertificateBundle {
  cert: string;
  key: string;
  ca: string;
}

/** A bundle that parsed and checked out, with the dates rotation is planned by. */
export interface CheckedBundle extends CertificateBundle {
  notBefore: Date;
  notAfter: Date;
  /** sha256 fingerprint of the serving certificate, for logs and change detection. */
  fingerprint: string;
}

/** Certificate data that cannot be served (unparsable, key mismatch, wrong names, expired). */
export class CertificateInvalidError extends PortcullisError {
  constructor(message: string) {
    super('CERTIFICATE_INVALID', message);
  }
}

/** The names the apiserver may verify for a Service (it uses <name>.<namespace>.svc). */
export function serviceDnsNames(name: string, namespace: string): string[] {
  return [name, `${name}.${namespace}`, `${name}.${namespace}.svc`, `${name}.${namespace}.svc.cluster.local`];
}

// Backdated so that an apiserver whose clock runs a little behind still accepts a new certificate.
const BACKDATE_MS = 5 * 60_000;

export async function issueBundle(dnsNames: string[], validityDays: number, now = new Date()): Promise<CertificateBundle> {
  if (dnsNames.length === 0) throw new TypeError('a serving certificate needs at least one DNS name');
  // Loaded when a certificate is made, not with the host: selfsigned and @peculiar/x509 take ~190 ms to load.
  const { generate } = await import('selfsigned');
  const notBeforeDate = new Date(now.getTime() - BACKDATE_MS);
  const notAfterDate = new Date(now.getTime() + validityDays * 24 * 3600_000);
  // The CA outlives its certificate by a day so that a late rotation never finds it expired first.
  const caSubject = [{ name: 'commonName', value: `portcullis-ca-${now.toISOString()}` }, { name: 'organizationName', value: 'Portcullis' }];
  const ca = await generate(caSubject, {
    keyType: 'ec', curve: 'P-256', algorithm: 'sha256', notBeforeDate, notAfterDate: new Date(notAfterDate.getTime() + 24 * 3600_000),
    extensions: [
      { name: 'basicConstraints', cA: true, critical: true },
      { name: 'keyUsage', keyCertSign: true, cRLSign: true, digitalSignature: true, critical: true },
    ],
  });
  const altNames = dnsNames.map((n) => (isIP(n) ? { type: 7 as const, ip: n } : { type: 2 as const, value: n }));
  const serving = await generate([{ name: 'commonName', value: dnsNames[0]! }], {
    keyType: 'ec', curve: 'P-256', algorithm: 'sha256', notBeforeDate, notAfterDate,
    ca: { key: ca.private, cert: ca.cert },
    extensions: [
      { name: 'basicConstraints', cA: false, critical: true },
      { name: 'keyUsage', digitalSignature: true, keyEncipherment: true, critical: true },
      { name: 'extKeyUsage', serverAuth: true },
      { name: 'subjectAltName', altNames },
    ],
  });
  return { cert: serving.cert, key: serving.private, ca: ca.cert };
}

/**
 * Checks that a bundle can be served for `dnsNames` right now: the key belongs to the
 * certificate, the CA signed it, it names every DNS name and it has not expired.
 */
export function checkBundle(bundle: CertificateBundle, dnsNames: string[], now = new Date()): CheckedBundle {
  let cert: X509Certificate;
  let ca: X509Certificate;
  try {
    cert = new X509Certificate(bundle.cert);
    ca = new X509Certificate(bundle.ca);
  } catch (error) {
    throw new CertificateInvalidError(`the certificate or CA is not a PEM X.509 certificate (${(error as Error).message})`);
  }
  try {
    if (!cert.checkPrivateKey(createPrivateKey(bundle.key))) throw new CertificateInvalidError('tls.key does not belong to tls.crt');
  } catch (error) {
    if (error instanceof CertificateInvalidError) throw error;
    throw new CertificateInvalidError(`tls.key is not a usable private key (${(error as Error).message})`);
  }
  if (!cert.verify(ca.publicKey)) throw new CertificateInvalidError('tls.crt is not signed by ca.crt');
  for (const name of dnsNames) {
    const ok = isIP(name) ? cert.checkIP(name) : cert.checkHost(name, { wildcards: false });
    if (!ok) throw new CertificateInvalidError(`tls.crt does not cover ${name}`);
  }
  const notBefore = new Date(cert.validFrom);
  const notAfter = new Date(cert.validTo);
  if (now >= notAfter) throw new CertificateInvalidError(`tls.crt expired at ${notAfter.toISOString()}`);
  return { ...bundle, notBefore, notAfter, fingerprint: cert.fingerprint256 };
}

/** When the leader replaces a certificate: with a third of its lifetime left (Kubernetes' own habit). */
export function renewalTime(bundle: Pick<CheckedBundle, 'notBefore' | 'notAfter'>): Date {
  const lifetime = bundle.notAfter.getTime() - bundle.notBefore.getTime();
  return new Date(bundle.notBefore.getTime() + (lifetime * 2) / 3);
}
