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
/** enforce: denials deny; warn: a trial (denials and failures are warnings, its patch yields in a conflict); audit: decisions are only logged and counted. */
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

// ---- The file as written: exactly the fields of config.schema.json (checked by
// test/unit/config-schema.test.ts). Optional unless the schema requires them.

export type LogLevel = 'debug' | 'info' | 'warn' | 'error';
export type TlsMode = 'self-signed' | 'files' | 'secret' | 'insecure';

export interface RawConfig {
  server?: RawServer;
  workers?: number;
  instancesPerPolicy?: number;
  logLevel?: LogLevel;
  defaults?: RawDefaults;
  policies: RawPolicy[];
  webhooks?: RawWebhooks;
  registries?: RawRegistries;
  cache?: RawCache;
}

export interface RawServer {
  host?: string;
  port?: number;
  maxBodyBytes?: number;
  headersTimeoutMs?: number;
  requestTimeoutMs?: number;
  bodyTimeoutMs?: number;
  maxConnections?: number;
  maxConnectionsPerAddress?: number;
  maxBodyBytesInFlight?: number;
  shutdownDelayMs?: number;
  metricsPort?: number;
  readyWhenAllPoliciesLoaded?: boolean;
  logAllowedReviews?: boolean;
  tls?: RawTls;
}

export interface RawTls {
  mode?: TlsMode;
  secretName?: string;
  validityDays?: number;
  hostnames?: string[];
  cadump?: string;
  certFile?: string;
  keyFile?: string;
  caFile?: string;
  clientCA?: string;
  requireClientCert?: boolean;
}

export interface RawDefaults {
  limits?: Partial<SandboxLimits>;
  failurePolicy?: FailurePolicy;
  enforcement?: Enforcement;
  isolation?: Isolation;
}

export interface RawPolicy {
  name: string;
  module: string;
  digest?: string;
  modes?: Mode[];
  settings?: JsonValue;
  limits?: Partial<SandboxLimits>;
  failurePolicy?: FailurePolicy;
  enforcement?: Enforcement;
  isolation?: Isolation;
  persistent?: boolean;
  sideEffects?: 'None' | 'NoneOnDryRun';
  reinvocationPolicy?: 'Never' | 'IfNeeded';
  rules?: RuleWithOperations[];
  objectSelector?: LabelSelector;
  namespaceSelector?: LabelSelector;
  match?: ResourceSelector[];
  context?: Grant[];
}

export interface RawWebhooks {
  managed?: string;
  singleWebhook?: boolean;
  timeoutSeconds?: number;
  url?: string;
  service?: { name: string; namespace: string; port?: number };
  namespace?: string;
  excludeNamespaces?: string[];
  /** The namespace label that opts a namespace out of every managed webhook (value "true"); "": none. */
  ignoreLabel?: string;
  leaderElection?: boolean;
  leaseDurationSeconds?: number;
  resyncSeconds?: number;
}

export interface RawCache {
  maxMiB?: number;
}

export interface RawRegistries {
  insecure?: string[];
  dockerConfig?: string;
  cacheDir?: string;
}

// ---- The configuration as the rest of the host sees it.

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

/** Every field of the file's `server` with its schema default; tls resolved by mode. */
export type ServerConfig = Required<Omit<RawServer, 'tls' | 'metricsPort'>> & {
  tls: TlsConfig;
  /** Plain-HTTP listener for /metrics, /healthz and /readyz only; absent: off. */
  metricsPort?: number;
};

/**
 * The file's `webhooks` with schema defaults. managed (absent: management off), url / service
 * (how the apiserver reaches us) and namespace (where the Lease lives) have none.
 */
export type WebhooksConfig = Required<Omit<RawWebhooks, 'managed' | 'url' | 'service' | 'namespace'>> & {
  managed?: string;
  url?: string;
  service?: { name: string; namespace: string; port: number };
  namespace?: string;
};

export interface Config {
  /** The file it came from, for messages and reload; undefined for the built-in set. */
  source?: string;
  server: ServerConfig;
  workers: number;
  /** 0: automatic (pool.ts plan()). */
  instancesPerPolicy: number;
  logLevel: LogLevel;
  policies: PolicyConfig[];
  webhooks: WebhooksConfig;
  registries: { insecure: string[]; dockerConfig?: string; cacheDir?: string };
  /** The on-disk cache's budget (cache/prune.ts); 0: never pruned. */
  cache: { maxMiB: number };
}
