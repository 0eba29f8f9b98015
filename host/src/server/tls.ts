// TLS material for the server: a development self-signed certificate (optionally written out
// as a CA file, as Kopf's cadump), or certificate and key files that are re-read when they
// change (the server swaps its secure context; open connections are not dropped).
import { createHash, createPrivateKey, randomUUID, X509Certificate } from 'node:crypto';
import { constants, watchFile, unwatchFile } from 'node:fs';
import { link, lstat, mkdir, open, readdir, rename, rm, writeFile } from 'node:fs/promises';
import { isIP } from 'node:net';
import { dirname, join } from 'node:path';
import type { TlsConfig } from '../config/types.ts';
import { ConfigError, errorMessage } from '../errors.ts';
import type { TlsMaterial } from '../certs/material.ts';
import { cacheDir, readPointedFile } from '../util/files.ts';

export type { TlsMaterial };

/** Where the material came from, for the start-up log line; only self-signed material has one. */
export interface TlsOrigin {
  /** The kept development certificate this start reused, or undefined when it made one. */
  reusedFrom?: string;
  keptIn?: string;
  /**
   * A kept one was there and could not be reused (expiring, damaged, an earlier build's CA): a
   * caBundle registered with it no longer verifies.
   */
  replaced?: true;
}

export async function tlsMaterial(tls: Extract<TlsConfig, { mode: 'self-signed' | 'files' }>, origin?: TlsOrigin): Promise<TlsMaterial> {
  const clientCA = tls.clientCA ? await readPem(tls.clientCA, 'client CA') : undefined;
  const client = { ...(clientCA ? { clientCA } : {}), requireClientCert: tls.requireClientCert };
  if (tls.mode === 'self-signed') {
    const kept = await keptSelfSigned(tls.hostnames);
    if (origin) Object.assign(origin, kept.origin);
    if (tls.cadump) {
      await writeFile(tls.cadump, kept.material.cert).catch((error: unknown) => {
        throw new ConfigError(`cannot write the self-signed certificate to server.tls.cadump ${tls.cadump!}: ${errorMessage(error)}`);
      });
    }
    return { ...kept.material, ...client };
  }
  const cert = await readPem(tls.certFile, 'certificate');
  const key = await readPem(tls.keyFile, 'key');
  const caBundle = tls.caFile ? await readPem(tls.caFile, 'CA') : cert;
  return { key, cert, caBundle, ...client };
}

export async function selfSigned(hostnames: string[]): Promise<{ key: string; cert: string; caBundle: string }> {
  const altNames = hostnames.map((name) => (isIP(name) ? { type: 7 as const, ip: name } : { type: 2 as const, value: name }));
  const notAfter = new Date(Date.now() + 365 * 24 * 3600 * 1000);
  // Loaded only here, when a certificate is made: selfsigned and @peculiar/x509 take ~190 ms to
  // load, on the main thread of every start otherwise (the sandbox workers boot meanwhile).
  const { generate } = await import('selfsigned');
  const pems = await generate([{ name: 'commonName', value: hostnames[0] ?? 'portcullis' }, { name: 'organizationName', value: 'Portcullis (development, self-signed)' }], {
    keyType: 'ec', curve: 'P-256', algorithm: 'sha256', notAfterDate: notAfter,
    extensions: [
      // Not a CA: the apiserver (Go), Node and curl accept a self-signed leaf as its own trust
      // anchor, and a key that can sign certificates is worth more to whoever reads it (it is
      // kept on disk, and a developer may trust the dumped certificate in a browser or store).
      { name: 'basicConstraints', cA: false, critical: true },
      { name: 'keyUsage', digitalSignature: true, critical: true },
      { name: 'extKeyUsage', serverAuth: true },
      { name: 'subjectAltName', altNames },
    ],
  });
  return { key: pems.private, cert: pems.cert, caBundle: pems.cert };
}

/** A kept development certificate is made again when it has less than this left. */
export const KEPT_MIN_VALIDITY_MS = 30 * 24 * 3600 * 1000;

type Pems = { key: string; cert: string; caBundle: string };

/**
 * The development certificate for these names, kept in the cache folder between starts. Making
 * one loads selfsigned and @peculiar/x509, about a third of a second of the main thread at every
 * start (bench cold start), and a new CA at every start also broke every caBundle a developer had
 * registered with the previous one (the managed webhooks, or one pasted from cadump). As vite's
 * basic-ssl plugin does, the kept one is reused while it covers these names and has a month
 * left. Its key is in a file only this user may read, in a folder only this user may change:
 * a file or folder that others may read or change, or that another user owns, is neither
 * trusted nor written. Nothing here stops a start (no home folder, a read-only cache): what
 * cannot be read, checked or written is made anew, and then only the reuse is lost.
 */
