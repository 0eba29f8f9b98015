// `portcullis run`: one policy (or every matching policy of a configuration), one request, the
// response review on stdout. The request is an AdmissionReview, a bare AdmissionRequest, or a
// plain manifest (JSON or YAML) that flags turn into a request. Exit 0 whatever the decision; 1
// when the command could not produce a decision (unreadable input, a policy that failed to load,
// crashed, timed out, returned garbage or a patch that does not apply), with one line on stderr saying why.
import { resolve } from 'node:path';
import { isDeepStrictEqual, parseArgs } from 'node:util';
import type { AdmissionRequest, JsonValue, Mode, PatchOperation } from '@portcullis/sdk';
import { parse as parseYaml } from 'yaml';
import { loadContext, loadContextObjects } from './context.ts';
import { andSelectors, DEFAULT_RULES, excludedNamespaces } from '../webhooks/build.ts';
import { evaluateEntry, evaluatePolicy } from '../evaluate/evaluate.ts';
import type { Outcome } from '../sandbox/outcome.ts';
import { ConfigError, errorMessage } from '../errors.ts';
import { merge } from '../merge/merge.ts';
import { patchedObject } from '../merge/patches.ts';
import { loadPolicy } from '../policy/load.ts';
import { parseReview, type AdmissionReview } from '../review/parse.ts';
import { respond, type Decision } from '../review/respond.ts';
import { loadConfigFile, nonJsonValue, yamlProblem } from '../config/load.ts';
import type { PolicyConfig } from '../config/types.ts';
import { loadPolicySet, type PolicyEntry } from '../policy/policy-set.ts';
import { policyNameOf, type RegistryOptions } from '../policy/source.ts';
import { policyMatches } from '../select/match.ts';
import { isAdmissionRequest, isObject, requestFor, wholeRequest } from './request.ts';
import { SandboxPool } from '../sandbox/pool.ts';
import { DEFAULT_LIMITS } from '../config/limits.ts';
import { readPointedFile } from '../util/files.ts';
import { notBuiltYet, settingsFrom, UsageError } from './usage.ts';

export const RUN_USAGE = 'usage: portcullis run (--policy FILE.wasm | --config portcullis.yaml) --request REVIEW|REQUEST|MANIFEST [--settings JSON|FILE]\n' +
  '         [--mode validate|mutate] [--show response|patched] [--context OBJECTS.yaml [--grant apiVersion/Kind ...]]\n' +
  '         for a plain manifest: [--operation CREATE|UPDATE|DELETE|CONNECT] [--old-object FILE] [--namespace NS] [--user NAME] [--groups a,b]';

