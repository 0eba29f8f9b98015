// Reads and validates the YAML configuration: JSON Schema first (an error names the path of
// the bad field), then the rules a schema cannot say, then defaults and resolved paths.
import { isIP } from 'node:net';
import { dirname, isAbsolute, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { defaultOf, defaultsAt, describeSchemaError } from './schema.ts';
import { validateConfig as validate } from './validators.generated.ts';
import { ConfigError, errorMessage } from '../errors.ts';
import { readPointedFile } from '../util/files.ts';
import { DEFAULT_LIMITS } from './limits.ts';
import { MAX_CONFIG_BYTES, NotJson, readJsonYaml, ReaderFailed, readYamlBounded, ReadRefused } from './yaml.ts';
import { labelKeyProblem, labelSelectorProblem, labelValueProblem, ruleProblem, webhookUrlProblem } from './apiserver.ts';
import type {
  Config, Grant, LabelSelector, RuleWithOperations, PolicyConfig, RawConfig, RawPolicy, RawRegistries, RawServer, RawTls, RawWebhooks, TlsConfig,
  WebhooksConfig,
} from './types.ts';

export const DEFAULT_PORT: number = defaultOf('server', 'port');

export { nonJsonValue } from './json-values.ts';

export { MAX_CONFIG_BYTES } from './yaml.ts';

/** The file's configuration; a large file is read on a thread of its own, bounded (yaml.ts). */
export async function loadConfigFile(path: string): Promise<Config> {
  let text: string;
  try {
    text = (await readPointedFile(path, MAX_CONFIG_BYTES)).toString('utf8');
  } catch (error) {
    throw new ConfigError(`cannot read the configuration ${path}: ${errorMessage(error)}`);
  }
  let raw: unknown;
  try {
    raw = await readYamlBounded(text);
  } catch (error) {
    throw unreadable(error, path);
  }
  return checkConfig(raw, path);
}

/** A configuration's text, read on this thread (tests, and texts known to be small). */
export function parseConfig(text: string, source: string): Config {
  let raw: unknown;
  try {
    raw = readJsonYaml(text);
  } catch (error) {
    throw unreadable(error, source);
  }
  return checkConfig(raw, source);
}

function unreadable(error: unknown, source: string): ConfigError {
  if (error instanceof NotJson || error instanceof ReadRefused) return new ConfigError(`${source}: ${error.message}`);
  if (error instanceof ReaderFailed) return new ConfigError(`cannot read the configuration ${source}: ${error.message}`);
  return new ConfigError(`${source}: not valid YAML: ${yamlProblem(error)}`);
}

function checkConfig(raw: unknown, source: string): Config {
  if (!validate(raw)) throw new ConfigError(`${source}: ${describeSchemaError(validate.errors?.[0])}`);
  return normalize(raw as RawConfig, source);
}

/**
 * The YAML parser's first line, with the line it points at instead of the excerpt that followed
 * its colon (cut, the message ended in "column 4:" and nothing: newcomer).
 */
export function yamlProblem(error: unknown): string {
  const [first = '', ...excerpt] = errorMessage(error).split('\n');
  const caret = excerpt.findIndex((line) => /^\s*\^+\s*$/.test(line));
  const near = excerpt.slice(0, caret === -1 ? excerpt.length : caret).map((line) => line.trim()).filter((line) => line !== '').at(-1);
  return first.replace(/:\s*$/, '') + (near ? ` (near "${near.length > 80 ? `${near.slice(0, 80)}…` : near}")` : '');
}

/**
 * Fills in the schema's defaults and resolves paths; what is left here is what a schema cannot
 * say: defaults that fall back through the file's own `defaults:` section, rules across
 * fields, and paths relative to the file.
 */
function normalize(raw: RawConfig, source: string): Config {
  const base = dirname(source);
  const defaults = raw.defaults ?? {};
  // The schema gives a default for every field the types below make required
  // (test/unit/config-schema.test.ts checks it).
  const server = { ...defaultsAt<RawServer>('server'), ...raw.server } as Required<Omit<RawServer, 'tls' | 'metricsPort'>> & RawServer;
  const webhooks = { ...defaultsAt<RawWebhooks>('webhooks'), ...raw.webhooks } as Omit<WebhooksConfig, 'service'> & RawWebhooks;
  checkWebhooks(webhooks, `${source}: /webhooks`);
  const names = new Set<string>();
  const policies = raw.policies.map((p, index): PolicyConfig => {
    if (names.has(p.name)) throw new ConfigError(`${source}: /policies/${index}/name: "${p.name}" is used twice; policy names must be unique`);
    names.add(p.name);
    checkPolicySelectors(p, `${source}: /policies/${index}`);
    const limits = { ...DEFAULT_LIMITS, ...defaults.limits, ...p.limits };
    // The apiserver gives up after timeoutSeconds; a policy must be stopped before that so the
    // response can still say which policy was too slow.
    if (limits.timeoutMs >= webhooks.timeoutSeconds * 1000) {
      // Say where the value came from: a file that never wrote it was told to fix a field it lacked (red team).
      const from = p.limits?.timeoutMs !== undefined ? '' : defaults.limits?.timeoutMs !== undefined ? ', from defaults.limits' : ', the default';
      throw new ConfigError(`${source}: /policies/${index}/limits/timeoutMs (${limits.timeoutMs}${from}) must be below the webhook timeout ` +
        `(webhooks.timeoutSeconds: ${webhooks.timeoutSeconds}s); set a lower limits.timeoutMs, or a longer webhooks.timeoutSeconds`);
    }
    const { digest, modes, objectSelector, namespaceSelector, ...rest } = { ...defaultsAt<RawPolicy>('policies'), ...p };
    return {
      ...rest,
      module: resolveModule(p.module, base),
      ...(modes ? { modes } : {}),
      ...(digest ? { digest } : {}),
      ...(objectSelector ? { objectSelector } : {}),
      ...(namespaceSelector ? { namespaceSelector } : {}),
      settings: p.settings ?? {},
      limits,
      failurePolicy: p.failurePolicy ?? defaults.failurePolicy ?? defaultOf('failurePolicy'),
      enforcement: p.enforcement ?? defaults.enforcement ?? defaultOf('enforcement'),
      isolation: p.isolation ?? defaults.isolation ?? defaultOf('isolation'),
      persistent: rest.persistent ?? false,
      sideEffects: rest.sideEffects ?? 'None',
      reinvocationPolicy: rest.reinvocationPolicy ?? 'Never',
      rules: checkRules(p.rules ?? [], `${source}: /policies/${index}/rules`),
      rulesGiven: p.rules !== undefined,
      match: p.match ?? [],
      context: uniqueGrants(p.context ?? [], source, index),
    };
  });
  if (server.tls?.mode === 'secret' && !(webhooks.managed && webhooks.service)) {
    throw new ConfigError(`${source}: /server/tls: mode "secret" keeps the certificate for the in-cluster Service: set webhooks.managed and webhooks.service (its DNS names go in the certificate)`);
  }
  if (webhooks.managed && !webhooks.url && !webhooks.service) {
    throw new ConfigError(`${source}: /webhooks: with "managed" set, give "url" (https://host:port) or "service" so the apiserver can reach the host`);
  }
  const { tls, metricsPort, ...serverRest } = server;
  const { service, ...webhooksRest } = webhooks;
  const registries = { ...defaultsAt<RawRegistries>('registries'), ...raw.registries };
  return {
    source,
    server: { ...serverRest, tls: normalizeTls(tls ?? {}, base), ...(metricsPort !== undefined ? { metricsPort } : {}) },
    workers: raw.workers ?? defaultOf('workers'),
    instancesPerPolicy: raw.instancesPerPolicy ?? defaultOf('instancesPerPolicy'),
    logLevel: raw.logLevel ?? defaultOf('logLevel'),
    policies,
    webhooks: {
      ...webhooksRest,
      ...(service ? { service: { port: defaultOf<number>('webhooks', 'service', 'port'), ...service } } : {}),
    },
    registries: {
      insecure: registries.insecure ?? [],
      ...(registries.dockerConfig ? { dockerConfig: resolve(base, registries.dockerConfig) } : {}),
      ...(registries.cacheDir ? { cacheDir: resolve(base, registries.cacheDir) } : {}),
    },
    cache: { maxMiB: raw.cache?.maxMiB ?? defaultOf<number>('cache', 'maxMiB') },
  };
}

/**
 * What the apiserver's validation of a webhook configuration would refuse (apiserver.ts). Accepted
 * here, such a value failed every webhook sync after a reload, and the exit patch too, with the
 * removed policies' Fail webhooks left in place (red team): refused at load instead, so the old
 * configuration keeps serving.
 */
function checkRules(rules: RuleWithOperations[], where: string): RuleWithOperations[] {
  const problem = ruleProblem(rules);
  if (problem) throw new ConfigError(`${where}${problem.path}: ${problem.message}`);
  return rules;
}

function checkSelector(selector: LabelSelector | undefined, where: string): void {
  const problem = selector && labelSelectorProblem(selector);
  if (problem) throw new ConfigError(`${where}${problem.path}: ${problem.message}`);
}

/**
 * A policy's selectors go to the apiserver: objectSelector and namespaceSelector always, and the
 * labelSelector of `match` when it is the only entry. All match entries are checked, so removing
 * a sibling entry cannot make a loaded file unsyncable.
 */
function checkPolicySelectors(p: RawPolicy, where: string): void {
  checkSelector(p.objectSelector, `${where}/objectSelector`);
  checkSelector(p.namespaceSelector, `${where}/namespaceSelector`);
  for (const [j, m] of (p.match ?? []).entries()) checkSelector(m.labelSelector, `${where}/match/${j}/labelSelector`);
}

/**
 * The parts of `webhooks` that end up in both configurations: the URL, the ignore label (a
 * NotIn key) and the excluded namespaces (NotIn values on kubernetes.io/metadata.name).
 */
function checkWebhooks(webhooks: RawWebhooks, where: string): void {
  if (webhooks.url !== undefined) {
    const problem = webhookUrlProblem(webhooks.url);
    if (problem) throw new ConfigError(`${where}/url: ${JSON.stringify(webhooks.url)}: ${problem}`);
  }
  if (webhooks.ignoreLabel) {
    const problem = labelKeyProblem(webhooks.ignoreLabel);
    if (problem) throw new ConfigError(`${where}/ignoreLabel: ${JSON.stringify(webhooks.ignoreLabel)} is not a valid label key: ${problem}`);
  }
  if (!webhooks.managed) return;
  const namespaces: [string, string | undefined][] = [
    ...(webhooks.excludeNamespaces ?? []).map((ns, i): [string, string] => [`/excludeNamespaces/${i}`, ns]),
    ['/namespace', webhooks.namespace],
    ['/service/namespace', webhooks.service?.namespace],
  ];
  for (const [path, ns] of namespaces) {
    const problem = ns === undefined ? undefined : labelValueProblem(ns);
    // The apiserver (1.26 on) refuses it as a NotIn value; it could not name a namespace anyway.
    if (problem) throw new ConfigError(`${where}${path}: ${JSON.stringify(ns)} cannot be a namespace name (the webhooks exclude it with a label selector, and ${problem})`);
  }
}

/** A DNS name a certificate can cover: labels of letters, digits and inner hyphens, an optional leading wildcard, at most 253 characters. */
const DNS_NAME = /^(?=.{1,253}$)(\*\.)?[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*$/i;

/**
 * A certificate for a name that is neither covers nothing a client can ask for: it was made at
 * every start, and never matched (red team 5: "ünïcode.example", "exa mple"; review 8: a zoned
 * IPv6 address).
 */
function checkHostnames(names: string[]): void {
  for (const [i, name] of names.entries()) {
    if ((isIP(name) && !name.includes('%')) || DNS_NAME.test(name)) continue;
    const hint = name.endsWith('.') && DNS_NAME.test(name.slice(0, -1)) ? 'write it without the trailing dot'
      : name.includes('%') ? 'a certificate cannot name an IPv6 zone'
      : 'letters, digits and hyphens in dot-separated labels, `*.` at most in front; write an internationalised name in its xn-- form';
    throw new ConfigError(`/server/tls/hostnames/${i}: ${JSON.stringify(name)} is neither an IP address nor a DNS name (${hint})`);
  }
}

function normalizeTls(tls: RawTls, base: string): TlsConfig {
  const defaults = defaultsAt<RawTls>('server', 'tls');
  const mode = tls.mode ?? (tls.certFile ? 'files' : 'self-signed');
  const client = { ...(tls.clientCA ? { clientCA: resolve(base, tls.clientCA) } : {}), requireClientCert: tls.requireClientCert ?? Boolean(tls.clientCA) };
  if (mode === 'insecure') return { mode };
  // Files mode ignores them: a leftover entry there is no reason to refuse the file.
  if (mode !== 'files') checkHostnames(tls.hostnames ?? []);
  if (mode === 'secret') {
    return {
      mode, secretName: tls.secretName ?? defaults.secretName!, ...(tls.hostnames ? { hostnames: tls.hostnames } : {}),
      validityDays: tls.validityDays ?? defaults.validityDays!, ...client,
    };
  }
  if (mode === 'files') {
    if (!tls.certFile || !tls.keyFile) throw new ConfigError('/server/tls: mode "files" needs certFile and keyFile');
    return {
      mode, certFile: resolve(base, tls.certFile), keyFile: resolve(base, tls.keyFile), ...(tls.caFile ? { caFile: resolve(base, tls.caFile) } : {}), ...client,
    };
  }
  // Only a self-signed certificate needs names of its own; a Secret's come from the Service.
  return { mode: 'self-signed', hostnames: tls.hostnames ?? ['localhost', '127.0.0.1'], ...(tls.cadump ? { cadump: resolve(base, tls.cadump) } : {}), ...client };
}

/** A grant listed twice is harmless but almost always a typo for another kind: say so. */
function uniqueGrants(grants: Grant[], source: string, index: number): Grant[] {
  const seen = new Set<string>();
  for (const [i, g] of grants.entries()) {
    const key = `${g.apiVersion} ${g.kind}`;
    if (seen.has(key)) throw new ConfigError(`${source}: /policies/${index}/context/${i}: ${g.kind} (${g.apiVersion}) is granted twice`);
    seen.add(key);
  }
  return grants.map((g) => ({ apiVersion: g.apiVersion, kind: g.kind }));
}

/** Module paths in the file are relative to the file; oci:// and absolute ones stay as they are. */
function resolveModule(module: string, base: string): string {
  if (/^[a-z][a-z0-9+.-]*:\/\//i.test(module) && !module.startsWith('file://')) return module;
  const path = module.startsWith('file://') ? (module.startsWith('file:///') ? fileURLToPath(module) : module.slice('file://'.length)) : module;
  return isAbsolute(path) ? path : resolve(base, path);
}
