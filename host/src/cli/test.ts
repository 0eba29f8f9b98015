// `portcullis test [FILE|DIR ...]`: declarative policy tests, the way `kyverno test` and
// `gator verify` work, so a policy repository's CI needs no test code of its own. A suite is a
// YAML file naming one or more built policies and a list of cases: an object (or a whole
// AdmissionRequest) and what the merged answer must be. Every case runs in the real sandbox
// with the server's merge, prints one line, and the run ends with `N passed, N failed`.
// Exit 1 when any case fails or a suite file cannot be used (one clear line for each).
import { readdir, stat } from 'node:fs/promises';
import { dirname, isAbsolute, join, relative, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import type { AdmissionRequest, JsonObject, JsonValue, Mode, PatchOperation, PeerCertificate } from '@portcullis/sdk';
import { parse as parseYaml } from 'yaml';
import { evaluatePolicy } from '../evaluate/evaluate.ts';
import type { Outcome } from '../sandbox/outcome.ts';
import { errorMessage, PortcullisError } from '../errors.ts';
import { merge } from '../merge/merge.ts';
import { patchedObject } from '../merge/patches.ts';
import { loadPolicy } from '../policy/load.ts';
import type { LoadedPolicy } from '../policy/loaded.ts';
import type { Decision } from '../review/respond.ts';
import type { RuleWithOperations } from '../config/types.ts';
import { ruleMatches } from '../select/match.ts';
import { SandboxPool } from '../sandbox/pool.ts';
import { DEFAULT_LIMITS } from '../config/limits.ts';
import { readPointedFile } from '../util/files.ts';

/** A test suite is a few reviews and expectations: far less than this. */
const MAX_SUITE_BYTES = 64 * 2 ** 20;
import { yamlProblem } from '../config/load.ts';
import { grantedKinds, kindKey, type Grant } from '../context/grants.ts';
import { ContextHub } from '../context/hub.ts';
import { loadContextFile, loadOffline, parseContextObjects } from '../context/offline.ts';
import { isObject, requestFor, RequestInputError, wholeRequest } from './request.ts';
import { notBuiltYet, settingsFrom, UsageError } from './usage.ts';
import { policyNameOf } from '../policy/source.ts';

const USAGE = 'usage: portcullis test [FILE.yaml|DIR ...]   (default: the current folder; a folder is searched for *.test.yaml and portcullis-test.yaml)';
const SUITE_KEYS = new Set(['policy', 'settings', 'policies', 'context', 'cases']);
const POLICY_KEYS = new Set(['name', 'module', 'settings', 'rules', 'context']);
const CASE_KEYS = new Set(['name', 'mode', 'object', 'oldObject', 'operation', 'namespace', 'user', 'groups', 'dryRun', 'request', 'headers', 'sslpeer', 'expect']);
const PEER_TEXT_KEYS = ['serialNumber', 'validFrom', 'validTo', 'fingerprint256'] as const;
const EXPECT_KEYS = new Set(['allowed', 'code', 'message', 'warnings', 'patched', 'failed']);

/** A suite file that cannot be used: its path and what is wrong, on one line. */
export class SuiteError extends PortcullisError {
  constructor(message: string) {
    super('BAD_TEST_SUITE', message);
  }
}

/**
 * rules undefined: the module's embedded default rules, as serve would apply them. grants
 * undefined: every kind the suite's context holds, as `run --context` without --grant.
 */
interface PolicyRef { name: string; module: string; settings: JsonValue; rules: RuleWithOperations[] | undefined; grants: Grant[] | undefined }
/** failed: a policy's failure (crash, deadline, cap) is what the case is about; otherwise any failure fails the case. */
interface Expectation { allowed?: boolean; code?: number; message?: string; warnings?: string[]; patched?: JsonValue; failed?: boolean }
interface Case {
  name: string; mode: Mode | undefined; request: AdmissionRequest;
  /** The caller, as the server would see it: lower-cased header names, the verified client certificate. */
  headers: Record<string, string>; sslpeer: PeerCertificate | null;
  expect: Expectation;
}
/** A case that cannot be run: its own ERROR line; the suite's other cases still run. */
interface BadCase { name: string; error: string }
/** Cluster objects the policies may read: a YAML file (as `run --context`) or a list in the suite. */
type SuiteContext = { file: string } | { objects: JsonObject[] };
interface Suite { file: string; policies: PolicyRef[]; context: SuiteContext | undefined; cases: (Case | BadCase)[] }

export default async function test(args: string[]): Promise<number> {
  let targets: string[];
  try {
    targets = parseArgs({ args, allowPositionals: true, options: {} }).positionals;
  } catch (error) {
    throw new UsageError(`${errorMessage(error)}\n${USAGE}`);
  }
  const files = await suiteFiles(targets.length > 0 ? targets : ['.']);
  if (files.length === 0) throw new UsageError(`no test suites found in ${targets.join(', ') || 'the current folder'}\n${USAGE}`);
  let passed = 0;
  let failed = 0;
  const hinted = new Set<string>();
  for (const file of files) {
    const shown = relative(process.cwd(), file) || file;
    let suite: Suite;
    try {
      suite = parseSuite(file, (await readPointedFile(file, MAX_SUITE_BYTES)).toString('utf8'));
    } catch (error) {
      process.stdout.write(`ERROR ${shown}: ${errorMessage(error)}\n`);
      failed++;
      continue;
    }
    const results = await runSuite(suite).catch((error: unknown) => {
      process.stdout.write(`ERROR ${shown}: ${errorMessage(error)}\n`);
      return undefined;
    });
    if (!results) {
      failed++;
      continue;
    }
    for (const { name, problems, error, vacuous } of results) {
      if (error !== undefined) {
        failed++;
        process.stdout.write(`ERROR ${shown} › ${name}: ${error}\n`);
        continue;
      }
      if (problems.length === 0) passed++;
      else failed++;
      const note = vacuous ? ' (no policy evaluated this request: none of their rules matches its operation and resource, or its mode)' : '';
      process.stdout.write(problems.length === 0 ? `PASS ${shown} › ${name}${note}\n` : `FAIL ${shown} › ${name}: ${problems.join('; ')}\n`);
      // The grant's message names a configuration; a suite gives objects its own way (newcomer:
      // found the key only through a typo's list of known fields).
      if (problems.some((p) => p.includes('may not read ')) && suite.context === undefined && !hinted.has(file)) {
        hinted.add(file);
        process.stdout.write(`  hint: give ${shown} cluster objects with a top-level context: (a YAML file, as run --context, or a list of objects); ` +
          'a policy may read every kind in it, or the kinds its own context: lists\n');
      }
    }
  }
  process.stdout.write(`${passed} passed, ${failed} failed\n`);
  return failed === 0 ? 0 : 1;
}

async function suiteFiles(targets: string[]): Promise<string[]> {
  const found: string[] = [];
  for (const target of targets) {
    const path = resolve(target);
    const info = await stat(path).catch(() => undefined);
    if (!info) throw new UsageError(`${target} does not exist`);
    if (info.isFile()) found.push(path);
    else found.push(...(await walk(path)));
  }
  return found;
}

async function walk(dir: string): Promise<string[]> {
  const out: string[] = [];
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    if (entry.name === 'node_modules' || entry.name.startsWith('.')) continue;
    const path = join(dir, entry.name);
    if (entry.isDirectory()) out.push(...(await walk(path)));
    else if (entry.name.endsWith('.test.yaml') || entry.name === 'portcullis-test.yaml') out.push(path);
  }
  return out.sort();
}

