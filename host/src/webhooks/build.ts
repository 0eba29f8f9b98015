// What the cluster should hold for a policy set: one ValidatingWebhookConfiguration and one
// MutatingWebhookConfiguration, both named webhooks.managed. Pure (no I/O), so the whole
// mapping from configuration to webhooks is unit-tested; manager.ts only makes it so.
import type {
  AdmissionregistrationV1WebhookClientConfig,
  V1LabelSelector,
  V1LabelSelectorRequirement,
  V1MutatingWebhook,
  V1MutatingWebhookConfiguration,
  V1RuleWithOperations,
  V1ValidatingWebhook,
  V1ValidatingWebhookConfiguration,
} from '@kubernetes/client-node';
import type { Mode } from '@portcullis/sdk';
import type { LabelSelector, PolicyConfig, RuleWithOperations, WebhooksConfig } from '../config/types.ts';
import { ConfigError } from '../errors.ts';

/** Marks objects the host created; a same-named object without it is never touched. */
export const MANAGED_BY_LABEL = 'app.kubernetes.io/managed-by';
export const MANAGED_BY_VALUE = 'portcullis';
/** Set by Kubernetes on every namespace from 1.21 on (on 1.20 only if someone labels it). */
export const NAMESPACE_NAME_LABEL = 'kubernetes.io/metadata.name';
/** Opt-out that works on every version: label a namespace portcullis.dev/ignore=true. */
export const IGNORE_LABEL = 'portcullis.dev/ignore';

/**
 * Rules for a policy that names none. The host evaluates such a policy for every request it
 * receives, but asking the apiserver for literally everything (`*\/*`, CONNECT) would route
 * every status update and exec through the webhook: a heavy load and, with Fail, a cluster
 * that cannot even record Pod status while the host is down. So: every main resource of
 * every group, on CREATE, UPDATE and DELETE, in namespaces only. Cluster-scoped objects are
 * left out because no namespace exclusion reaches them: with Fail and the host down, the
 * `*` scope blocked Namespaces, Nodes, RBAC and the TokenReviews and SubjectAccessReviews
 * that `kubectl auth can-i` and every delegated authorizer send (red team). A policy that
 * needs any of these, subresources or CONNECT says so in its `rules`.
 */
export const DEFAULT_RULES: readonly RuleWithOperations[] = [
  { operations: ['CREATE', 'UPDATE', 'DELETE'], apiGroups: ['*'], apiVersions: ['*'], resources: ['*'], scope: 'Namespaced' },
];

export const ADMISSION_REVIEW_VERSIONS = ['v1', 'v1beta1'];

export interface ManagedPolicy {
  config: PolicyConfig;
  modes: readonly Mode[];
}

export interface BuildInput {
  /** webhooks.managed: the name of both configurations and the suffix of every webhook. */
  name: string;
  policies: readonly ManagedPolicy[];
  webhooks: WebhooksConfig;
  /** PEM of the CA(s) that sign the serving certificate; absent when serving plain HTTP. */
  caBundle?: string;
  /** Namespaces no webhook applies to: webhooks.excludeNamespaces plus the host's own. */
  excludeNamespaces: readonly string[];
}

export interface DesiredConfigurations {
  validating: V1ValidatingWebhookConfiguration;
  mutating: V1MutatingWebhookConfiguration;
}

/**
 * The host's own namespace: where its Lease lives and which its webhooks must never cover
 * (a webhook that covers the namespace of the Pods that answer it can stop them from ever
 * being recreated). webhooks.namespace, else POD_NAMESPACE (the downward API), else the
 * Service's namespace, else "default" (where the Lease then goes).
 */
export function hostNamespace(webhooks: WebhooksConfig, env: NodeJS.ProcessEnv = process.env): string {
  return configuredNamespace(webhooks, env) ?? 'default';
}

/** The host's namespace as configured or told (undefined: nothing says, and hostNamespace takes "default"). */
export function configuredNamespace(webhooks: WebhooksConfig, env: NodeJS.ProcessEnv = process.env): string | undefined {
  return webhooks.namespace ?? (env.POD_NAMESPACE || undefined) ?? webhooks.service?.namespace;
}

/**
 * What the cluster needs to bring anything back is never covered, whatever the file says:
 * kube-system (DNS, CNI, kube-proxy) and kube-node-lease (every kubelet's heartbeat, an UPDATE
 * every 10 s: with a Fail webhook and the host down, every node went NotReady; red team).
 * `excludeNamespaces` adds to them; it once replaced kube-system without a word.
 */
export const SYSTEM_NAMESPACES: readonly string[] = ['kube-system', 'kube-node-lease'];