export default async function run(args: string[]): Promise<number> {
  const values = parseCli(args);
  if ((!values.policy && !values.config) || !values.request) throw new UsageError(RUN_USAGE);
  if (values.policy && values.config) throw new UsageError('give --policy or --config, not both');
  if (values.mode !== undefined && values.mode !== 'validate' && values.mode !== 'mutate') throw new UsageError(`--mode must be validate or mutate, not "${values.mode}"`);
  if (values.show !== undefined && values.show !== 'response' && values.show !== 'patched') throw new UsageError(`--show must be response or patched, not "${values.show}"`);
  const review = await readRequest(values);
  const registryFlags: RegistryOptions = { insecure: [], ...(values['docker-config'] ? { dockerConfig: values['docker-config'] } : {}) };
  if (values.config) {
    // Each policy's grants are its own `context:` in the file; narrowing them is done there.
    if (values.grant?.length) throw new UsageError('--grant goes with --policy; with --config each policy reads what its context: list in the configuration grants');
    return runConfig(values.config, review, values.mode, values.show === 'patched', registryFlags, values.insecure ?? false, values.context);
  }
  // oci:// modules: --insecure allows plain HTTP to the module's registry (a loopback registry).
  if (values.insecure && values.policy!.startsWith('oci://')) registryFlags.insecure.push(registryOf(values.policy!));
  const module = values.policy!;
  const settings = values.settings === undefined ? {} : await parseSettings(values.settings);
  const name = policyNameOf(module);
  const limits = {
    ...DEFAULT_LIMITS,
    ...(values['timeout-ms'] ? { timeoutMs: positive(values['timeout-ms'], '--timeout-ms') } : {}),
    ...(values['memory-mib'] ? { memoryMiB: positive(values['memory-mib'], '--memory-mib') } : {}),
  };
  // Issue 15: cluster objects the policy may read, from a file instead of a cluster.
  const context = values.context === undefined ? undefined : await loadContext(values.context, values.grant ?? []);
  const pool = new SandboxPool(1);
  try {
    context?.hub.attach(pool);
    const policy = await loadPolicy(pool, {
      name, module, settings, limits, failurePolicy: 'Fail', enforcement: 'enforce', isolation: 'reuse',
      ...(context ? { context: context.grants } : {}),
    }, undefined, registryFlags).catch(notBuiltYet(module)).catch(settingsFrom('--settings'));
    const mode: Mode = (values.mode) ?? (policy.modes.includes('validate') ? 'validate' : 'mutate');
    if (!policy.modes.includes(mode)) throw new ConfigError(`policy "${name}" (${values.policy}) does not ${mode}; it supports: ${policy.modes.join(', ')}`);
    const outcome = await evaluatePolicy(pool, policy, mode, {
      request: review.request, settings, headers: {}, sslpeer: null, dryRun: review.request.dryRun === true, webhook: `/${mode}/${name}`,
    });
    const { decision } = merge([{ policy, outcome }], review.request.operation, review.request.object);
    printLogs(outcome);
    print(review, decision, values.show === 'patched');
    // An answer the merge could not use (a patch that does not apply) fails the policy too: the
    // response said so, and the exit status said all was well (red team).
    const unusable = outcome.status === 'allowed' && !decision.allowed
      ? (decision.status?.message?.replace(`policy "${name}": `, '') ?? 'its answer could not be used') : undefined;
    if (outcome.status === 'failed' || unusable !== undefined) {
      const why = outcome.status === 'failed' ? outcome.message : unusable!;
      process.stderr.write(`portcullis run: policy "${name}" (${values.policy}) failed on request ${review.request.uid}: ${why}\n`);
      const hint = grantHint(why, values.context, values.grant);
      if (hint) process.stderr.write(`portcullis run: ${hint}\n`);
      return 1;
    }
    return 0;
  } finally {
    await pool.close();
  }
}

/**
 * A missing grant's message says what to add to a configuration; here the grants come from the
 * flags (newcomer: told to edit "the configuration" while running one module with --policy).
 */
function grantHint(why: string, context: string | undefined, grants: string[] | undefined): string | undefined {
  const missing = /may not read ([^\s()]+) \(([^\s()]+)\)/.exec(why);
  if (!missing) return undefined;
  const grant = `${missing[2]}/${missing[1]}`;
  if (context === undefined) return `a policy reads cluster objects here from a file: add --context OBJECTS.yaml (every kind in it is granted; --grant ${grant} grants that kind alone)`;
  return grants?.length ? `add --grant ${grant}, or leave out --grant to grant every kind in ${context}`
    : `${context} holds no ${missing[1]} (${missing[2]}), so that kind is not granted: add some, or --grant ${grant} (with the kinds it holds) to grant it empty`;
}

/** What the policy logged (ctx.log, console) goes to stderr, beside the review on stdout. */
function printLogs(outcome: Outcome): void {
  for (const [level, message] of outcome.logs ?? []) process.stderr.write(`policy "${outcome.policy}" ${level}: ${message}\n`);
}

function registryOf(reference: string): string {
  return reference.slice('oci://'.length).split('/')[0] ?? '';
}