// ---- parsing: untrusted YAML in, typed suite out; every error names the field ----

export function parseSuite(file: string, text: string): Suite {
  let doc: unknown;
  try {
    doc = parseYaml(text);
  } catch (error) {
    throw new SuiteError(`not valid YAML: ${yamlProblem(error)}`);
  }
  if (!isObject(doc)) throw new SuiteError('must be a YAML mapping with "policy" (or "policies") and "cases"');
  // A misspelt key would otherwise be a setting, a context or a rule quietly left out.
  const unknown = Object.keys(doc).filter((k) => !SUITE_KEYS.has(k));
  if (unknown.length > 0) throw new SuiteError(`unknown field(s) ${unknown.join(', ')} (known: ${[...SUITE_KEYS].join(', ')})`);
  const base = dirname(file);
  const policies = parsePolicies(doc, base);
  const context = parseContext(doc.context, base);
  if (!Array.isArray(doc.cases) || doc.cases.length === 0) throw new SuiteError('"cases" must be a non-empty list');
  // A mistake in one case costs that case, not the suite: the others still run and report.
  const names = new Set<string>();
  const cases = doc.cases.map((value, i): Case | BadCase => {
    let parsed: Case;
    try {
      parsed = parseCase(value, i);
    } catch (error) {
      if (!(error instanceof SuiteError)) throw error;
      return { name: caseName(value, i), error: error.message };
    }
    if (names.has(parsed.name)) return { name: parsed.name, error: `cases[${i}]: another case is already named "${parsed.name}"; names must be unique` };
    names.add(parsed.name);
    return parsed;
  });
  return { file, policies, context, cases };
}

