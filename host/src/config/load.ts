// Reads and validates the YAML configuration: JSON Schema first (an error names the path of
// the bad field), then the rules a schema cannot say, then defaults and resolved paths.
import { readFile } from 'node:fs/promises';
import { dirname, isAbsolute, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Ajv, type ErrorObject } from 'ajv';
import { parse as parseYaml } from 'yaml';
import schema from '../../config.schema.json' with { type: 'json' };
import { ConfigError, errorMessage } from '../errors.ts';
import { DEFAULT_LIMITS } from './limits.ts';
import type { Grant } from './types.ts';
import type { Config, PolicyConfig, TlsConfig } from './types.ts';

const ajv = new Ajv({ allErrors: false, strict: false });
const validate = ajv.compile(schema);

export const DEFAULT_PORT = 8443;
const DEFAULT_TIMEOUT_SECONDS = 10;

type Raw = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any -- schema-checked JSON

export async function loadConfigFile(path: string): Promise<Config> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (error) {
    throw new ConfigError(`cannot read the configuration ${path}: ${errorMessage(error)}`);
  }
  return parseConfig(text, path);
}

export function parseConfig(text: string, source: string): Config {
  let raw: unknown;
  try {
    raw = parseYaml(text);
  } catch (error) {
    throw new ConfigError(`${source}: not valid YAML: ${errorMessage(error).split('\n')[0]}`);
  }
  if (!validate(raw)) throw new ConfigError(`${source}: ${describeSchemaError(validate.errors?.[0])}`);
  return normalize(raw as Raw, source);
}

function describeSchemaError(error: ErrorObject | undefined): string {
  if (!error) return 'invalid configuration';
  const path = error.instancePath || '/';
  if (error.keyword === 'additionalProperties') return `${path}: unknown field "${String(error.params.additionalProperty)}"`;
  if (error.keyword === 'required') return `${path}: missing required field "${String(error.params.missingProperty)}"`;
  if (error.keyword === 'enum') return `${path} must be one of ${(error.params.allowedValues as unknown[]).map((v) => JSON.stringify(v)).join(', ')}`;
  return `${path} ${error.message ?? 'is invalid'}`;
}

