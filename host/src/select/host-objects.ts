// The objects the host writes itself are never put to its policies: its leader-election Lease and
// its certificate Secret. A policy covering them (one with no rules covers everything, and on
// Kubernetes before 1.21 the host's namespace is excluded only once labelled) denied the host's
// own lease renewals: it lost the lease, stopped managing its webhooks, and on exit left them
// behind with failurePolicy Fail (outsider run on 1.20).
import type { AdmissionRequest } from '@portcullis/sdk';
import type { Config } from '../config/types.ts';

/** Says which of the host's own objects a request is about, if it is about one. */
export type HostObjects = (request: AdmissionRequest) => string | undefined;

interface Owned {
  group: string;
  resource: string;
  namespace: string;
  name: string;
  what: string;
}

/**
 * `namespace`: the host's own, where both live (webhooks/build.ts hostNamespace). Undefined when
 * the host writes nothing to the cluster (no leader election, no Secret).
 */
export function hostObjects(config: Config, namespace: string): HostObjects | undefined {
  const owned: Owned[] = [];
  const { managed, leaderElection } = config.webhooks;
  if (managed && leaderElection) owned.push({ group: 'coordination.k8s.io', resource: 'leases', namespace, name: managed, what: 'leader-election Lease' });
  const tls = config.server.tls;
  if (tls.mode === 'secret') owned.push({ group: '', resource: 'secrets', namespace, name: tls.secretName, what: 'certificate Secret' });
  if (owned.length === 0) return undefined;
  return (request) => {
    const { resource, namespace: ns, name } = request;
    const found = owned.find((o) => o.name === name && o.namespace === ns && o.resource === resource.resource && o.group === resource.group);
    return found && `the host's own ${found.what} ${found.namespace}/${found.name}`;
  };
}