function parsePolicies(doc: Record<string, unknown>, base: string): PolicyRef[] {
  if (doc.policy !== undefined && doc.policies !== undefined) throw new SuiteError('give "policy" or "policies", not both');
  const list: unknown[] = doc.policies !== undefined
    ? (Array.isArray(doc.policies) ? doc.policies : [null])
    : [{ module: doc.policy, settings: doc.settings }];
  if (list.length === 0) throw new SuiteError('"policies" must be a non-empty list');
  const refs = list.map((p, i): PolicyRef => {
    const where = doc.policies !== undefined ? `policies[${i}]` : 'policy';
    const entry = typeof p === 'string' ? { module: p } : p;
    if (!isObject(entry) || typeof entry.module !== 'string' || entry.module === '') {
      throw new SuiteError(`${where} must be the path of a built .wasm (or {module, settings, name, rules, context})`);
    }
    const unknown = doc.policies !== undefined ? Object.keys(entry).filter((k) => !POLICY_KEYS.has(k)) : [];
    if (unknown.length > 0) throw new SuiteError(`${where} has unknown field(s) ${unknown.join(', ')} (known: ${[...POLICY_KEYS].join(', ')})`);
    const module = /^[a-z]+:\/\//i.test(entry.module) || isAbsolute(entry.module) ? entry.module : join(base, entry.module);
    const name = typeof entry.name === 'string' ? entry.name : policyNameOf(entry.module);
    return { name, module, settings: (entry.settings ?? {}) as JsonValue, rules: parseRules(entry.rules, where), grants: parseGrants(entry.context, where) };
  });
  if (new Set(refs.map((r) => r.name)).size !== refs.length) throw new SuiteError('two policies have the same name; give each a "name"');
  return refs;
}

/** Webhook rules, as in the configuration: a policy with rules runs only for the cases they match. */
function parseRules(value: unknown, where: string): RuleWithOperations[] | undefined {
  if (value === undefined) return undefined;
  const strings = (v: unknown) => Array.isArray(v) && v.length > 0 && v.every((x) => typeof x === 'string');
  const isRule = (r: unknown) => isObject(r) && strings(r.operations) && strings(r.apiGroups) && strings(r.apiVersions) && strings(r.resources);
  if (!Array.isArray(value) || !value.every(isRule)) {
    throw new SuiteError(`${where}.rules must be a list of {operations, apiGroups, apiVersions, resources} lists of strings`);
  }
  return value as RuleWithOperations[];
}

function parseContext(value: unknown, base: string): SuiteContext | undefined {
  if (value === undefined) return undefined;
  if (typeof value === 'string' && value !== '') return { file: isAbsolute(value) ? value : join(base, value) };
  if (!Array.isArray(value)) throw new SuiteError('"context" must be the path of a YAML file of cluster objects, or a list of them');
  try {
    // JSON is YAML: the same checks as a context file (apiVersion, kind, metadata.name).
    return { objects: parseContextObjects(JSON.stringify(value), 'context') };
  } catch (error) {
    throw new SuiteError(errorMessage(error));
  }
}