export async function keptSelfSigned(hostnames: string[], folder?: string, now = new Date()): Promise<{ material: Pems; origin: TlsOrigin }> {
  let file: string;
  try {
    // Not in the parameter list: cacheDir() throws without a home folder (an arbitrary uid in a container).
    const names = [...new Set(hostnames.map((name) => name.toLowerCase()))].sort();
    file = join(folder ?? join(cacheDir(), 'tls'), `self-signed-${createHash('sha256').update(JSON.stringify(names)).digest('hex').slice(0, 16)}.pem`);
  } catch {
    return { material: await selfSigned(hostnames), origin: {} };
  }
  const usable = await ownFolder(dirname(file));
  if (usable) await sweepStale(dirname(file));
  const reused = usable ? await readKept(file, hostnames, now) : undefined;
  if (reused) return { material: reused, origin: { reusedFrom: file } };
  // Review 9: one that replaced a kept certificate said only "generated", and a caBundle pasted from the old one broke unannounced.
  const replaced = usable && await lstat(file).then(() => true, () => false);
  const made = await selfSigned(hostnames);
  // One the next start would not reuse (it does not cover these names) is not said to be kept.
  // Judged now, not at `now`: it was made just now, valid from this second (review 8: one start
  // in six crossed a second while making it, and it was not kept).
  try {
    checkServable(made, hostnames);
  } catch {
    return { material: made, origin: {} };
  }
  if (!usable && !await makeOwnFolder(dirname(file))) return { material: made, origin: {} };
  // Starts at once (two processes, or two servers in one) each made one: they agree on the one kept.
  const kept = await writeKept(file, made, hostnames, now);
  if (!kept) return { material: made, origin: {} };
  if (kept.cert !== made.cert) return { material: kept, origin: { reusedFrom: file } };
  return { material: made, origin: { keptIn: file, ...(replaced ? { replaced: true as const } : {}) } };
}

/** Whether `folder` is a real folder of this user's that no one else may change. */
async function ownFolder(folder: string): Promise<boolean> {
  try {
    const info = await lstat(folder);
    return info.isDirectory() && (info.mode & 0o022) === 0 && (process.getuid === undefined || info.uid === process.getuid());
  } catch {
    return false;
  }
}

/** A temporary file older than this is one a start left behind (it crashed while keeping its key). */
const STALE_TEMPORARY_MS = 60_000;
/** writeKept's temporary files, whatever names their certificates were for. */
const TEMPORARY_NAME = /^self-signed-[0-9a-f]{16}\.pem\.[0-9a-f-]{36}\.tmp$/;

/**
 * Removes the temporary files a start that crashed between writing and linking left behind
 * (writeKept): each holds a private key, and nothing else would ever remove it. Only this user's
 * regular files, named as writeKept names them, old enough that no start is still using one.
 */
async function sweepStale(folder: string): Promise<void> {
  try {
    for (const name of await readdir(folder)) {
      if (!TEMPORARY_NAME.test(name)) continue;
      const path = join(folder, name);
      const info = await lstat(path);
      if (!info.isFile() || (process.getuid !== undefined && info.uid !== process.getuid())) continue;
      if (Date.now() - info.mtimeMs > STALE_TEMPORARY_MS) await rm(path, { force: true });
    }
  } catch {
    // Left for the next start: a sweep never stops this one.
  }
}

/** Creates the folder (0700) if it is missing; true if it is then one of ownFolder's. */
async function makeOwnFolder(folder: string): Promise<boolean> {
  try {
    await mkdir(folder, { recursive: true, mode: 0o700 });
  } catch {
    return false;
  }
  return ownFolder(folder);
}

/** Far more than a key and a certificate: a larger file is not one this host wrote. */
const KEPT_MAX_BYTES = 16 * 1024;

async function readKept(file: string, hostnames: string[], now: Date): Promise<Pems | undefined> {
  let text: string;
  try {
    // Without blocking or following a link, and judged through the handle it is read from: a
    // FIFO is refused, not waited on.
    const handle = await open(file, constants.O_RDONLY | constants.O_NONBLOCK | constants.O_NOFOLLOW);
    try {
      const info = await handle.stat();
      if (!info.isFile() || info.size > KEPT_MAX_BYTES) return undefined;
      if ((info.mode & 0o077) !== 0 || (process.getuid !== undefined && info.uid !== process.getuid())) return undefined;
      text = await handle.readFile('utf8');
    } finally {
      await handle.close();
    }
  } catch {
    return undefined;
  }
  const key = /-----BEGIN PRIVATE KEY-----[\s\S]*?-----END PRIVATE KEY-----/.exec(text)?.[0];
  const cert = text.match(PEM_BLOCK)?.[0];
  if (!key || !cert) return undefined;
  const material = { key: `${key}\n`, cert: `${cert}\n`, caBundle: `${cert}\n` };
  try {
    checkServable(material, hostnames, now);
    const parsed = new X509Certificate(cert);
    if (new Date(parsed.validTo).getTime() - now.getTime() < KEPT_MIN_VALIDITY_MS) return undefined;
    // One an earlier build kept was a CA: replaced once by one that cannot sign others.
    if (parsed.ca) return undefined;
  } catch {
    return undefined;
  }
  return material;
}

/**
 * Keeps `made` unless another start kept a usable one first: created with link(), which fails
 * on an existing file, so of two starts at once one keeps its own and the other reads it. A
 * file that is not usable is replaced. Returns what the file holds now, or undefined if nothing
 * could be kept.
 */
