// What the apiserver's validation refuses in the webhook configurations the host writes from the
// file: rules, label selectors and the webhook URL. Accepted at load, such a value made every
// webhook sync fail with 422 after a reload, and the exit patch too, which left the removed
// policies' Fail webhooks pointing at a stopped host (red team, kube-apiserver 1.20). Refused
// at load, the old configuration keeps serving.
//
// These mirror Kubernetes' own checks and add none: ValidateRuleWithOperations and
// validateResources (pkg/apis/admissionregistration/validation), ValidateLabelSelector and
// IsQualifiedName / IsValidLabelValue (apimachinery), ValidateWebhookURL (apiserver
// pkg/util/webhook). Where the apiserver's check depends on the order of a list, so does this
// one: a file the apiserver accepts must keep loading.
import type { LabelSelector, RuleWithOperations } from './types.ts';

/** A refused value: `path` is a JSON pointer below the checked value ("/0/resources/1"). */
export interface ApiserverProblem {
  path: string;
  message: string;
}

/** The first problem the apiserver would report in a webhook's rules, or undefined. */
export function ruleProblem(rules: readonly RuleWithOperations[]): ApiserverProblem | undefined {
  for (const [i, rule] of rules.entries()) {
    const problem = oneRuleProblem(rule);
    if (problem) return { path: `/${i}${problem.path}`, message: problem.message };
  }
  return undefined;
}

function oneRuleProblem(rule: RuleWithOperations): ApiserverProblem | undefined {
  const lists = { operations: 'operation', apiGroups: 'API group ("" is the core group, "*" every group)', apiVersions: 'API version', resources: 'resource' };
  for (const [field, what] of Object.entries(lists) as [keyof typeof lists, string][]) {
    if (rule[field].length === 0) return { path: `/${field}`, message: `needs at least one ${what}; the apiserver refuses an empty list` };
  }
  for (const field of ['operations', 'apiGroups', 'apiVersions'] as const) {
    if (rule[field].includes('*') && rule[field].length > 1) {
      return { path: `/${field}`, message: `"*" stands alone (the apiserver refuses it beside other values: ${JSON.stringify(rule[field])})` };
    }
  }
  // The core group is "", so only versions (and resources) must not be empty.
  const emptyVersion = rule.apiVersions.indexOf('');
  if (emptyVersion !== -1) return { path: `/apiVersions/${emptyVersion}`, message: 'must not be empty (the apiserver refuses "" as an API version)' };
  return resourcesProblem(rule.resources);
}

/** validateResources: `x/*` and `*\/y` cover what is listed after them; `*\/*` and `*` stand alone. */
function resourcesProblem(resources: readonly string[]): ApiserverProblem | undefined {
  const all = JSON.stringify(resources);
  const wildcardSubresourceOf = new Set<string>(); // x of x/*
  const wildcardResourceFor = new Set<string>(); // y of */y
  // The apiserver keeps whether the last entry without a subresource was not "*"; the check
  // below stays stricter (any such entry beside "*"), as it was before this file.
  let plainResource = false;
  for (const [i, entry] of resources.entries()) {
    if (entry === '') return { path: `/resources/${i}`, message: 'must not be empty (the apiserver refuses "" as a resource)' };
    // Outsider: `resources: [Pods]` was taken, and the policy never ran. Resource names (a CRD's
    // plural included) and subresources are lowercase; the apiserver matches them exactly.
    if (/[A-Z]/.test(entry)) {
      return { path: `/resources/${i}`, message: `${JSON.stringify(entry)} would match nothing: resources are lowercase plural names, as \`kubectl api-resources\` lists them (pods, deployments, not Pod or Pods)` };
    }
    const slash = entry.indexOf('/');
    if (slash === -1) {
      plainResource ||= entry !== '*';
      continue;
    }
    const resource = entry.slice(0, slash);
    const subresource = entry.slice(slash + 1);
    // Only entries listed before this one count, as in the apiserver: pods/status then pods/* is accepted there.
    if (wildcardSubresourceOf.has(resource)) {
      return { path: `/resources/${i}`, message: `"${entry}" is already covered by "${resource}/*" listed before it (the apiserver refuses the overlap: ${all})` };
    }
    if (wildcardResourceFor.has(subresource)) {
      return { path: `/resources/${i}`, message: `"${entry}" is already covered by "*/${subresource}" listed before it (the apiserver refuses the overlap: ${all})` };
    }
    if (subresource === '*') wildcardSubresourceOf.add(resource);
    if (resource === '*') wildcardResourceFor.add(subresource);
  }
  if (resources.includes('*/*') && resources.length > 1) {
    return { path: '/resources', message: `"*/*" stands alone (the apiserver refuses it beside other values: ${all})` };
  }
  if (resources.includes('*') && plainResource) {
    return { path: '/resources', message: `"*" covers every resource; the apiserver refuses it beside other resources: ${all}` };
  }
  return undefined;
}

const LABEL_NAME = /^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$/;
const DNS_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const NAME_CHARS = 'alphanumerics, "-", "_" or "." and must start and end with an alphanumeric';