/** As in the configuration: the kinds a policy may read, each {apiVersion, kind} once. */
function parseGrants(value: unknown, where: string): Grant[] | undefined {
  if (value === undefined) return undefined;
  const isGrant = (g: unknown) => isObject(g) && typeof g.apiVersion === 'string' && g.apiVersion !== '' && typeof g.kind === 'string' && g.kind !== '' && Object.keys(g).length === 2;
  if (!Array.isArray(value) || !value.every(isGrant)) throw new SuiteError(`${where}.context must be a list of {apiVersion, kind}: the kinds the policy may read`);
  const grants = value as Grant[];
  if (new Set(grants.map((g) => kindKey(g.apiVersion, g.kind))).size !== grants.length) throw new SuiteError(`${where}.context grants a kind twice`);
  return grants;
}

function parseHeaders(value: unknown, at: string): Record<string, string> {
  if (value === undefined) return {};
  if (!isObject(value) || !Object.values(value).every((v) => typeof v === 'string')) throw new SuiteError(`${at}: headers must be a mapping of header names to strings`);
  // As the server hands them over: lower-cased names.
  return Object.fromEntries(Object.entries(value as Record<string, string>).map(([k, v]) => [k.toLowerCase(), v]));
}

/** The caller's verified certificate; fields left out are empty, as a policy could meet them. */
function parsePeer(value: unknown, at: string): PeerCertificate | null {
  if (value === undefined || value === null) return null;
  const names = (v: unknown) => isObject(v) && Object.values(v).every((x) => typeof x === 'string' || (Array.isArray(x) && x.every((y) => typeof y === 'string')));
  const known = new Set<string>(['subject', 'issuer', ...PEER_TEXT_KEYS]);
  if (!isObject(value) || !names(value.subject) || (value.issuer !== undefined && !names(value.issuer))
    || Object.keys(value).some((k) => !known.has(k)) || PEER_TEXT_KEYS.some((k) => value[k] !== undefined && typeof value[k] !== 'string')) {
    throw new SuiteError(`${at}: sslpeer must be a mapping with subject (and optionally issuer) of names to strings or lists of strings, and ${PEER_TEXT_KEYS.join(', ')} as strings`);
  }
  const text = (k: (typeof PEER_TEXT_KEYS)[number]) => (value[k] as string | undefined) ?? '';
  return {
    subject: value.subject as PeerCertificate['subject'], issuer: (value.issuer ?? {}) as PeerCertificate['issuer'],
    serialNumber: text('serialNumber'), validFrom: text('validFrom'), validTo: text('validTo'), fingerprint256: text('fingerprint256'),
  };
}

function parseCase(value: unknown, index: number): Case {
  const where = `cases[${index}]`;
  if (!isObject(value)) throw new SuiteError(`${where} must be a mapping`);
  const unknown = Object.keys(value).filter((k) => !CASE_KEYS.has(k));
  if (unknown.length > 0) throw new SuiteError(`${where} has unknown field(s) ${unknown.join(', ')} (known: ${[...CASE_KEYS].join(', ')})`);
  const name = caseName(value, index);
  const at = `${where} ("${name}")`;
  if (value.mode !== undefined && value.mode !== 'validate' && value.mode !== 'mutate') throw new SuiteError(`${at}: mode must be validate or mutate`);
  if (!isObject(value.expect)) throw new SuiteError(`${at}: "expect" must be a mapping with at least one of ${[...EXPECT_KEYS].join(', ')}`);
  return {
    name, mode: value.mode, request: caseRequest(value, at), headers: parseHeaders(value.headers, at), sslpeer: parsePeer(value.sslpeer, at),
    expect: parseExpect(value.expect, at),
  };
}

function caseName(value: unknown, index: number): string {
  return isObject(value) && typeof value.name === 'string' && value.name !== '' ? value.name : `case ${index + 1}`;
}

