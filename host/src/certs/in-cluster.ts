// tls.mode "secret" wired into `portcullis serve`: get the first certificate before the server
// listens, then follow the Secret with the webhook manager's leader check and CA publication.
import type { Config } from '../config/types.ts';
import type { Logger } from '../util/log.ts';
import { ConfigError, errorMessage } from '../errors.ts';
import { readPointedFile } from '../util/files.ts';
import type { TlsMaterial } from './material.ts';
import { hostNamespace } from '../webhooks/build.ts';
import type { WebhookManager } from '../webhooks/manager.ts';
import { serviceDnsNames, type CheckedBundle } from './issue.ts';
import { CertificateKeeper } from './keeper.ts';
import { createCoreApi, secretApi } from './secret-store.ts';

export interface InClusterCertificate {
  material: TlsMaterial;
  source: string;
  keeper: CertificateKeeper;
  /** Follow the Secret; rotations are written only while `manager` leads. */
  follow(server: CertificateUser, manager: WebhookManager): void;
  stop(): Promise<void>;
}

/** What serves the certificate (server/app.ts's PortcullisServer): swaps it in without a restart. */
export interface CertificateUser {
  useCertificate(material: TlsMaterial, source: string): Promise<void>;
}

export interface InClusterOptions {
  kubeconfig?: string;
  env?: NodeJS.ProcessEnv;
  pollMs?: number;
}

export async function openInClusterCertificate(config: Config, log: Logger, options: InClusterOptions = {}): Promise<InClusterCertificate> {
  const tls = config.server.tls;
  const service = config.webhooks.service;
  if (tls.mode !== 'secret' || !service) throw new TypeError('openInClusterCertificate needs tls.mode "secret" and webhooks.service');
  const namespace = hostNamespace(config.webhooks, options.env);
  const { api, server } = createCoreApi(options.kubeconfig);
  const secret = secretApi(api, server, namespace, tls.secretName);
  const dnsNames = tls.hostnames ?? serviceDnsNames(service.name, service.namespace);
  const env = options.env ?? process.env;
  const keeper = new CertificateKeeper({
    secret, dnsNames, validityDays: tls.validityDays, log, ...(options.pollMs ? { pollMs: options.pollMs } : {}),
    ...(env.POD_NAME ? { identity: env.POD_NAME } : {}),
  });
  const client = { ...(tls.clientCA ? { clientCA: await readClientCa(tls.clientCA) } : {}), requireClientCert: tls.requireClientCert };
  const toMaterial = (bundle: CheckedBundle): TlsMaterial => ({ key: bundle.key, cert: bundle.cert, caBundle: bundle.ca, ...client });
  const first = await keeper.initial();
  const expires = first.notAfter.toISOString();
  const source = `Secret ${secret.ref} (certificate for ${dnsNames.join(', ')}; expires ${expires}; the leader rotates it)`;
  return {
    material: toMaterial(first),
    source,
    keeper,
    follow(srv, manager) {
      keeper.follow({
        isLeader: () => manager.isLeader,
        fence: (what, write) => manager.fence(what, write),
        publishCa: (ca) => manager.publishCa(ca),
        serve: (bundle) => srv.useCertificate(toMaterial(bundle), `Secret ${secret.ref}`),
      });
    },
    stop: () => keeper.stop(),
  };
}

/** Read as the other TLS files are (server/tls.ts readPem): a FIFO there is refused, not waited on. */
async function readClientCa(path: string): Promise<string> {
  try {
    return (await readPointedFile(path, 4 * 2 ** 20)).toString('utf8');
  } catch (error) {
    throw new ConfigError(`cannot use the TLS client CA file ${path}: ${errorMessage(error)}`);
  }
}