function parseCli(args: string[]) {
  try {
    return parseArgs({
      args,
      options: {
        policy: { type: 'string' }, request: { type: 'string' }, settings: { type: 'string' }, mode: { type: 'string' },
        'timeout-ms': { type: 'string' }, 'memory-mib': { type: 'string' },
        context: { type: 'string' }, grant: { type: 'string', multiple: true },
        config: { type: 'string' }, show: { type: 'string' },
        operation: { type: 'string' }, 'old-object': { type: 'string' }, namespace: { type: 'string' }, user: { type: 'string' }, groups: { type: 'string' },
        insecure: { type: 'boolean' }, 'docker-config': { type: 'string' },
      },
    }).values;
  } catch (error) {
    throw new UsageError((error as Error).message);
  }
}

type Values = ReturnType<typeof parseCli>;
/** The flags that say what the request is; `portcullis bench` takes the same ones. */
export type RequestFlags = Pick<Values, 'request' | 'operation' | 'old-object' | 'namespace' | 'user' | 'groups'>;

/** The --request file as a review: an AdmissionReview as is, a bare AdmissionRequest wrapped, a manifest built around. */
export async function readRequest(values: RequestFlags): Promise<AdmissionReview> {
  const path = values.request!;
  const text = await readInput(path, 'request');
  const manifestFlags = ['operation', 'old-object', 'namespace', 'user', 'groups'] as const;
  // A flag's mistake is the flag's, not the file's (newcomer pass: "--operation delete" was blamed on the file).
  if (values.operation !== undefined && !['CREATE', 'UPDATE', 'DELETE', 'CONNECT'].includes(values.operation)) {
    throw new UsageError(`--operation must be CREATE, UPDATE, DELETE or CONNECT (upper case), not "${values.operation}"`);
  }
  // The apiserver always sends the object before the change with an UPDATE; a policy that
  // compares the two would be tested against something no cluster sends.
  if (values.operation === 'UPDATE' && values['old-object'] === undefined) {
    throw new UsageError('--operation UPDATE needs --old-object FILE: the object as it was before the update');
  }
  try {
    const value = parseDocument(text);
    if (isObject(value) && value.kind === 'AdmissionReview') {
      const flag = manifestFlags.find((f) => values[f] !== undefined);
      if (flag) throw new UsageError(`--${flag} applies to a plain manifest; ${path} is a whole AdmissionReview`);
      return parseReview(value);
    }
    if (isAdmissionRequest(value)) return { apiVersion: 'admission.k8s.io/v1', request: wholeRequest(value) };
    const oldObject = values['old-object'] === undefined ? undefined : parseDocument(await readInput(values['old-object'], 'old object'));
    const request = requestFor({
      object: values.operation === 'DELETE' ? undefined : value, oldObject: values.operation === 'DELETE' ? (oldObject ?? value) : oldObject,
      operation: values.operation, namespace: values.namespace, user: values.user,
      groups: values.groups?.split(',').map((g) => g.trim()).filter(Boolean),
    }, 'portcullis-run-0000-0000-000000000001');
    return { apiVersion: 'admission.k8s.io/v1', request };
  } catch (error) {
    if (error instanceof UsageError) throw error;
    throw new ConfigError(`${path}: ${errorMessage(error)}`);
  }
}