/** Why `key` is not a label key the apiserver takes (IsQualifiedName), or undefined. */
export function labelKeyProblem(key: string): string | undefined {
  const parts = key.split('/');
  if (parts.length > 2) return 'a label key has at most one "/" (an optional DNS-subdomain prefix, then the name)';
  const name = parts.at(-1);
  if (parts.length === 2) {
    const prefix = parts[0]!;
    if (prefix === '') return 'the prefix before "/" must not be empty';
    if (prefix.length > 253) return 'the prefix before "/" must be 253 characters or less';
    if (!DNS_SUBDOMAIN.test(prefix)) return 'the prefix before "/" must be a DNS subdomain (lowercase alphanumerics, "-" and ".", starting and ending with an alphanumeric)';
  }
  if (name === '') return 'the name part must not be empty';
  if (name.length > 63) return 'the name part must be 63 characters or less';
  if (!LABEL_NAME.test(name)) return `the name part must consist of ${NAME_CHARS}`;
  return undefined;
}

/** Why `value` is not a label value (IsValidLabelValue), or undefined. "" is a valid value. */
export function labelValueProblem(value: string): string | undefined {
  if (value.length > 63) return 'a label value must be 63 characters or less';
  if (value !== '' && !LABEL_NAME.test(value)) return `a label value must be empty or consist of ${NAME_CHARS}`;
  return undefined;
}

/**
 * ValidateLabelSelector. Values of In/NotIn are checked as label values too: apiservers from
 * 1.26 on refuse an invalid one in a new object (1.20 took it, and it could match nothing).
 */
export function labelSelectorProblem(selector: LabelSelector): ApiserverProblem | undefined {
  for (const [key, value] of Object.entries(selector.matchLabels ?? {})) {
    const path = `/matchLabels/${pointerToken(key)}`;
    const keyProblem = labelKeyProblem(key);
    if (keyProblem) return { path, message: `${JSON.stringify(key)} is not a valid label key: ${keyProblem}` };
    const valueProblem = labelValueProblem(value);
    if (valueProblem) return { path, message: `${JSON.stringify(value)} is not a valid label value: ${valueProblem}` };
  }
  for (const [i, { key, operator, values }] of (selector.matchExpressions ?? []).entries()) {
    const path = `/matchExpressions/${i}`;
    const keyProblem = labelKeyProblem(key);
    if (keyProblem) return { path: `${path}/key`, message: `${JSON.stringify(key)} is not a valid label key: ${keyProblem}` };
    const listed = operator === 'In' || operator === 'NotIn';
    if (listed && (values ?? []).length === 0) return { path, message: `operator ${operator} needs values (at least one)` };
    if (!listed && (values ?? []).length > 0) return { path, message: `operator ${operator} takes no values; remove "values" (the apiserver refuses them)` };
    for (const [j, value] of (values ?? []).entries()) {
      const valueProblem = labelValueProblem(value);
      if (valueProblem) return { path: `${path}/values/${j}`, message: `${JSON.stringify(value)} is not a valid label value: ${valueProblem}` };
    }
  }
  return undefined;
}

/**
 * ValidateWebhookURL, as Go's url.Parse reads the URL. The host appends its own path
 * ("/validate/<policy>"), so a bare "?" or "#" counts too: what follows it would be that path.
 */
export function webhookUrlProblem(url: string): string | undefined {
  // Go's url.Parse refuses any ASCII control character.
  if (/[\x00-\x1f\x7f]/.test(url)) return 'it contains a control character';
  const scheme = /^([A-Za-z][A-Za-z0-9+.-]*):/.exec(url)?.[1];
  if (scheme?.toLowerCase() !== 'https') return '"https" is the only scheme the apiserver allows (https://host[:port][/path])';
  if (url.includes('#')) return 'the apiserver does not permit a fragment ("#...") in the URL';
  if (url.includes('?')) return 'the apiserver does not permit a query ("?...") in the URL; put what the host needs in the path';
  const rest = url.slice(scheme.length + 1);
  if (!rest.startsWith('//')) return 'the host must be given (https://host[:port][/path])';
  const authority = rest.slice(2).split('/')[0]!;
  if (authority.includes('@')) return 'the apiserver does not permit user information ("user@") in the URL';
  if (authority === '') return 'the host must be given (https://host[:port][/path])';
  // Go: a bracketed IPv6 literal, else the text after the last ":" is the port (digits or nothing).
  const bracketed = /^\[[^\]]*\](:(.*))?$/.exec(authority);
  if (authority.startsWith('[') && !bracketed) return 'an IPv6 host must be written in brackets, then an optional ":port" ([::1]:8443)';
  const port = bracketed ? bracketed[2] : authority.includes(':') ? authority.slice(authority.lastIndexOf(':') + 1) : undefined;
  if (port !== undefined && !/^[0-9]*$/.test(port)) return `invalid port "${port}" after the host`;
  const host = bracketed ? '' : authority.slice(0, authority.includes(':') ? authority.lastIndexOf(':') : undefined);
  if (!bracketed && host === '') return 'the host must be given (https://host[:port][/path])';
  // Characters Go's url.Parse refuses in a host name (it takes sub-delims, and '"', '<', '>').
  const bad = /[ \\^`{|}]/.exec(host);
  if (bad) return `invalid character ${JSON.stringify(bad[0])} in the host name`;
  return undefined;
}

/** A JSON-pointer token (RFC 6901), as the schema errors' paths write map keys. */
function pointerToken(key: string): string {
  return key.replace(/~/g, '~0').replace(/\//g, '~1');
}
