// Which kinds a configuration needs cached: every granted kind, plus Namespaces when the
// single webhook must evaluate namespaceSelectors itself (the apiserver does it for
// per-policy webhooks; the single webhook sees every request and must agree with them).
import type { Config } from '../config/types.ts';
import { grantedKinds, type Grant } from './grants.ts';

export const NAMESPACE_KIND: Grant = { apiVersion: 'v1', kind: 'Namespace' };

export function kindsToCache(config: Config): Grant[] {
  const kinds = grantedKinds(config.policies.map((p) => p.context ?? []));
  const selectors = config.policies.some((p) => p.namespaceSelector !== undefined);
  // Only with cluster access already configured (managed webhooks): a host without it keeps
  // the old behaviour (evaluate the policy when the namespace's labels are unknown).
  if (selectors && config.webhooks.managed) return grantedKinds([kinds, [NAMESPACE_KIND]]);
  return kinds;
}