/** JSON or YAML text: one document. */
function parseDocument(text: string): unknown {
  const json = /^\s*[[{]/.test(text);
  try {
    return json ? JSON.parse(text) as unknown : parseYaml(text) as unknown;
  } catch (error) {
    if (!json && /multiple documents/i.test(errorMessage(error))) throw new Error('holds several YAML documents; give one object per file', { cause: error });
    throw new Error(`not valid ${json ? 'JSON' : 'YAML'}: ${errorMessage(error).split('\n')[0]}`, { cause: error });
  }
}

function print(review: AdmissionReview, decision: Decision<PatchOperation[]>, patched: boolean): void {
  if (!patched) {
    process.stdout.write(`${JSON.stringify(respond(review.apiVersion, review.request.uid, decision), null, 2)}\n`);
    return;
  }
  // --show patched: the object as the apiserver would store it, or why there is none.
  if (!decision.allowed) process.stderr.write(`portcullis run: denied (${decision.status?.code}): ${decision.status?.message}; nothing to patch\n`);
  const object = review.request.object;
  const result = decision.allowed ? patchedObject(object, decision.patch) : object;
  process.stdout.write(`${JSON.stringify(result, null, 2)}\n`);
}

/**
 * --config: every policy of the configuration that matches the request, evaluated and merged as
 * `serve` does (without a mode, the mutating pass runs first and the validating pass sees its
 * result, as in the apiserver's admission chain). With managed webhooks, one per policy, the
 * mutating policies run one after another, as the apiserver calls them.
 */
async function runConfig(
  path: string, review: AdmissionReview, mode: Mode | undefined, patched: boolean, flags: RegistryOptions, insecure: boolean, contextFile: string | undefined,
): Promise<number> {
  const config = await loadConfigFile(resolve(path));
  const everyRegistry = config.policies.filter((p) => p.module.startsWith('oci://')).map((p) => registryOf(p.module));
  const registries = { ...config.registries, ...flags, insecure: [...config.registries.insecure, ...(insecure ? everyRegistry : [])] };
  // Newcomer: --context was ignored with --config, and a context policy's reads said "not synced;
  // retry shortly", which no retry mends without a cluster.
  const granted = config.policies.flatMap((p) => p.context ?? []);
  const readers = config.policies.filter((p) => (p.context ?? []).length > 0).map((p) => p.name);
  if (contextFile === undefined && readers.length > 0) {
    process.stderr.write(`portcullis run: ${readers.map((name) => `"${name}"`).join(', ')} read${readers.length === 1 ? 's' : ''} cluster objects (context: in the configuration); ` +
      'give them some with --context OBJECTS.yaml, or each read fails as the cache not synced\n');
  }
  const context = contextFile === undefined ? undefined : await loadContextObjects(contextFile, granted);
  const pool = new SandboxPool(Math.min(2, Math.max(1, config.policies.length)));
  try {
    context?.attach(pool);
    const set = await loadPolicySet(pool, config, registries);
    for (const entry of set.failed) process.stderr.write(`portcullis run: policy "${entry.config.name}" failed to load: ${entry.error?.message ?? 'unknown reason'}\n`);
    const modes: Mode[] = mode ? [mode] : ['mutate', 'validate'];
    let request = review.request;
    const patch: PatchOperation[] = [];
    let decision: Decision<PatchOperation[]> = { allowed: true, warnings: [], patch: [] };
    const warnings: string[] = [];
    // Policies that failed (crashed, timed out, garbage), and answers the merge could not use:
    // each is a line on stderr and exit status 1, as with --policy (review helper).
    const failures: string[] = [];
    const unknownLabels = new Set<string>();
    // Managed webhooks, one per policy (not singleWebhook): the apiserver calls the mutating ones
    // one after another, each on the object as the one before left it, so two patches of the
    // same field do not conflict there; the last one wins (newcomer: run --config said
    // "conflict" where the cluster admitted the Pod). Otherwise, as /mutate merges them.
    const managed = config.webhooks.managed !== undefined;
    const oneByOne = managed && !config.webhooks.singleWebhook;
    // Managed webhooks leave these namespaces out: the apiserver never calls the host for them.
    const excluded = managed ? excludedNamespaces(config.webhooks) : [];
    /** Whether the apiserver would call `entry`'s own webhook (one per policy) for the request as it stands. */
    const called = (entry: PolicyEntry, m: Mode) => webhookCalls(entry, m, request);
    // A patch changes the object, not the request's namespace: judged once.
    const leftOut = request.namespace !== undefined && excluded.includes(request.namespace);
    if (leftOut) {
      process.stderr.write(`portcullis run: no managed webhook covers namespace "${request.namespace}" (the host's own, a system one, or webhooks.excludeNamespaces: ` +
        `${excluded.join(', ')}): the apiserver does not call the host for it, and no policy runs\n`);
    }
    /** Evaluates one webhook's policies on the request as it stands; false when the review ends there (denied). */
    const call = async (m: Mode, group: readonly PolicyEntry[], webhook: string): Promise<boolean> => {
      if (leftOut) return true;
      const selected = group.filter((entry) => policyMatches(entry, m, request) && (!oneByOne || called(entry, m)));
      // Only where a namespace's labels decide: a namespaced object's (a Namespace's are its own).
      const inNamespace = Boolean(request.namespace) && !(request.resource.group === '' && request.resource.resource === 'namespaces');
      for (const entry of selected) if (entry.config.namespaceSelector && inNamespace) unknownLabels.add(entry.config.name);
      const input = { request, settings: null, headers: {}, sslpeer: null, dryRun: request.dryRun === true, webhook };
      const evaluated = await Promise.all(selected.map(async (entry) => ({ policy: entry.config, outcome: await evaluateEntry(pool, entry, m, input) })));
      for (const { outcome } of evaluated) printLogs(outcome);
      decision = merge(evaluated, request.operation, request.object).decision;
      for (const { policy, outcome } of evaluated) if (outcome.status === 'failed') failures.push(`policy "${policy.name}" failed on request ${request.uid}: ${outcome.message}`);
      if (!decision.allowed && evaluated.every(({ outcome }) => outcome.status === 'allowed')) failures.push(`${decision.status?.message ?? 'the policies\' answers could not be merged'} (request ${request.uid})`);
      warnings.push(...decision.warnings);
      if (!decision.allowed) return false;
      if (m === 'mutate' && decision.patch.length > 0 && request.object) {
        patch.push(...decision.patch);
        request = { ...request, object: patchedObject(request.object, decision.patch) as typeof request.object };
      }
      return true;
    };
    passes: for (const m of modes) {
      if (m === 'mutate' && oneByOne) {
        // The apiserver's choice, not the host's: a webhook it called counts as called, though the
        // host selected nothing there (red team: a policy whose match only held after a later
        // patch was never called again).
        if (!await reinvoking(set.entries, (entry) => called(entry, m), async (entry) => {
          const before = request.object;
          const allowed = await call(m, [entry], `/${m}/${entry.config.name}`);
          return { allowed, changed: !isDeepStrictEqual(before, request.object) };
        })) break passes;
        continue;
      }
      // The endpoint the guest is told is the one its webhook calls.
      if (!await call(m, set.entries, `/${m}`)) break passes;
    }
    // Each once, as the apiserver's warning recorder keeps them (a policy called twice warned twice).
    const final: Decision<PatchOperation[]> = { ...decision, warnings: [...new Set(warnings)], patch: decision.allowed ? patch : [] };
    print(review, final, patched);
    for (const failure of new Set(failures)) process.stderr.write(`portcullis run: ${failure}\n`);
    if (unknownLabels.size > 0) {
      process.stderr.write(`portcullis run: ${[...unknownLabels].map((name) => `"${name}"`).join(', ')} ha${unknownLabels.size === 1 ? 's' : 've'} a namespaceSelector, ` +
        'taken as matching: run does not know the namespace\'s labels\n');
    }
    return set.failed.length > 0 || failures.length > 0 ? 1 : 0;
  } finally {
    await pool.close();
  }
}

/**
 * The apiserver's order of mutating webhooks, one per policy: each in turn, then once more
 * those with `reinvocationPolicy: IfNeeded` that an object changed after (newcomer: the cluster
 * called the first policy again, and run --config showed it once). As the apiserver: a webhook
 * that did not match the first time is not called the second, nor one that no longer matches.
 * False when a webhook denied.
 */
async function reinvoking(
  entries: readonly PolicyEntry[], matches: (entry: PolicyEntry) => boolean,
  call: (entry: PolicyEntry) => Promise<{ allowed: boolean; changed: boolean }>,
): Promise<boolean> {
  const invokedSinceChange = new Set<PolicyEntry>();
  const again = new Set<PolicyEntry>();
  for (const second of [false, true]) {
    if (second && again.size === 0) break;
    for (const entry of entries) {
      if (second && !again.has(entry)) continue;
      if (!matches(entry)) continue;
      const { allowed, changed } = await call(entry);
      if (!allowed) return false;
      if (changed) {
        for (const earlier of invokedSinceChange) again.add(earlier);
        invokedSinceChange.clear();
      }
      if (entry.config.reinvocationPolicy === 'IfNeeded') invokedSinceChange.add(entry);
    }
  }
  return true;
}

/**
 * What the apiserver matches for a policy's own managed webhook (webhooks/build.ts): its rules
 * (every namespaced resource without any), and its object selector with a single match entry's
 * labelSelector. Not the namespaceSelector: run does not know the namespace's labels (nor the
 * excluded namespaces, which runConfig leaves out before any call).
 */
function webhookCalls(entry: PolicyEntry, mode: Mode, request: AdmissionRequest): boolean {
  const { config } = entry;
  const pushed = config.match.length === 1 ? config.match[0]!.labelSelector : undefined;
  const objectSelector = andSelectors(config.objectSelector, pushed) as PolicyConfig['objectSelector'];
  // A manifest given without a namespace is one kubectl would put in one (review: a rule-less
  // policy's namespaced default rules left it out of such a request, silently).
  const defaults = request.namespace ? [...DEFAULT_RULES] : DEFAULT_RULES.map((rule) => ({ ...rule, scope: '*' as const }));
  return policyMatches({
    modes: entry.modes,
    config: {
      ...config, rules: config.rules.length > 0 ? config.rules : defaults,
      ...(objectSelector ? { objectSelector } : {}), namespaceSelector: undefined, match: [],
    },
  }, mode, request);
}

/** As the server's default server.maxBodyBytes: a review larger than this is never sent to a webhook. */
const MAX_INPUT_BYTES = 8 * 2 ** 20;

async function readInput(path: string, what: string): Promise<string> {
  try {
    return path === '-' ? await readStdin() : (await readPointedFile(path, MAX_INPUT_BYTES)).toString('utf8');
  } catch (error) {
    throw new ConfigError(`cannot read the ${what} ${path}: ${errorMessage(error)}`);
  }
}

async function readStdin(): Promise<string> {
  const chunks: Buffer[] = [];
  let total = 0;
  for await (const chunk of process.stdin) {
    total += (chunk as Buffer).length;
    // `< /dev/zero` grew the CLI until it failed on a string too long (red team 5).
    if (total > MAX_INPUT_BYTES) throw new Error(`more than ${MAX_INPUT_BYTES} bytes arrived on standard input`);
    chunks.push(chunk as Buffer);
  }
  return Buffer.concat(chunks).toString('utf8');
}

/** --settings takes inline JSON or the path of a JSON or YAML file (as the configuration's settings are YAML). */
export async function parseSettings(value: string): Promise<JsonValue> {
  const trimmed = value.trim();
  if (/^[[{"]/.test(trimmed) || /^(true|false|null|-?\d)/.test(trimmed)) {
    try {
      return JSON.parse(trimmed) as JsonValue;
    } catch (error) {
      throw new ConfigError(`--settings is not valid JSON: ${errorMessage(error)}`);
    }
  }
  const text = await readInput(value, 'settings file');
  // Read as YAML whatever it looks like: JSON is YAML, and so is `{label: team}` (review 9: taken for JSON, refused).
  if (text.trim() === '') throw new ConfigError(`--settings file ${value} is empty: write {} for no settings`);
  let settings: unknown;
  try {
    settings = parseYaml(text);
  } catch (error) {
    throw new ConfigError(`--settings file ${value} is not valid YAML or JSON: ${yamlProblem(error)}`);
  }
  // Outsider: YAML, which everything else here takes, was refused as "not valid JSON".
  const problem = nonJsonValue(settings);
  if (problem) throw new ConfigError(`--settings file ${value}: ${problem}`);
  return settings as JsonValue;
}

export function positive(value: string, flag: string): number {
  const n = Number(value);
  if (!Number.isFinite(n) || n <= 0) throw new UsageError(`${flag} must be a positive number`);
  return n;
}
