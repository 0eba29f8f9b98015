// Context grants: which kinds of cluster object a policy may read. Nothing is readable without
// a grant, and every refusal names the grant that is missing, so an operator knows the exact
// line to add to the configuration.
import { PortcullisError } from '../errors.ts';

/** One readable kind, exactly as written in the configuration (`context: [{apiVersion, kind}]`). */
import type { Grant } from '../config/types.ts';

export type { Grant };

/** The key a kind is cached under: "v1 Namespace", "networking.k8s.io/v1 Ingress". */
export function kindKey(apiVersion: string, kind: string): string {
  return `${apiVersion} ${kind}`;
}

export function describeGrant(grant: Grant): string {
  return `{ apiVersion: ${grant.apiVersion}, kind: ${grant.kind} }`;
}

export function isGranted(grants: readonly Grant[], apiVersion: string, kind: string): boolean {
  return grants.some((g) => g.apiVersion === apiVersion && g.kind === kind);
}

/** The distinct kinds of every grant in a configuration: what the host must cache. */
export function grantedKinds(grantLists: readonly (readonly Grant[])[]): Grant[] {
  const kinds = new Map<string, Grant>();
  for (const list of grantLists) for (const g of list) kinds.set(kindKey(g.apiVersion, g.kind), { apiVersion: g.apiVersion, kind: g.kind });
  return [...kinds.values()];
}

/**
 * Why a context read failed. `permanent` (no grant, bad request, a result too large) will not
 * change on retry; `temporary` (the cache has not synced yet) will.
 */
export type ContextErrorCode = 'CONTEXT_NOT_GRANTED' | 'CONTEXT_BAD_REQUEST' | 'CONTEXT_TOO_LARGE' | 'CONTEXT_NOT_SYNCED';

export class ContextError extends PortcullisError {
  readonly kind: 'permanent' | 'temporary';
  constructor(code: ContextErrorCode, message: string) {
    super(code, message);
    this.kind = code === 'CONTEXT_NOT_SYNCED' ? 'temporary' : 'permanent';
  }
}

export function notGranted(policy: string, grants: readonly Grant[], apiVersion: string, kind: string): ContextError {
  const has = grants.length === 0 ? 'it has no context grants' : `its grants are ${grants.map(describeGrant).join(', ')}`;
  return new ContextError(
    'CONTEXT_NOT_GRANTED',
    // The merge prefixes the outcome with the policy's name; the name here says where to fix it.
    `may not read ${kind} (${apiVersion}): ${has}; ` +
    `add context: [${describeGrant({ apiVersion, kind })}] to policy "${policy}" in the configuration`,
  );
}
