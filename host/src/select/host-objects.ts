// The objects the host writes itself are never put to its policies: its leader-election Lease and
// its certificate Secret. A policy covering them (one with no rules covers everything, and on
// Kubernetes before 1.21 the host's namespace is excluded only once labelled) denied the host's
// own lease renewals: it lost the lease, stopped managing its webhooks, and on exit left them
// behind with failurePolicy Fail (outsider run on 1.20). Only what the host does is exempt (the
// Lease's CREATE and UPDATE, the Secret's UPDATE), not a DELETE, a subresource or a dry run, and
// only when the host itself asks, where its credentials name the user the apiserver knows it by
// (webhooks/kube.ts ownUsername): anyone else RBAC lets write these objects meets the policies.
// Where they do not (a static token, an exec plugin), who asks cannot be checked, and the host
// says so at start.
import type { AdmissionRequest, Operation } from '@portcullis/sdk';
import type { Config } from '../config/types.ts';

/** Says which of the host's own objects a request is about, if it is about one and the host asks. */
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

/** Whether the host writes objects of its own to the cluster (then hostObjects is not undefined). */
export function writesOwnObjects(config: Config): boolean {
  return Boolean(config.webhooks.managed && config.webhooks.leaderElection) || config.server.tls.mode === 'secret';
}

/**
 * `namespace`: the host's own, where both live (webhooks/build.ts hostNamespace). `requester`:
 * the username the host's own requests carry; undefined when it cannot be told (then who asks
 * is not checked). Undefined when the host writes nothing to the cluster (no leader election,
 * no Secret).
 */
export function hostObjects(config: Config, namespace: string, requester?: string): (HostObjects & { requester: string | undefined }) | undefined {
  const owned: Owned[] = [];
  const { managed, leaderElection } = config.webhooks;
  if (managed && leaderElection) owned.push({ group: 'coordination.k8s.io', resource: 'leases', namespace, name: managed, operations: ['CREATE', 'UPDATE'], what: 'leader-election Lease' });
  const tls = config.server.tls;
  if (tls.mode === 'secret') owned.push({ group: '', resource: 'secrets', namespace, name: tls.secretName, operations: ['UPDATE'], what: 'certificate Secret' });
  if (owned.length === 0) return undefined;
  const username = requester;
  const match: HostObjects = (request) => {
    const { resource, namespace: ns, name, operation } = request;
    // The host writes the objects themselves, for real: a subresource or a dry run is someone else's.
    if (request.subResource || request.dryRun === true) return undefined;
    if (username !== undefined && request.userInfo?.username !== username) return undefined;
    const found = owned.find((o) => o.name === name && o.namespace === ns && o.resource === resource.resource && o.group === resource.group
      && o.operations.includes(operation));
    return found && `the host's own ${found.what} ${found.namespace}/${found.name}`;
  };
  return Object.assign(match, { requester: username });
}
