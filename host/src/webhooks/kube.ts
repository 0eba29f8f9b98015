// The host's Kubernetes API access for webhook management: clients built from KUBECONFIG (or
// ~/.kube/config, or the Pod's ServiceAccount), and errors that say which object and verb
// failed and what the operator can do about it. Nothing here is on the review path: reviews
// are served whether or not the apiserver answers.
import {
  AdmissionregistrationV1Api,
  ApiException,
  CoordinationV1Api,
  KubeConfig,
  PatchStrategy,
  setHeaderMiddleware,
  VersionApi,
  type ConfigurationOptions,
  type ObservableMiddleware,
} from '@kubernetes/client-node';
import { X509Certificate } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { errorMessage, PortcullisError } from '../errors.ts';
import { defaultKubeConfigFound } from '../util/kubeconfig.ts';

export interface KubeClients {
  admission: AdmissionregistrationV1Api;
  coordination: CoordinationV1Api;
  version: VersionApi;
  /** The apiserver URL, for messages. */
  server: string;
}

/** No usable cluster credentials (bad KUBECONFIG file, no in-cluster ServiceAccount). */
export class KubeConfigError extends PortcullisError {
  constructor(message: string, options?: { cause?: unknown }) {
    super('KUBECONFIG_UNUSABLE', message, options);
  }
}

export type Verb = 'get' | 'create' | 'patch' | 'update' | 'delete';
export type Resource = 'validatingwebhookconfigurations' | 'mutatingwebhookconfigurations' | 'leases' | 'secrets';

export interface Operation {
  verb: Verb;
  resource: Resource;
  name: string;
  namespace?: string;
}

/** A Kubernetes API call that failed, described for an operator. */
export class KubeApiError extends PortcullisError {
  /** HTTP status, or undefined when the apiserver was not reached at all. */
  readonly status: number | undefined;
  readonly operation: Operation;
  /** Worth trying again as is (network, conflict, overload, RBAC that may be granted later). */
  readonly retryable: boolean;
  constructor(operation: Operation, status: number | undefined, message: string, retryable: boolean, options?: { cause?: unknown }) {
    super('KUBE_API_FAILED', message, options);
    this.status = status;
    this.operation = operation;
    this.retryable = retryable;
  }

  /** Likely to succeed within seconds (unlike RBAC or credentials, which wait for a person). */
  get transient(): boolean {
    return this.status === undefined || this.status === 409 || this.status === 429 || this.status >= 500;
  }
}

/** A same-named configuration exists that the host did not create; it is never modified. */
export class ForeignObjectError extends PortcullisError {
  /** `installation`: the other Portcullis installation (its Lease) that manages it, when it is one. */
  constructor(kind: string, name: string, label: string, installation?: { theirs: string; ours: string }) {
    super('WEBHOOK_CONFIGURATION_FOREIGN', installation
      ? `${kind} "${name}" is managed by another Portcullis installation (Lease ${installation.theirs}; this one's is ${installation.ours}); refusing to modify it. Stop the other installation (or delete the configuration), or set webhooks.managed to another name`
      : `${kind} "${name}" exists but is not managed by Portcullis (no label ${label}); refusing to modify it. Delete it, or set webhooks.managed to another name`);
  }
}

export function createKubeClients(kubeconfig?: string): KubeClients {
  const kc = new KubeConfig();
  try {
    if (kubeconfig) kc.loadFromFile(kubeconfig);
    else kc.loadFromDefault();
  } catch (error) {
    throw new KubeConfigError(`cannot load Kubernetes credentials${kubeconfig ? ` from ${kubeconfig}` : ' (KUBECONFIG, ~/.kube/config or the in-cluster ServiceAccount)'}: ${errorMessage(error)}`, { cause: error });
  }
  const cluster = kubeconfig || defaultKubeConfigFound() ? kc.getCurrentCluster() : null;
  if (!cluster) throw new KubeConfigError('no current cluster in the Kubernetes configuration: set KUBECONFIG, or run in a Pod with a ServiceAccount');
  return {
    admission: kc.makeApiClient(AdmissionregistrationV1Api),
    coordination: kc.makeApiClient(CoordinationV1Api),
    version: kc.makeApiClient(VersionApi),
    server: cluster.server,
  };
}

/**
 * The username the apiserver gives this host's own requests (an admission review's
 * userInfo.username), where its credentials say it: a ServiceAccount token (mounted in a Pod, or
 * in a kubeconfig), or a client certificate (its CN). undefined where they do not (a static
 * token, an exec plugin, OIDC, basic auth mapped by the apiserver): that mapping is the
 * apiserver's own, and a guess would exempt the wrong user.
 */
export function ownUsername(kc?: KubeConfig): string | undefined {
  try {
    if (!kc) {
      kc = new KubeConfig();
      kc.loadFromDefault();
    }
    const user = kc.getCurrentUser();
    if (!user) return undefined;
    const provider = user.authProvider as { name?: unknown; config?: { tokenFile?: unknown } } | undefined;
    const tokenFile = provider?.name === 'tokenFile' ? provider.config?.tokenFile : undefined;
    const token = user.token ?? (typeof tokenFile === 'string' ? readFileSync(tokenFile, 'utf8').trim() : undefined);
    if (token) return serviceAccountOf(token);
    const pem = user.certData ? Buffer.from(user.certData, 'base64').toString('utf8') : user.certFile ? readFileSync(user.certFile, 'utf8') : undefined;
    if (pem) return commonName(new X509Certificate(pem).subject);
    return undefined;
  } catch {
    return undefined;
  }
}