export function excludedNamespaces(webhooks: WebhooksConfig, env: NodeJS.ProcessEnv = process.env): string[] {
  return [...new Set([hostNamespace(webhooks, env), ...SYSTEM_NAMESPACES, ...webhooks.excludeNamespaces])].sort();
}

/**
 * The apiserver requires webhook names to be fully qualified (at least three dot-separated
 * segments, at most 253 characters): `<policy>.<name>` needs a name with a dot in it.
 */
export function checkManagedName(name: string, policies: readonly ManagedPolicy[] = []): void {
  if (!name.includes('.')) throw new ConfigError(`/webhooks/managed: "${name}" must contain a dot (e.g. "portcullis.example.com"): the apiserver requires webhook names "<policy>.${name}" with at least three segments`);
  for (const { config } of policies) {
    const hook = `${config.name}.${name}`;
    if (hook.length > 253) throw new ConfigError(`/webhooks/managed: the webhook name "${hook}" is longer than 253 characters; shorten the policy name or webhooks.managed`);
  }
}

export function buildConfigurations(input: BuildInput): DesiredConfigurations {
  checkManagedName(input.name, input.policies);
  const validators = input.policies.filter((p) => p.modes.includes('validate'));
  const mutators = input.policies.filter((p) => p.modes.includes('mutate'));
  const metadata = () => ({ name: input.name, labels: { [MANAGED_BY_LABEL]: MANAGED_BY_VALUE } });
  const validating: V1ValidatingWebhook[] = input.webhooks.singleWebhook
    ? validators.length > 0 ? [singleWebhook(input, 'validate', validators)] : []
    : validators.map((p) => policyWebhook(input, 'validate', p.config));
  const mutating: V1MutatingWebhook[] = input.webhooks.singleWebhook
    ? mutators.length > 0 ? [{ ...singleWebhook(input, 'mutate', mutators), reinvocationPolicy: mutators.some((p) => p.config.reinvocationPolicy === 'IfNeeded') ? 'IfNeeded' : 'Never' }] : []
    : mutators.map((p) => ({ ...policyWebhook(input, 'mutate', p.config), reinvocationPolicy: p.config.reinvocationPolicy }));
  return {
    validating: { apiVersion: 'admissionregistration.k8s.io/v1', kind: 'ValidatingWebhookConfiguration', metadata: metadata(), webhooks: validating },
    mutating: { apiVersion: 'admissionregistration.k8s.io/v1', kind: 'MutatingWebhookConfiguration', metadata: metadata(), webhooks: mutating },
  };
}

function policyWebhook(input: BuildInput, mode: Mode, policy: PolicyConfig): V1ValidatingWebhook {
  // A single match selector is a necessary condition for the policy, so its labelSelector can
  // go to the apiserver as an objectSelector: requests that cannot match never reach us. The
  // host still evaluates the whole selector (kind, namespace, name...).
  const pushed = policy.match.length === 1 ? policy.match[0]!.labelSelector : undefined;
  return {
    name: `${policy.name}.${input.name}`,
    clientConfig: clientConfig(input, `/${mode}/${policy.name}`),
    rules: toRules(policy.rules),
    objectSelector: andSelectors(policy.objectSelector, pushed),
    namespaceSelector: andSelectors(policy.namespaceSelector, exclusion(input.excludeNamespaces, input.webhooks.ignoreLabel)),
    failurePolicy: policy.failurePolicy,
    sideEffects: policy.sideEffects,
    timeoutSeconds: input.webhooks.timeoutSeconds,
    matchPolicy: 'Equivalent',
    admissionReviewVersions: [...ADMISSION_REVIEW_VERSIONS],
  };
}

/**
 * One webhook for every policy of a mode: the apiserver must call it for anything any policy
 * may want, so rules are the union, and object selectors cannot be pushed down (the host
 * picks the policies per request). It fails closed unless every policy fails open.
 */
/**
 * In single-webhook mode, the Ignore policies whose rules go into a Fail webhook (because another
 * policy of the mode is Fail): while the host is down, what only they cover is refused too. Red
 * team: an Ignore no-delete on every DELETE became a fail-closed gate on every DELETE in the
 * cluster, with no word at start.
 */
export function ignoredButFailing(policies: readonly ManagedPolicy[], webhooks: WebhooksConfig): { mode: Mode; policies: string[] }[] {
  if (!webhooks.singleWebhook) return [];
  return (['validate', 'mutate'] as const).flatMap((mode) => {
    const serving = policies.filter((p) => p.modes.includes(mode));
    if (!serving.some((p) => p.config.failurePolicy === 'Fail')) return [];
    const ignored = serving.filter((p) => p.config.failurePolicy === 'Ignore').map((p) => p.config.name);
    return ignored.length > 0 ? [{ mode, policies: ignored }] : [];
  });
}

