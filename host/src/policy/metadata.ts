// What a policy says about itself, embedded by `portcullis build` in a custom section of the
// module ("portcullis.metadata", JSON): name, version, description, modes, default rules and
// the JSON Schema of its settings. The host uses it as defaults, so a configuration entry can
// be just name + module + settings, and checks settings against the schema before the policy's
// own validator runs. The section comes from whoever built the module, so it is untrusted
// input: size-capped, schema-checked, and refused with a message that says which field is wrong.
import { createRequire } from 'node:module';
import type { Ajv, ValidateFunction } from 'ajv';
import type { Mode } from '@portcullis/sdk';
import { ruleProblem } from '../config/apiserver.ts';
import { describeSchemaError } from '../config/schema.ts';
import type { RuleWithOperations } from '../config/types.ts';
import { validatePolicyInfo } from '../config/validators.generated.ts';
import { PortcullisError } from '../errors.ts';
import { readLeb as readLebAt, writeLeb } from '../sandbox/memory-cap.ts';
import { concatBytes } from '../util/bytes.ts';
import { linearRegExps } from './linear-regexp.ts';

export const METADATA_SECTION = 'portcullis.metadata';
/** Far above any real policy's metadata (a settings schema of a few KiB), far below harm. */
export const MAX_METADATA_BYTES = 256 * 1024;
/**
 * Compiling a settings schema generates code in the host's main thread, at ~3 ms per KiB of
 * plain schema on a slow core; real settings schemas are a few KiB. Refs are compiled as
 * functions of their own, never inlined: inlined, a 10 KiB schema of 150 refs to one
 * 150-property definition took 9 s, and 32 KiB took 268 s (red team).
 */
export const MAX_SETTINGS_SCHEMA_BYTES = 16 * 1024;
// strictSchema off by name too: in strict mode Ajv checks patternProperties with V8's RegExp.
const SCHEMA_OPTIONS = { allErrors: false, strict: false, strictSchema: false, inlineRefs: false, logger: false } as const;
/** Top-level sections of a component (core modules nest inside one) stay in the hundreds. */
const MAX_SECTIONS = 10_000;

export interface PolicyInfo {
  name?: string;
  version?: string;
  description?: string;
  modes?: Mode[];
  /** Default webhook rules: used when the configuration gives none. */
  rules?: RuleWithOperations[];
  /** JSON Schema (draft-07) the settings must satisfy. */
  settingsSchema?: Record<string, unknown>;
}

export class MetadataError extends PortcullisError {
  constructor(message: string) {
    super('POLICY_METADATA_INVALID', message);
  }
}

// Compiled ahead (scripts/validators.ts), with the configuration's own validator.
const validateInfo = validatePolicyInfo as ValidateFunction<PolicyInfo>;

/**
 * A module's settings schema is compiled by an Ajv of its own: one shared instance would keep
 * every schema ever loaded (a leak per reload), refuse a second schema with the same `$id` (one
 * policy could stop another from loading, so failing closed) and resolve one policy's `$ref`
 * to another's schema (red-team findings).
 */
export function compileSettingsSchema(schema: Record<string, unknown>): ValidateFunction {
  // Loading checks the schema compiles (checkInfo), then validates settings with it: compile once.
  let validate = compiledSchemas.get(schema);
  if (!validate) {
    // Patterns run on RE2's linear-time engine, not V8's backtracking one (linear-regexp.ts).
    validate = new (ajv())({ ...SCHEMA_OPTIONS, code: { regExp: linearRegExps() } }).compile(schema);
    compiledSchemas.set(schema, validate);
  }
  return validate;
}

const compiledSchemas = new WeakMap<Record<string, unknown>, ValidateFunction>();

/**
 * Ajv, loaded when a policy first brings a settings schema (synchronously, as CommonJS): ~40 ms
 * and 60 modules that a host whose policies have none never needs, paid before it listened.
 */
function ajv(): typeof Ajv {
  return (ajvClass ??= (createRequire(import.meta.url)('ajv') as { Ajv: typeof Ajv }).Ajv);
}
let ajvClass: typeof Ajv | undefined;