/** A ServiceAccount token's user (its JWT `sub`, which the apiserver uses as is); other tokens say nothing. */
function serviceAccountOf(token: string): string | undefined {
  const payload = token.split('.')[1];
  if (payload === undefined) return undefined;
  const claims: unknown = JSON.parse(Buffer.from(payload, 'base64url').toString('utf8'));
  const sub = typeof claims === 'object' && claims !== null ? (claims as { sub?: unknown }).sub : undefined;
  return typeof sub === 'string' && /^system:serviceaccount:[^:]+:[^:]+$/.test(sub) ? sub : undefined;
}

/** The CN of an X.509 subject as Node prints it (one attribute a line); the apiserver's username for a client certificate. */
function commonName(subject: string): string | undefined {
  const names = subject.split('\n').filter((line) => line.startsWith('CN='));
  return names.length === 1 ? names[0]!.slice(3) : undefined;
}

/**
 * Per-call options: a deadline (a hung apiserver must not hang leader election or shutdown)
 * and our own User-Agent, so the apiserver's audit log names us. The deadline has to be set
 * in a middleware because the client takes no timeout of its own.
 */
export function callOptions(timeoutMs: number, contentType?: PatchStrategy): ConfigurationOptions {
  const agent = setHeaderMiddleware('User-Agent', 'portcullis-webhook-manager');
  const deadline: ObservableMiddleware = {
    pre: (context) => {
      context.setSignal(AbortSignal.timeout(timeoutMs));
      return agent.pre(context);
    },
    post: (context) => agent.post(context),
  };
  return { middleware: [deadline, ...(contentType ? [setHeaderMiddleware('Content-Type', contentType)] : [])], middlewareMergeStrategy: 'append' };
}

export function mergePatchOptions(timeoutMs: number): ConfigurationOptions {
  return callOptions(timeoutMs, PatchStrategy.MergePatch);
}

export function statusOf(error: unknown): number | undefined {
  if (error instanceof KubeApiError) return error.status;
  if (error instanceof ApiException) return (error as ApiException<unknown>).code;
  return undefined;
}

/** Runs one API call; any failure comes back as a KubeApiError that tells what to do. */
export async function kubeCall<T>(operation: Operation, server: string, call: () => Promise<T>): Promise<T> {
  try {
    return await call();
  } catch (error) {
    throw describeKubeError(error, operation, server);
  }
}

export function describeKubeError(error: unknown, op: Operation, server: string): KubeApiError {
  if (error instanceof KubeApiError) return error;
  const target = `${op.resource} "${op.name}"${op.namespace ? ` in namespace "${op.namespace}"` : ''}`;
  const where = `${op.resource}${op.namespace ? ` in namespace "${op.namespace}"` : ''}`;
  if (!(error instanceof ApiException)) {
    return new KubeApiError(op, undefined, `cannot reach the apiserver at ${server} to ${op.verb} ${target}: ${networkReason(error)}; admission reviews are still served; retrying`, true, { cause: error });
  }
  const status = (error as ApiException<unknown>).code;
  const said = apiMessage((error as ApiException<unknown>).body);
  const detail = said ? `: ${said}` : '';
  switch (status) {
    case 401:
      return new KubeApiError(op, status, `401 Unauthorized: the apiserver at ${server} rejected the host's credentials to ${op.verb} ${target}${detail}; check KUBECONFIG or the Pod's ServiceAccount token`, true, { cause: error });
    case 403:
      return new KubeApiError(op, status, `403 Forbidden: cannot ${op.verb} ${target}${detail}; grant the host's ServiceAccount '${op.verb}' on ${where} (deploy/10-rbac.yaml has the exact rules)`, true, { cause: error });
    case 404:
      // Creating in a namespace nobody made says only `namespaces "x" not found` (newcomer: a
      // local serve whose Service named a namespace not created yet, and the Lease failed so).
      if (op.namespace !== undefined && said === `namespaces "${op.namespace}" not found`) {
        return new KubeApiError(op, status, `404 Not Found: cannot ${op.verb} ${target}: namespace "${op.namespace}" does not exist; ` +
          `create it (kubectl create namespace ${op.namespace}) or set webhooks.namespace to the namespace the host runs in; retrying`, true, { cause: error });
      }
      return new KubeApiError(op, status, `404 Not Found: ${target} does not exist${detail}`, false, { cause: error });
    case 409:
      return new KubeApiError(op, status, `409 Conflict: ${target} was changed by someone else between read and ${op.verb}${detail}; re-reading and retrying`, true, { cause: error });
    case 400:
    case 422:
      return new KubeApiError(op, status, `${status} Invalid: the apiserver refused to ${op.verb} ${target}${detail}; check the webhooks section and the policies' rules and selectors in the configuration`, false, { cause: error });
    default:
      return new KubeApiError(op, status, `${status}: the apiserver failed to ${op.verb} ${target}${detail}; retrying`, status === 429 || status >= 500, { cause: error });
  }
}

function apiMessage(body: unknown): string | undefined {
  let value: unknown = body;
  if (typeof body === 'string') {
    try {
      value = JSON.parse(body);
    } catch {
      return body.slice(0, 300) || undefined;
    }
  }
  if (typeof value === 'object' && value !== null && 'message' in value && typeof value.message === 'string') return value.message;
  return undefined;
}

function networkReason(error: unknown): string {
  if (error instanceof Error && error.name === 'AbortError') return 'no answer in time';
  if (error instanceof Error && error.name === 'TimeoutError') return 'no answer in time';
  const cause = error instanceof Error ? error.cause : undefined;
  if (cause instanceof Error) {
    const code = (cause as Error & { code?: unknown }).code;
    return typeof code === 'string' && !cause.message.includes(code) ? `${code} ${cause.message}` : cause.message;
  }
  return errorMessage(error);
}
