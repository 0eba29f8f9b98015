// Reads and writes the certificate Secret. Only get and update (PUT with the resourceVersion
// read) are used, on one Secret by name: RBAC can grant exactly that (deploy/10-rbac.yaml),
// and the resourceVersion makes two replicas that write at once fail cleanly (409) rather
// than overwrite each other.
import { CoreV1Api, KubeConfig, type V1Secret } from '@kubernetes/client-node';
import { errorMessage } from '../errors.ts';
import { callOptions, KubeConfigError, kubeCall } from '../webhooks/kube.ts';
import type { CertificateBundle } from './issue.ts';

/** Annotation an operator sets (any value) to make the leader rotate now. */
export const ROTATE_ANNOTATION = 'portcullis.dev/rotate';
/** Annotations the host writes, for operators reading the Secret. */
export const NOT_AFTER_ANNOTATION = 'portcullis.dev/not-after';
export const ISSUED_BY_ANNOTATION = 'portcullis.dev/issued-by';

export interface StoredSecret {
  resourceVersion: string;
  /** Undefined when any of tls.crt, tls.key, ca.crt is missing (a fresh, empty Secret). */
  bundle: CertificateBundle | undefined;
  rotateRequested: boolean;
}

export interface SecretApi {
  read(): Promise<StoredSecret>;
  /** Replaces the data; fails with a 409 KubeApiError if the Secret changed since `resourceVersion`. */
  write(resourceVersion: string, bundle: CertificateBundle, annotations: Record<string, string>): Promise<StoredSecret>;
  /** "namespace/name", for messages. */
  readonly ref: string;
}

export function createCoreApi(kubeconfig?: string): { api: CoreV1Api; server: string } {
  const kc = new KubeConfig();
  try {
    if (kubeconfig) kc.loadFromFile(kubeconfig);
    else kc.loadFromDefault();
  } catch (error) {
    throw new KubeConfigError(`cannot load Kubernetes credentials for the certificate Secret: ${errorMessage(error)}`, { cause: error });
  }
  const cluster = kc.getCurrentCluster();
  if (!cluster) {
    throw new KubeConfigError('no current cluster in the Kubernetes configuration: set KUBECONFIG, or run in a Pod with a ServiceAccount');
  }
  return { api: kc.makeApiClient(CoreV1Api), server: cluster.server };
}

export function secretApi(api: CoreV1Api, server: string, namespace: string, name: string, timeoutMs = 10_000): SecretApi {
  const op = (verb: 'get' | 'update') => ({ verb, resource: 'secrets' as const, name, namespace });
  const options = callOptions(timeoutMs);
  return {
    ref: `${namespace}/${name}`,
    async read() {
      return stored(await kubeCall(op('get'), server, () => api.readNamespacedSecret({ name, namespace }, options)));
    },
    async write(resourceVersion, bundle, annotations) {
      const current = await kubeCall(op('get'), server, () => api.readNamespacedSecret({ name, namespace }, options));
      const kept = { ...current.metadata?.annotations };
      delete kept[ROTATE_ANNOTATION];
      const body: V1Secret = {
        ...current,
        metadata: { ...current.metadata, resourceVersion, annotations: { ...kept, ...annotations } },
        type: current.type ?? 'Opaque',
        data: { ...current.data, 'tls.crt': b64(bundle.cert), 'tls.key': b64(bundle.key), 'ca.crt': b64(bundle.ca) },
      };
      delete body.stringData;
      return stored(await kubeCall(op('update'), server, () => api.replaceNamespacedSecret({ name, namespace, body }, options)));
    },
  };
}

function stored(secret: V1Secret): StoredSecret {
  const data = secret.data ?? {};
  const [cert, key, ca] = ['tls.crt', 'tls.key', 'ca.crt'].map((k) => (data[k] ? Buffer.from(data[k], 'base64').toString('utf8') : ''));
  return {
    resourceVersion: secret.metadata?.resourceVersion ?? '',
    bundle: cert && key && ca ? { cert, key, ca } : undefined,
    rotateRequested: Boolean(secret.metadata?.annotations?.[ROTATE_ANNOTATION]),
  };
}

const b64 = (text: string) => Buffer.from(text, 'utf8').toString('base64');