function normalize(raw: Raw, source: string): Config {
  const base = dirname(source);
  const defaults: Raw = raw.defaults ?? {};
  const webhookTimeout: number = raw.webhooks?.timeoutSeconds ?? DEFAULT_TIMEOUT_SECONDS;
  const names = new Set<string>();
  const policies = (raw.policies as Raw[]).map((p, index): PolicyConfig => {
    if (names.has(p.name)) throw new ConfigError(`${source}: /policies/${index}/name: "${p.name}" is used twice; policy names must be unique`);
    names.add(p.name);
    const limits = { ...DEFAULT_LIMITS, ...defaults.limits, ...p.limits };
    // The apiserver gives up after timeoutSeconds; a policy must be stopped before that so the
    // response can still say which policy was too slow.
    if (limits.timeoutMs >= webhookTimeout * 1000) {
      throw new ConfigError(`${source}: /policies/${index}/limits/timeoutMs (${limits.timeoutMs}) must be below the webhook timeout (${webhookTimeout}s)`);
    }
    return {
      name: p.name,
      module: resolveModule(p.module, base),
      ...(p.modes ? { modes: p.modes } : {}),
      settings: p.settings ?? {},
      limits,
      failurePolicy: p.failurePolicy ?? defaults.failurePolicy ?? 'Fail',
      enforcement: p.enforcement ?? defaults.enforcement ?? 'enforce',
      isolation: p.isolation ?? defaults.isolation ?? 'reuse',
      ...(p.digest ? { digest: p.digest } : {}),
      persistent: p.persistent ?? false,
      rules: p.rules ?? [],
      rulesGiven: p.rules !== undefined,
      ...(p.objectSelector ? { objectSelector: p.objectSelector } : {}),
      ...(p.namespaceSelector ? { namespaceSelector: p.namespaceSelector } : {}),
      match: p.match ?? [],
      sideEffects: p.sideEffects ?? 'None',
      reinvocationPolicy: p.reinvocationPolicy ?? 'Never',
      context: uniqueGrants(p.context ?? [], source, index),
    };
  });
  const server: Raw = raw.server ?? {};
  const webhooks: Raw = raw.webhooks ?? {};
  if (server.tls?.mode === 'secret' && !(webhooks.managed && webhooks.service)) {
    throw new ConfigError(`${source}: /server/tls: mode "secret" keeps the certificate for the in-cluster Service: set webhooks.managed and webhooks.service (its DNS names go in the certificate)`);
  }
  if (webhooks.managed && !webhooks.url && !webhooks.service) {
    throw new ConfigError(`${source}: /webhooks: with "managed" set, give "url" (https://host:port) or "service" so the apiserver can reach the host`);
  }
  return {
    source,
    server: {
      host: server.host ?? '0.0.0.0',
      port: server.port ?? DEFAULT_PORT,
      tls: normalizeTls(server.tls ?? {}, base),
      maxBodyBytes: server.maxBodyBytes ?? 3 * 2 ** 20,
      headersTimeoutMs: server.headersTimeoutMs ?? 10_000,
      requestTimeoutMs: server.requestTimeoutMs ?? 30_000,
      ...(server.metricsPort !== undefined ? { metricsPort: server.metricsPort } : {}),
      readyWhenAllPoliciesLoaded: server.readyWhenAllPoliciesLoaded ?? false,
      logAllowedReviews: server.logAllowedReviews ?? false,
    },
    workers: raw.workers ?? 0,
    logLevel: raw.logLevel ?? 'info',
    policies,
    webhooks: {
      ...(webhooks.managed ? { managed: webhooks.managed } : {}),
      singleWebhook: webhooks.singleWebhook ?? false,
      timeoutSeconds: webhookTimeout,
      ...(webhooks.url ? { url: webhooks.url } : {}),
      ...(webhooks.service ? { service: { port: 443, ...webhooks.service } } : {}),
      ...(webhooks.namespace ? { namespace: webhooks.namespace } : {}),
      excludeNamespaces: webhooks.excludeNamespaces ?? ['kube-system'],
      leaderElection: webhooks.leaderElection ?? true,
      leaseDurationSeconds: webhooks.leaseDurationSeconds ?? 15,
      resyncSeconds: webhooks.resyncSeconds ?? 60,
    },
    registries: {
      insecure: raw.registries?.insecure ?? [],
      ...(raw.registries?.dockerConfig ? { dockerConfig: resolve(base, raw.registries.dockerConfig) } : {}),
      ...(raw.registries?.cacheDir ? { cacheDir: resolve(base, raw.registries.cacheDir) } : {}),
    },
  };
}

function normalizeTls(tls: Raw, base: string): TlsConfig {
  const mode = tls.mode ?? (tls.certFile ? 'files' : 'self-signed');
  const client = { ...(tls.clientCA ? { clientCA: resolve(base, tls.clientCA) } : {}), requireClientCert: tls.requireClientCert ?? Boolean(tls.clientCA) };
  if (mode === 'insecure') return { mode };
  if (mode === 'secret') {
    return {
      mode, secretName: tls.secretName ?? 'portcullis-tls', ...(tls.hostnames ? { hostnames: tls.hostnames } : {}),
      validityDays: tls.validityDays ?? 365, ...client,
    };
  }
  if (mode === 'files') {
    if (!tls.certFile || !tls.keyFile) throw new ConfigError('/server/tls: mode "files" needs certFile and keyFile');
    return { mode, certFile: resolve(base, tls.certFile), keyFile: resolve(base, tls.keyFile), ...(tls.caFile ? { caFile: resolve(base, tls.caFile) } : {}), ...client };
  }
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