function singleWebhook(input: BuildInput, mode: Mode, policies: readonly ManagedPolicy[]): V1ValidatingWebhook {
  const everything = policies.some((p) => p.config.rules.length === 0);
  return {
    name: `${mode}.${input.name}`,
    clientConfig: clientConfig(input, `/${mode}`),
    rules: everything ? toRules([]) : unique(policies.flatMap((p) => toRules(p.config.rules))),
    objectSelector: {},
    namespaceSelector: exclusion(input.excludeNamespaces, input.webhooks.ignoreLabel),
    failurePolicy: policies.every((p) => p.config.failurePolicy === 'Ignore') ? 'Ignore' : 'Fail',
    sideEffects: policies.some((p) => p.config.sideEffects === 'NoneOnDryRun') ? 'NoneOnDryRun' : 'None',
    timeoutSeconds: input.webhooks.timeoutSeconds,
    matchPolicy: 'Equivalent',
    admissionReviewVersions: [...ADMISSION_REVIEW_VERSIONS],
  };
}

function clientConfig(input: BuildInput, path: string): AdmissionregistrationV1WebhookClientConfig {
  const caBundle = input.caBundle ? { caBundle: Buffer.from(input.caBundle, 'utf8').toString('base64') } : {};
  const { url, service } = input.webhooks;
  if (url) return { url: `${url.replace(/\/+$/, '')}${path}`, ...caBundle };
  if (service) return { service: { name: service.name, namespace: service.namespace, port: service.port, path }, ...caBundle };
  throw new ConfigError('/webhooks: with "managed" set, give "url" (https://host:port) or "service" so the apiserver can reach the host');
}

function toRules(rules: readonly RuleWithOperations[]): V1RuleWithOperations[] {
  return (rules.length > 0 ? rules : DEFAULT_RULES).map((r) => ({
    operations: [...r.operations], apiGroups: [...r.apiGroups], apiVersions: [...r.apiVersions], resources: [...r.resources], scope: r.scope ?? '*',
  }));
}

function unique<T>(items: T[]): T[] {
  const seen = new Set<string>();
  return items.filter((item) => {
    const key = JSON.stringify(item);
    if (seen.has(key)) return false;
    seen.add(key);
    return true;
  });
}

/**
 * NotIn on the namespace-name label keeps the host's own namespace and kube-system out of
 * every webhook: with failurePolicy Fail and the host down, a webhook covering them would
 * block the very Pods (and Leases) that bring the host back. A namespace without the label
 * (any namespace on Kubernetes 1.20, until labelled) passes NotIn, so the ignore label is a
 * second exit that needs no automatic labelling.
 */
export function exclusion(namespaces: readonly string[], ignoreLabel: string = IGNORE_LABEL): V1LabelSelector {
  const expressions: V1LabelSelectorRequirement[] = [];
  if (namespaces.length > 0) expressions.push({ key: NAMESPACE_NAME_LABEL, operator: 'NotIn', values: [...new Set(namespaces)].sort() });
  // An exit anyone who may label (or create) a namespace can take: webhooks.ignoreLabel: "" closes it.
  if (ignoreLabel !== '') expressions.push({ key: ignoreLabel, operator: 'NotIn', values: ['true'] });
  return { matchExpressions: expressions };
}

/** The selector that matches exactly what all the given selectors match. */
export function andSelectors(...selectors: (LabelSelector | V1LabelSelector | undefined)[]): V1LabelSelector {
  const matchLabels: Record<string, string> = {};
  const expressions: V1LabelSelectorRequirement[] = [];
  for (const selector of selectors) {
    if (!selector) continue;
    for (const [key, value] of Object.entries(selector.matchLabels ?? {})) {
      // Two different required values: keep both as In, which (correctly) matches nothing.
      if (key in matchLabels && matchLabels[key] !== value) expressions.push({ key, operator: 'In', values: [value] });
      else matchLabels[key] = value;
    }
    for (const { key, operator, values } of selector.matchExpressions ?? []) {
      const listed = operator === 'In' || operator === 'NotIn';
      expressions.push({ key, operator, ...(listed ? { values: [...(values ?? [])] } : {}) });
    }
  }
  return {
    ...(Object.keys(matchLabels).length > 0 ? { matchLabels } : {}),
    ...(expressions.length > 0 ? { matchExpressions: expressions } : {}),
  };
}

/** Only the policies that stay registered after the host exits. */
export function persistentOnly(policies: readonly ManagedPolicy[]): ManagedPolicy[] {
  return policies.filter((p) => p.config.persistent);
}
