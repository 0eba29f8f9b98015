// Which policies apply to a request. The same semantics the apiserver uses for webhook rules
// and label selectors (so per-policy webhooks and the single webhook agree), plus
// kinitiras-style resource selectors that only the host can evaluate.
import type { AdmissionRequest, Mode } from '@portcullis/sdk';
import { fieldSelectorMatches, labelSelectorMatches } from '../config/selectors.ts';
import { hasValue, labelsIn } from '../review/parse.ts';
import type { LabelSelector, PolicyConfig, ResourceSelector, RuleWithOperations } from '../config/types.ts';

export { fieldSelectorMatches, labelSelectorMatches };

export type NamespaceLabels = (namespace: string) => Record<string, string> | undefined;

export interface Selectable {
  config: PolicyConfig;
  modes: Mode[];
}

export function policyMatches(policy: Selectable, mode: Mode, request: AdmissionRequest, namespaceLabels?: NamespaceLabels): boolean {
  const { config } = policy;
  if (!policy.modes.includes(mode)) return false;
  if (config.rules.length > 0 && !config.rules.some((rule) => ruleMatches(rule, request))) return false;
  if (config.objectSelector && !objectSelectorMatches(config.objectSelector, request)) return false;
  if (config.namespaceSelector && !namespaceSelectorMatches(config.namespaceSelector, request, namespaceLabels)) return false;
  if (config.match.length > 0 && !config.match.some((selector) => resourceSelectorMatches(selector, request))) return false;
  return true;
}

export function ruleMatches(rule: RuleWithOperations, request: AdmissionRequest): boolean {
  const { group, version, resource } = request.resource;
  if (!rule.operations.includes('*') && !rule.operations.includes(request.operation)) return false;
  if (!listHas(rule.apiGroups, group) || !listHas(rule.apiVersions, version)) return false;
  const scope = rule.scope ?? '*';
  // As the apiserver's rule scope: a Namespace is cluster-scoped, though its UPDATE and DELETE
  // carry its own name as request.namespace (red team: a Cluster-scoped guard on namespaces
  // was skipped for exactly those).
  const namespaced = Boolean(request.namespace) && !(group === '' && version === 'v1' && resource === 'namespaces');
  if (scope === 'Cluster' && namespaced) return false;
  if (scope === 'Namespaced' && !namespaced) return false;
  const sub = request.subResource ?? '';
  return rule.resources.some((entry) => {
    const [res, subres] = entry.split('/', 2) as [string, string | undefined];
    if (subres === undefined) return sub === '' && (res === '*' || res === resource);
    return (res === '*' || res === resource) && (subres === '*' || subres === sub);
  });
}

function listHas(list: string[], value: string): boolean {
  return list.includes('*') || list.includes(value);
}

/**
 * As the apiserver: an empty selector matches everything; otherwise the object's labels or the
 * old object's must match. A missing object (the object of a DELETE), or one without metadata
 * (PodExecOptions on CONNECT), matches nothing, not even DoesNotExist (red team: a
 * DoesNotExist selector selected every DELETE whatever the old object's labels).
 */
function objectSelectorMatches(selector: LabelSelector, request: AdmissionRequest): boolean {
  return labelsMatch(selector, request, 'object') || labelsMatch(selector, request, 'oldObject');
}

/** One object (or none) against an objectSelector, as the apiserver matches it. Its labels are read without parsing the rest of it. */
function labelsMatch(selector: LabelSelector, request: AdmissionRequest, which: 'object' | 'oldObject' | undefined): boolean {
  if (Object.keys(selector.matchLabels ?? {}).length === 0 && (selector.matchExpressions ?? []).length === 0) return true;
  if (which === undefined || !hasValue(request, which)) return false;
  const { metadata, labels } = labelsIn(request, which);
  return metadata && labelSelectorMatches(selector, (labels ?? {}) as Record<string, string>);
}

/**
 * A Namespace object is matched by its own labels. Any other object by its namespace's
 * labels when the host knows them; when it does not (no cluster access), the policy is
 * evaluated: leaving a policy out on a guess would be the unsafe choice. Per-policy webhooks
 * carry the selector to the apiserver, which always knows.
 */
function namespaceSelectorMatches(selector: LabelSelector, request: AdmissionRequest, lookup?: NamespaceLabels): boolean {
  if (request.kind.kind === 'Namespace' && request.kind.group === '') {
    const which = hasValue(request, 'object') ? 'object' : hasValue(request, 'oldObject') ? 'oldObject' : undefined;
    return labelSelectorMatches(selector, ((which && labelsIn(request, which).labels) ?? {}) as Record<string, string>);
  }
  if (!request.namespace) return true;
  const labels = lookup?.(request.namespace);
  return labels === undefined ? true : labelSelectorMatches(selector, labels);
}

export function resourceSelectorMatches(selector: ResourceSelector, request: AdmissionRequest): boolean {
  const kind = request.kind;
  if (selector.apiVersion !== undefined && selector.apiVersion !== (kind.group ? `${kind.group}/${kind.version}` : kind.version)) return false;
  if (selector.kind !== undefined && selector.kind !== kind.kind) return false;
  if (selector.namespace !== undefined && !glob(selector.namespace, request.namespace ?? '')) return false;
  if (selector.name !== undefined && !glob(selector.name, request.name ?? '')) return false;
  if (!selector.labelSelector && !selector.fieldSelector) return true;
  // As the apiserver's objectSelector, which a single match entry's labelSelector becomes on its
  // webhook (webhooks/build.ts): the object or the old object, both selectors on the same one.
  // Red team: an UPDATE that removed the selected label was sent here for the old object's
  // label, then the policy was left out.
  const present = (['object', 'oldObject'] as const).filter((which) => hasValue(request, which));
  return (present.length > 0 ? present : [undefined]).some((which) =>
    (!selector.labelSelector || labelsMatch(selector.labelSelector, request, which))
    && (!selector.fieldSelector || fieldSelectorMatches(selector.fieldSelector, which ? request[which] ?? null : null)));
}

/**
 * `*` matches any run of characters; everything else is literal. The parts between stars are
 * found leftmost in turn, which is enough for a star-only pattern and takes time linear in the
 * value per part. Red team: as a RegExp (`.*` per star) it backtracked, and a request of 3 KB
 * sent straight to the webhook, its namespace matched against `team-*-*-*`, held the main
 * thread 7-17 s (cubic in its length; the apiserver sends no such name, any caller can).
 */
function glob(pattern: string, value: string): boolean {
  const parts = pattern.split('*');
  const first = parts[0]!;
  if (parts.length === 1) return value === first;
  const last = parts[parts.length - 1]!;
  if (value.length < first.length + last.length || !value.startsWith(first) || !value.endsWith(last)) return false;
  let at = first.length;
  const end = value.length - last.length;
  for (let i = 1; i < parts.length - 1; i++) {
    const part = parts[i]!;
    const found = value.indexOf(part, at);
    if (found < 0 || found + part.length > end) return false;
    at = found + part.length;
  }
  return true;
}


