// Loads one policy: read bytes, prepare and load its sandbox in every worker, ask it what it
// can do, and let it check its settings. Any problem is a PolicyLoadError or
// PolicySettingsError naming the policy; other policies are not affected.
import type { JsonValue, Mode, PolicyMetadata } from '@portcullis/sdk';
import type { RuleWithOperations } from '../config/types.ts';
import { errorMessage, PolicyLoadError, PolicySettingsError } from '../errors.ts';
import type { SandboxPool } from '../sandbox/pool.ts';
import { prepareSandbox } from '../sandbox/prepare.ts';
import { DEFAULT_LIMITS } from '../config/limits.ts';
import type { LoadedPolicy, PolicyOptions } from './loaded.ts';
import { compileSettingsSchema, readPolicyInfo } from './metadata.ts';
import { readModule, type RegistryOptions } from './source.ts';
import { sha256 } from '../util/files.ts';

const SETUP_TIMEOUT_MS = 10_000;

export async function loadPolicy(pool: SandboxPool, options: PolicyOptions, bytes?: Uint8Array, registries?: RegistryOptions): Promise<LoadedPolicy> {
  const fail = (reason: string, cause?: unknown): never => {
    throw new PolicyLoadError(options.name, reason, { cause });
  };
  // Each step's failure becomes one PolicyLoadError naming the policy.
  const step = async <T>(run: () => T | Promise<T>): Promise<T> => {
    try {
      return await run();
    } catch (error) {
      return fail(errorMessage(error), error);
    }
  };
  const moduleBytes = bytes ?? await step(() => readModule(options.module, options.limits.maxModuleMiB * 2 ** 20, registries));
  // The grants travel with the spec: each worker's guest gets a reader limited to them.
  const prepared = await step(() => prepareSandbox(options.name, moduleBytes, options.limits, options.isolation === 'fresh'));
  const context = options.context ?? [];
  // The key names everything an instance is made from, settings included: a reload that changes
  // any of it gets a new sandbox beside the serving one (the serving one goes when its set
  // drains), and one that changes nothing reuses the serving sandbox. A refused reload therefore
  // never alters or unloads what still serves.
  const madeOf = [prepared.memoryCapBytes, prepared.maxOutputBytes, prepared.fresh, context, options.settings ?? null];
  const made = sha256(Buffer.from(JSON.stringify(madeOf))).slice(0, 12);
  const spec = { ...prepared, key: `${prepared.key}.${made}`, context };
  // After prepare: its bounded walk has already refused malformed and hostile shapes.
  const info = await step(() => readPolicyInfo(moduleBytes));
  // The schema is checked before the guest's own validator runs: a wrong type gets a message
  // with the field's path even from a policy that checks nothing itself.
  if (info?.settingsSchema) {
    const problem = schemaProblem(info.settingsSchema, options.settings);
    if (problem) throw remember(new PolicySettingsError(options.name, problem), info.modes, info.rules);
  }
  const created = await step(() => pool.load(spec));
  const loaded: LoadedPolicy = { ...options, key: spec.key, digest: spec.digest, kind: spec.kind, modes: [], ...(info ? { info } : {}) };
  if (created) createdHere.add(loaded);
  try {
    const metadata = parseMetadata(await setupCall(pool, loaded, 'metadata', '{}'));
    loaded.modes = metadata.modes;
    if (metadata.objectsApart) loaded.objectsApart = true;
    if (metadata.nestedApart) loaded.nestedApart = true;
    if (metadata.settings) {
      const verdict = parseVerdict(await setupCall(pool, loaded, 'validate-settings', JSON.stringify({ settings: options.settings })));
      if (!verdict.valid) throw remember(new PolicySettingsError(options.name, verdict.message), metadata.modes, info?.rules);
    }
  } catch (error) {
    unloadIfCreated(pool, loaded);
    if (error instanceof PolicySettingsError) throw error;
    fail(errorMessage(error), error);
  }
  return loaded;
}

const createdHere = new WeakSet<LoadedPolicy>();

/** What a policy whose settings were refused said of itself: its module was read and answered. */
export interface RefusedPolicyFacts {
  modes?: Mode[];
  rules?: RuleWithOperations[];
}
const refusedFacts = new WeakMap<PolicySettingsError, RefusedPolicyFacts>();

function remember(error: PolicySettingsError, modes: Mode[] | undefined, rules: RuleWithOperations[] | undefined): PolicySettingsError {
  refusedFacts.set(error, { ...(modes ? { modes } : {}), ...(rules ? { rules } : {}) });
  return error;
}

/**
 * The modes and default rules of a policy whose module loaded but whose settings were refused.
 * The policy then still fails every request it matches (per its failurePolicy), but "matches"
 * keeps its meaning: without them the host took it for a policy of unknown rules, matching every
 * request in both modes, and with the managed webhooks denied every write in the cluster, the
 * apiserver's own included, for a typo in one policy's settings (outsider check).
 */
