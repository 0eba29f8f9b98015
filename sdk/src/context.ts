// Reads of cluster objects, for policies granted them in the host's configuration:
//
//   const ns = get('v1', 'Namespace', '', request.namespace);
//   const ingresses = list('networking.k8s.io/v1', 'Ingress', { labelSelector: 'team=web' });
//
// Synchronous: the host answers from its informer cache, inside the sandbox, without I/O.
// A read outside the policy's grants throws PermanentError naming the missing grant; a read
// before the host's cache has synced throws TemporaryError. Left uncaught, these become the
// policy's permanent or temporary failure, which is what the host's merge expects.
import type { JsonObject } from './contract.ts';
import { PermanentError, TemporaryError } from './errors.ts';

export interface ListOptions {
  /** Only this namespace; absent or "": every namespace (and cluster-scoped objects). */
  namespace?: string;
  /** Kubernetes label selector syntax: "app=web,tier!=db,env in (a,b),!legacy". */
  labelSelector?: string;
  /** Field paths with =, == or !=: "metadata.name=web,spec.type!=LoadBalancer". */
  fieldSelector?: string;
}

type Reader = (request: string) => string;

let reader: Reader | undefined;

/** Called by the generated component entry (and the tests) to connect reads to the host. Not for policies. */
export function bindContextReader(read: Reader): void {
  reader = read;
}

/**
 * One object, or null when it does not exist. `namespace` is "" for cluster-scoped kinds.
 * `T` only types the answer (e.g. a k8s model); the host does not check it.
 */
export function get<T extends object = JsonObject>(apiVersion: string, kind: string, namespace: string, name: string): T | null {
  const answer = call({ verb: 'get', apiVersion, kind, namespace, name });
  return (answer.object ?? null) as T | null;
}

/** Every object of a kind that matches the options. */
export function list<T extends object = JsonObject>(apiVersion: string, kind: string, options: ListOptions = {}): T[] {
  const answer = call({ verb: 'list', apiVersion, kind, ...options });
  return (answer.items ?? []) as T[];
}

function call(request: Record<string, string | undefined>): Record<string, unknown> {
  if (!reader) throw new PermanentError('context reads are not available: build this policy with `portcullis build`');
  const answer = JSON.parse(reader(JSON.stringify(request))) as Record<string, unknown>;
  const error = answer.error as { kind?: string; message?: string } | undefined;
  if (error) {
    const message = error.message ?? 'context read failed';
    throw error.kind === 'temporary' ? new TemporaryError(message) : new PermanentError(message);
  }
  return answer;
}