function parseExpect(value: Record<string, unknown>, at: string): Expectation {
  const keys = Object.keys(value);
  const unknown = keys.filter((k) => !EXPECT_KEYS.has(k));
  if (unknown.length > 0 || keys.length === 0) throw new SuiteError(`${at}: expect takes ${[...EXPECT_KEYS].join(', ')}${unknown.length ? `, not ${unknown.join(', ')}` : ''}`);
  if (value.allowed !== undefined && typeof value.allowed !== 'boolean') throw new SuiteError(`${at}: expect.allowed must be true or false`);
  if (value.failed !== undefined && typeof value.failed !== 'boolean') throw new SuiteError(`${at}: expect.failed must be true or false`);
  if (value.code !== undefined && !Number.isInteger(value.code)) throw new SuiteError(`${at}: expect.code must be an integer`);
  if (value.message !== undefined && typeof value.message !== 'string') throw new SuiteError(`${at}: expect.message must be a string`);
  const warnings = value.warnings;
  if (warnings !== undefined && !(Array.isArray(warnings) && warnings.every((w) => typeof w === 'string'))) {
    throw new SuiteError(`${at}: expect.warnings must be a list of strings`);
  }
  return value;
}

/** A case gives either a whole request (an AdmissionRequest or AdmissionReview) or an object to build one around. */
function caseRequest(value: Record<string, unknown>, at: string): AdmissionRequest {
  try {
    if (value.request === undefined) return requestFor(withoutCallerKeys(value), `portcullis-test-${at.replace(/\W+/g, '-')}`);
    if (value.object !== undefined || value.oldObject !== undefined) throw new SuiteError(`${at}: give "request" or "object"/"oldObject", not both`);
    return wholeRequest(value.request);
  } catch (error) {
    if (error instanceof RequestInputError) throw new SuiteError(`${at}: ${value.request === undefined ? '' : 'request: '}${error.message}`);
    throw error;
  }
}

/** headers and sslpeer describe the caller, not the request `requestFor` builds. */
function withoutCallerKeys(value: Record<string, unknown>): Record<string, unknown> {
  const { headers: _headers, sslpeer: _sslpeer, ...rest } = value;
  return rest;
}

// ---- running: the same sandbox, evaluation and merge as `serve` ----

interface CaseResult { name: string; problems: string[]; error?: string; vacuous?: boolean }

async function runSuite(suite: Suite): Promise<CaseResult[]> {
  const pool = new SandboxPool(Math.min(2, suite.policies.length));
  try {
    const objects = suite.context === undefined ? [] : 'file' in suite.context ? await loadContextFile(suite.context.file) : suite.context.objects;
    const inFile = grantedKinds([objects.map((o) => ({ apiVersion: o.apiVersion as string, kind: o.kind as string }))]);
    const grantsOf = (ref: PolicyRef) => ref.grants ?? inFile;
    // One hub for the suite, as the server has one: every kind some policy is granted counts as synced.
    if (suite.policies.some((ref) => grantsOf(ref).length > 0)) {
      const hub = new ContextHub();
      loadOffline(hub, objects, grantedKinds(suite.policies.map(grantsOf)));
      hub.attach(pool);
    }
    const loaded: (LoadedPolicy & { rules: RuleWithOperations[] })[] = [];
    for (const ref of suite.policies) {
      const grants = grantsOf(ref);
      const policy = await loadPolicy(pool, {
        name: ref.name, module: ref.module, settings: ref.settings, limits: DEFAULT_LIMITS,
        failurePolicy: 'Fail', enforcement: 'enforce', isolation: 'reuse', ...(grants.length > 0 ? { context: grants } : {}),
      }).catch(notBuiltYet(ref.module)).catch(settingsFrom('the suite'));
      loaded.push({ ...policy, rules: ref.rules ?? policy.info?.rules ?? [] });
    }
    const results = [];
    for (const c of suite.cases) {
      if ('error' in c) {
        results.push({ name: c.name, problems: [], error: c.error });
        continue;
      }
      const { decision, outcomes } = await evaluateCase(pool, loaded, c);
      const problems = [...failures(c, outcomes), ...check(c, decision)];
      // An unexpected verdict from no policy at all is the rules' doing, not the policy's: say so.
      if (problems.length > 0 && outcomes.length === 0) problems.push('no policy evaluated this request: none of their rules matches its operation and resource (or its mode)');
      // An expected one passes, but says so: a case meant for the policy may be testing nothing.
      results.push({ name: c.name, problems, vacuous: outcomes.length === 0 });
    }
    return results;
  } finally {
    await pool.close();
  }
}

