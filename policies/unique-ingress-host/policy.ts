// Deny an Ingress whose host is already served by another Ingress anywhere in the cluster.
// Context-aware: it reads every Ingress from the host's cache, so it needs the grant
//   context: [{ apiVersion: networking.k8s.io/v1, kind: Ingress }]
import { AdmissionError, definePolicy, list, type JsonObject } from '@portcullis/sdk';

const INGRESS = 'networking.k8s.io/v1';

/** The hosts an Ingress's rules and TLS sections name. */
function hostsOf(ingress: JsonObject | null): Set<string> {
  const spec = (ingress?.spec ?? {}) as { rules?: { host?: unknown }[]; tls?: { hosts?: unknown[] }[] };
  const hosts = new Set<string>();
  for (const rule of spec.rules ?? []) if (typeof rule?.host === 'string' && rule.host) hosts.add(rule.host.toLowerCase());
  return hosts;
}

function nameOf(object: JsonObject): { namespace: string; name: string } {
  const metadata = (object.metadata ?? {}) as { namespace?: string; name?: string };
  return { namespace: metadata.namespace ?? '', name: metadata.name ?? '' };
}

export default definePolicy({
  validate({ object, request }) {
    const wanted = hostsOf(object);
    if (wanted.size === 0) return;
    const self = { namespace: request.namespace ?? '', name: request.name ?? (object ? nameOf(object).name : '') };
    for (const other of list(INGRESS, 'Ingress')) {
      const { namespace, name } = nameOf(other);
      // An UPDATE sees its own old version in the cache: that is not a conflict.
      if (namespace === self.namespace && name === self.name) continue;
      for (const host of hostsOf(other)) {
        if (wanted.has(host)) throw new AdmissionError(`host "${host}" is already used by Ingress ${namespace}/${name}`, 409);
      }
    }
  },
});