export function refusedPolicyFacts(error: unknown): RefusedPolicyFacts | undefined {
  return error instanceof PolicySettingsError ? refusedFacts.get(error) : undefined;
}

/**
 * Gives up a policy that loaded but will not be used: its sandbox goes only if this load made it,
 * never one that a serving policy with the same key holds.
 */
export function unloadIfCreated(pool: SandboxPool, loaded: LoadedPolicy): void {
  if (createdHere.delete(loaded)) pool.unload(loaded.key);
}

/**
 * Loads a module in the sandbox only to ask what it can do (no settings): what `portcullis
 * build` uses to check a module it just wrote and to record its modes.
 */
export async function probeModes(pool: SandboxPool, name: string, bytes: Uint8Array): Promise<Mode[]> {
  const prepared = await prepareSandbox(name, bytes, DEFAULT_LIMITS, false);
  const spec = { ...prepared, context: [] };
  const created = await pool.load(spec);
  try {
    const probe = { name, module: name, settings: null, limits: DEFAULT_LIMITS, failurePolicy: 'Fail', enforcement: 'enforce', isolation: 'reuse', key: spec.key, digest: spec.digest, kind: spec.kind, modes: [] } satisfies LoadedPolicy;
    return parseMetadata(await setupCall(pool, probe, 'metadata', '{}')).modes;
  } finally {
    if (created) pool.unload(spec.key);
  }
}

async function setupCall(pool: SandboxPool, policy: LoadedPolicy, fn: 'metadata' | 'validate-settings', input: string): Promise<string> {
  const result = await pool.call(policy.key, fn, input, Math.max(policy.limits.timeoutMs, SETUP_TIMEOUT_MS));
  if (!result.ok) throw new Error(`its ${fn} call failed: ${result.message}`);
  return result.output;
}

function parseMetadata(text: string): PolicyMetadata & { objectsApart: boolean; nestedApart: boolean } {
  const value = parseObject(text, 'metadata');
  const modes = value.modes;
  if (!Array.isArray(modes) || !modes.every((m): m is Mode => m === 'validate' || m === 'mutate')) {
    throw new Error('its metadata does not list its modes (validate/mutate)');
  }
  // Any other form named (from a newer SDK) is one this host does not write: ignored.
  const forms = Array.isArray(value.input) ? value.input as unknown[] : [];
  const objectsApart = forms.includes('objects-apart');
  return { modes, settings: value.settings === true, objectsApart, nestedApart: objectsApart && forms.includes('nested-apart') };
}

function parseVerdict(text: string): { valid: true } | { valid: false; message: string } {
  const value = parseObject(text, 'settings check');
  if (value.valid === true) return { valid: true };
  if (value.valid === false) return { valid: false, message: typeof value.message === 'string' ? value.message : 'invalid settings' };
  throw new Error('its settings check returned neither valid: true nor valid: false');
}

function parseObject(text: string, what: string): Record<string, unknown> {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw new Error(`its ${what} is not JSON`);
  }
  if (typeof value !== 'object' || value === null || Array.isArray(value)) throw new Error(`its ${what} is not a JSON object`);
  return value as Record<string, unknown>;
}

/** The first way the settings break the module's settings schema, or undefined. */
function schemaProblem(schema: Record<string, unknown>, settings: JsonValue): string | undefined {
  const validate = compileSettingsSchema(schema);
  if (validate(settings)) return undefined;
  const error = validate.errors?.[0];
  // Ajv's own words leave out which field: say it.
  const detail = error?.keyword === 'additionalProperties' ? `has an unknown field "${String(error.params.additionalProperty)}"`
    : error?.keyword === 'required' ? `is missing the required field "${String(error.params.missingProperty)}"`
    : error?.message ?? 'do not match the schema';
  return `settings${error?.instancePath ?? ''} ${detail}${error?.keyword === 'required' ? misspelt(schema, settings, error.instancePath) : ''} (the module's settings schema)`;
}

/**
 * A required field missing beside one the schema does not know is most often a typo (newcomer:
 * `lable: team` was told only that "label" was missing). Ajv stops at its first error.
 */
function misspelt(schema: Record<string, unknown>, settings: JsonValue, path: string | undefined): string {
  const properties = schema.properties;
  if (path !== '' || typeof properties !== 'object' || properties === null || typeof settings !== 'object' || settings === null || Array.isArray(settings)) return '';
  const unknown = Object.keys(settings).filter((key) => !Object.hasOwn(properties, key));
  return unknown.length === 0 ? '' : `, and has ${unknown.length === 1 ? 'a field' : 'fields'} not among its properties (a typo?): ${unknown.slice(0, 5).map((k) => `"${k}"`).join(', ')}`;
}