type RuledPolicy = LoadedPolicy & { rules: RuleWithOperations[] };

async function evaluateCase(pool: SandboxPool, all: RuledPolicy[], c: Case): Promise<{ decision: Decision<PatchOperation[]>; outcomes: Outcome[] }> {
  const policies = all.filter((p) => p.rules.length === 0 || p.rules.some((rule) => ruleMatches(rule, c.request)));
  // Without a mode, a policy runs as a validating webhook if it can, else as a mutating one.
  const runs = policies.map((policy) => ({ policy, mode: c.mode ?? (policy.modes.includes('validate') ? 'validate' : 'mutate') }))
    .filter(({ policy, mode }) => policy.modes.includes(mode));
  const evaluated = await Promise.all(runs.map(async ({ policy, mode }) => ({
    policy,
    outcome: await evaluatePolicy(pool, policy, mode, {
      request: c.request, settings: policy.settings, headers: c.headers, sslpeer: c.sslpeer, dryRun: c.request.dryRun === true, webhook: `/${mode}/${policy.name}`,
    }),
  })));
  return { decision: merge(evaluated, c.request.operation, c.request.object).decision, outcomes: evaluated.map((e) => e.outcome) };
}

/**
 * With failurePolicy Fail a crashing policy denies, so a case expecting a denial would pass for
 * the wrong reason: a failure fails the case unless it says `failed: true`.
 */
function failures(c: Case, outcomes: Outcome[]): string[] {
  const failed = outcomes.filter((o) => o.status === 'failed');
  if (c.expect.failed === true) return failed.length > 0 ? [] : ['expected a policy to fail (expect.failed), but none did'];
  return failed.map((o) => `policy ${o.policy} failed (${o.failure}) instead of deciding: ${o.message}`);
}

function check(c: Case, decision: Decision<PatchOperation[]>): string[] {
  const problems: string[] = [];
  const { expect } = c;
  const said = decision.status ? ` (${decision.status.code}: ${decision.status.message})` : '';
  if (expect.allowed !== undefined && decision.allowed !== expect.allowed) problems.push(`expected ${expect.allowed ? 'allowed' : 'denied'}, got ${decision.allowed ? 'allowed' : 'denied'}${said}`);
  if (expect.code !== undefined && decision.status?.code !== expect.code) problems.push(`expected code ${expect.code}, got ${decision.status?.code ?? 'none'}`);
  if (expect.message !== undefined && !decision.status?.message.includes(expect.message)) {
    problems.push(`expected a message containing "${expect.message}", got ${decision.status ? `"${decision.status.message}"` : 'none'}`);
  }
  // An empty list says "no warnings": read as "none wanted", it passed whatever the policy warned (newcomer).
  if (expect.warnings?.length === 0 && decision.warnings.length > 0) problems.push(`expected no warnings, got ${JSON.stringify(decision.warnings)}`);
  for (const wanted of expect.warnings ?? []) {
    if (!decision.warnings.some((w) => w.includes(wanted))) problems.push(`expected a warning containing "${wanted}", got ${JSON.stringify(decision.warnings)}`);
  }
  if (expect.patched !== undefined) {
    const patched = patchedObject(c.request.object, decision.patch);
    if (JSON.stringify(canonical(patched)) !== JSON.stringify(canonical(expect.patched))) {
      problems.push(`the patched object differs: expected ${JSON.stringify(expect.patched)}, got ${JSON.stringify(patched)}`);
    }
  }
  return problems;
}


/** Key order does not matter when comparing objects. */
function canonical(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(canonical);
  if (!isObject(value)) return value;
  return Object.fromEntries(Object.keys(value).sort().map((k) => [k, canonical(value[k])]));
}
