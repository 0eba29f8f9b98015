// The configuration, as the rest of the host sees it: validated, defaults filled in, module
// paths resolved. The file format is described by schema.ts and docs/configuration.md.
import type { JsonValue, Mode } from '@portcullis/sdk';
import type { SandboxLimits } from './limits.ts';

/** A kind of cluster object a policy may read (its `context` grants). */
export interface Grant {
  apiVersion: string;
  kind: string;
}

export type FailurePolicy = 'Fail' | 'Ignore';
/** enforce: denials deny; warn: denials become warnings; audit: decisions are only logged and counted. */
export type Enforcement = 'enforce' | 'warn' | 'audit';
export type Isolation = 'reuse' | 'fresh';

export interface LabelSelector {
  matchLabels?: Record<string, string>;
  matchExpressions?: { key: string; operator: 'In' | 'NotIn' | 'Exists' | 'DoesNotExist'; values?: string[] }[];
}

export interface RuleWithOperations {
  operations: string[];
  apiGroups: string[];
  apiVersions: string[];
  resources: string[];
  scope?: 'Cluster' | 'Namespaced' | '*';
}

/** kinitiras-style resource selector, evaluated in the host. Every given field must match. */
export interface ResourceSelector {
  apiVersion?: string;
  kind?: string;
  namespace?: string;
  name?: string;
  labelSelector?: LabelSelector;
  fieldSelector?: string;
}

export interface PolicyConfig {
  name: string;
  module: string;
  /** Which webhooks the policy serves; default: every mode the module has. */
  modes?: Mode[];
  settings: JsonValue;
  limits: SandboxLimits;
  failurePolicy: FailurePolicy;
  enforcement: Enforcement;
  isolation: Isolation;
  /** Pin: refuse the module unless its sha256 is this ("sha256:<hex>"). */
  digest?: string;
  persistent: boolean;
  rules: RuleWithOperations[];
  /** False when the file gave no rules: the module's embedded default rules may fill them in. */
  rulesGiven?: boolean;
  objectSelector?: LabelSelector;
  namespaceSelector?: LabelSelector;
  /** Any of these selectors must match (none given: everything the rules admit). */
  match: ResourceSelector[];
  sideEffects: 'None' | 'NoneOnDryRun';
  reinvocationPolicy: 'Never' | 'IfNeeded';
  /** Kinds of cluster object the policy may read (docs/policy-contract.md, "Context"); none by default. */
  context?: Grant[];
}

export type TlsConfig =
  | { mode: 'self-signed'; hostnames: string[]; cadump?: string; clientCA?: string; requireClientCert: boolean }
  | { mode: 'files'; certFile: string; keyFile: string; caFile?: string; clientCA?: string; requireClientCert: boolean }
  /** A CA and serving certificate the host keeps in a Secret of its namespace (see certs/). */
  | { mode: 'secret'; secretName: string; hostnames?: string[]; validityDays: number; clientCA?: string; requireClientCert: boolean }
  | { mode: 'insecure' };

export interface ServerConfig {
  host: string;
  port: number;
  tls: TlsConfig;
  maxBodyBytes: number;
  headersTimeoutMs: number;
  requestTimeoutMs: number;
  /** Plain-HTTP listener for /metrics, /healthz and /readyz only; absent: off. */
  metricsPort?: number;
  /** /readyz answers 503 while any policy of the current set failed to load. */
  readyWhenAllPoliciesLoaded: boolean;
  /** Log allowed and mutated reviews at info level too (with the requesting user). */
  logAllowedReviews: boolean;
}

export interface WebhooksConfig {
  /** Name of the managed Validating/MutatingWebhookConfiguration; absent: management off. */
  managed?: string;
  /** One webhook per policy (false) or one for /validate and one for /mutate (true). */
  singleWebhook: boolean;
  timeoutSeconds: number;
  /** How the apiserver reaches us: a URL base, or an in-cluster Service. */
  url?: string;
  service?: { name: string; namespace: string; port: number };
  /** Namespaces no managed webhook ever applies to (the host's own is added when known). */
  excludeNamespaces: string[];
  namespace?: string;
  leaderElection: boolean;
  leaseDurationSeconds: number;
  /** How often the leader re-applies the configurations, undoing drift. */
  resyncSeconds: number;
}

export interface Config {
  /** The file it came from, for messages and reload; undefined for the built-in set. */
  source?: string;
  server: ServerConfig;
  workers: number;
  logLevel: 'debug' | 'info' | 'warn' | 'error';
  policies: PolicyConfig[];
  webhooks: WebhooksConfig;
  registries: { insecure: string[]; dockerConfig?: string; cacheDir?: string };
}