async function writeKept(file: string, made: Pems, hostnames: string[], now: Date): Promise<Pems | undefined> {
  const temporary = `${file}.${randomUUID()}.tmp`;
  try {
    await writeFile(temporary, `${made.key.trimEnd()}\n${made.cert.trimEnd()}\n`, { mode: 0o600, flag: 'wx' });
    try {
      await link(temporary, file);
      return made;
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'EEXIST') return undefined;
    }
    const other = await readKept(file, hostnames, now);
    if (other) return other;
    await rename(temporary, file);
    return made;
  } catch {
    return undefined;
  } finally {
    await rm(temporary, { force: true }).catch(() => undefined);
  }
}

const PEM_BLOCK = /-----BEGIN CERTIFICATE-----[\s\S]*?-----END CERTIFICATE-----/g;

/**
 * Refuses material that cannot be served as a replacement: a key that is not the certificate's
 * (a certificate and key written one after the other are read half-replaced: red team, the host
 * crashed on it), or a certificate that the CA bundle the apiserver will be given does not
 * verify (it was served silently, and new connections failed with x509 errors). Also at start:
 * a certificate for other names, or from another CA, was registered and /readyz said ready while
 * the apiserver refused every call (red team).
 */
export function checkServable(material: Pick<TlsMaterial, 'cert' | 'key' | 'caBundle'>, names: readonly string[] = [], now = new Date()): void {
  const chain = (material.cert.match(PEM_BLOCK) ?? []).map((pem) => new X509Certificate(pem));
  const bundle = (material.caBundle.match(PEM_BLOCK) ?? []).map((pem) => new X509Certificate(pem));
  const leaf = chain[0];
  if (!leaf) throw new Error('the certificate file holds no PEM certificate');
  let keyMatches: boolean;
  try {
    keyMatches = leaf.checkPrivateKey(createPrivateKey(material.key));
  } catch (error) {
    throw new Error(`the key file is not a usable private key (${errorMessage(error)})`);
  }
  if (!keyMatches) throw new Error('the key does not belong to the certificate (were they written one after the other? the next change is tried again)');
  // Re-test: a certificate for other names, or expired, was served, and the apiserver's new
  // connections failed (x509: certificate is valid for …, certificate has expired).
  if (now >= new Date(leaf.validTo)) throw new Error(`the certificate expired at ${new Date(leaf.validTo).toISOString()}`);
  if (now < new Date(leaf.validFrom)) throw new Error(`the certificate is not valid before ${new Date(leaf.validFrom).toISOString()}`);
  for (const name of names) {
    if (!(isIP(name) ? leaf.checkIP(name) : leaf.checkHost(name))) throw new Error(`the certificate does not cover ${name}, the name the apiserver calls`);
  }
  // The served chain, from the leaf up, must reach a certificate of the bundle.
  for (let i = 0; i < chain.length; i++) {
    const cert = chain[i]!;
    if (bundle.some((ca) => ca.fingerprint256 === cert.fingerprint256 || cert.verify(ca.publicKey))) return;
    const next = chain[i + 1];
    if (!next || !cert.verify(next.publicKey)) break;
  }
  // Neutral as to which file is behind: at start either may be wrong, and in a rotation written
  // CA first the certificate is the old one (red team: "update the CA file first" when it was).
  throw new Error('the CA bundle the apiserver is given does not verify the certificate (files written one after the other are tried again at the next change)');
}

/** Far more than a certificate chain or a CA bundle. */
const MAX_PEM_BYTES = 4 * 2 ** 20;

async function readPem(path: string, what: string): Promise<string> {
  let text: string;
  try {
    // Not waited on when a FIFO: each certificate change read the files again, and four FIFOs held
    // every libuv thread, so no file anywhere in the host could be read any more (red team 5).
    text = (await readPointedFile(path, MAX_PEM_BYTES)).toString('utf8');
  } catch (error) {
    throw new ConfigError(`cannot use the TLS ${what} file ${path}: ${errorMessage(error)}`);
  }
  if (!text.includes('-----BEGIN')) throw new ConfigError(`cannot use the TLS ${what} file ${path}: it is not PEM`);
  return text;
}

/**
 * Watches certificate files and calls `onChange` with fresh material. Polling (not fs.watch)
 * because Kubernetes updates mounted Secrets by swapping a symlink, which watchers miss.
 */
export function watchCertificates(tls: Extract<TlsConfig, { mode: 'files' }>, onChange: (material: TlsMaterial) => void, onError: (error: unknown) => void, intervalMs = 1000): () => void {
  const files = [tls.certFile, tls.keyFile, ...(tls.caFile ? [tls.caFile] : [])];
  let pending: NodeJS.Timeout | undefined;
  const listener = () => {
    // Cert and key are usually written one after the other: wait for both.
    clearTimeout(pending);
    pending = setTimeout(() => void tlsMaterial(tls).then(onChange, onError), 200);
  };
  for (const file of files) watchFile(file, { interval: intervalMs }, listener);
  return () => {
    clearTimeout(pending);
    for (const file of files) unwatchFile(file, listener);
  };
}
