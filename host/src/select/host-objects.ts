// The objects the host writes itself are never put to its policies: its leader-election Lease and
// its certificate Secret. A policy covering them (one with no rules covers everything, and on
// Kubernetes before 1.21 the host's namespace is excluded only once labelled) denied the host's
// own lease renewals: it lost the lease, stopped managing its webhooks, and on exit left them
// behind with failurePolicy Fail (outsider run on 1.20). Only what the host does is exempt (the
// Lease's CREATE and UPDATE, the Secret's UPDATE), not a DELETE, a subresource or a dry run. Who
// asks is not checked: anyone RBAC lets write these two objects skips the policies for them.
import type { AdmissionRequest, Operation } from '@portcullis/sdk';
import type { Config } from '../config/types.ts';

/** Says which of the host's own objects a request is about, if it is about one. */
export type HostObjects = (request: AdmissionRequest) => string | undefined;

interface Owned {
  group: string;
  resource: string;
  namespace: string;
  name: string;
  /** What the host does to it: anything else (a DELETE, say) still goes to the policies. */
  operations: readonly Operation[];
  what: string;
}

/**
 * `namespace`: the host's own, where both live (webhooks/build.ts hostNamespace). Undefined when
 * the host writes nothing to the cluster (no leader election, no Secret).
 */
export function hostObjects(config: Config, namespace: string): HostObjects | undefined {
  const owned: Owned[] = [];
  const { managed, leaderElection } = config.webhooks;
  if (managed && leaderElection) owned.push({ group: 'coordination.k8s.io', resource: 'leases', namespace, name: managed, operations: ['CREATE', 'UPDATE'], what: 'leader-election Lease' });
  const tls = config.server.tls;
  if (tls.mode === 'secret') owned.push({ group: '', resource: 'secrets', namespace, name: tls.secretName, operations: ['UPDATE'], what: 'certificate Secret' });
  if (owned.length === 0) return undefined;
  return (request) => {
    const { resource, namespace: ns, name, operation } = request;
    // The host writes the objects themselves, for real: a subresource or a dry run is someone else's.
    if (request.subResource || request.dryRun === true) return undefined;
    const found = owned.find((o) => o.name === name && o.namespace === ns && o.resource === resource.resource && o.group === resource.group
      && o.operations.includes(operation));
    return found && `the host's own ${found.what} ${found.namespace}/${found.name}`;
  };
}