/** Checks a metadata value (from a module, or from package.json at build time). */
export function checkInfo(value: unknown, where: string): PolicyInfo {
  if (!validateInfo(value)) throw new MetadataError(`${where}: ${describeSchemaError(validateInfo.errors?.[0])}`);
  // A module's rules become its webhook's when the configuration gives none: one the apiserver
  // refuses would fail every sync, as a configuration's would (config/apiserver.ts).
  const rules = value.rules ? ruleProblem(value.rules) : undefined;
  if (rules) throw new MetadataError(`${where}: /rules${rules.path}: ${rules.message}`);
  if (value.settingsSchema) {
    let size: number;
    try {
      size = Buffer.byteLength(JSON.stringify(value.settingsSchema));
    } catch {
      throw new MetadataError(`${where}: settingsSchema nests too deep to be read`);
    }
    if (size > MAX_SETTINGS_SCHEMA_BYTES) {
      throw new MetadataError(`${where}: settingsSchema is ${size} bytes, above the ${MAX_SETTINGS_SCHEMA_BYTES}-byte limit; keep it to the settings' shape`);
    }
    try {
      compileSettingsSchema(value.settingsSchema);
    } catch (error) {
      throw new MetadataError(`${where}: settingsSchema is not a usable JSON Schema: ${(error as Error).message}`);
    }
  }
  return value;
}

interface Section {
  start: number;
  end: number;
  /** Where the section's payload begins (after its name). */
  payload: number;
  name?: string;
}

/** Top-level sections, walked without allocating per section beyond the small records. */
function* sections(bytes: Uint8Array): Generator<Section & { header: number }> {
  let offset = 8;
  let count = 0;
  while (offset < bytes.length) {
    if (++count > MAX_SECTIONS) throw new MetadataError(`the module has more than ${MAX_SECTIONS} top-level sections`);
    const header = offset;
    const id = bytes[offset]!;
    const [size, sizeLength] = readLeb(bytes, offset + 1);
    const start = offset + 1 + sizeLength;
    const end = start + size;
    if (end > bytes.length) throw new MetadataError(`section ${id} at byte ${offset} runs past the end of the module`);
    if (id === 0) {
      const [nameLength, nameLengthSize] = readLeb(bytes, start);
      const nameEnd = start + nameLengthSize + nameLength;
      if (nameEnd > end) throw new MetadataError(`custom section at byte ${offset} has a name longer than the section`);
      // Only a name of the right length is decoded: no string per foreign custom section.
      const name = nameLength === METADATA_SECTION.length ? new TextDecoder().decode(bytes.subarray(start + nameLengthSize, nameEnd)) : undefined;
      yield { header, start, end, payload: nameEnd, ...(name === undefined ? {} : { name }) };
    } else {
      yield { header, start, end, payload: start };
    }
    offset = end;
  }
}

/** The policy's embedded metadata, or undefined when it has none. */
export function readPolicyInfo(bytes: Uint8Array): PolicyInfo | undefined {
  let found: PolicyInfo | undefined;
  for (const section of sections(bytes)) {
    if (section.name !== METADATA_SECTION) continue;
    if (found) throw new MetadataError(`the module has more than one ${METADATA_SECTION} section`);
    const size = section.end - section.payload;
    if (size > MAX_METADATA_BYTES) throw new MetadataError(`its ${METADATA_SECTION} section is ${size} bytes, above the ${MAX_METADATA_BYTES}-byte limit`);
    let value: unknown;
    try {
      value = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(bytes.subarray(section.payload, section.end)));
    } catch (error) {
      throw new MetadataError(`its ${METADATA_SECTION} section is not UTF-8 JSON: ${(error as Error).message}`);
    }
    found = checkInfo(value, `its ${METADATA_SECTION} section`);
  }
  return found;
}

/** The module with its metadata section replaced by `info` (appended last: code offsets stay). */
export function embedPolicyInfo(bytes: Uint8Array, info: PolicyInfo): Uint8Array {
  const payload = new TextEncoder().encode(JSON.stringify(checkInfo(info, 'metadata')));
  if (payload.length > MAX_METADATA_BYTES) throw new MetadataError(`the metadata is ${payload.length} bytes, above the ${MAX_METADATA_BYTES}-byte limit`);
  const kept: Uint8Array[] = [bytes.subarray(0, 8)];
  for (const section of sections(bytes)) if (section.name !== METADATA_SECTION) kept.push(bytes.subarray(section.header, section.end));
  const name = new TextEncoder().encode(METADATA_SECTION);
  const body = [...writeLeb(name.length), ...name];
  const size = body.length + payload.length;
  kept.push(Uint8Array.of(0, ...writeLeb(size), ...body), payload);
  return concatBytes(kept);
}

function readLeb(bytes: Uint8Array, offset: number): [number, number] {
  try {
    return readLebAt(bytes, offset, bytes.length);
  } catch {
    throw new MetadataError(`bad section size at byte ${offset}`);
  }
}
