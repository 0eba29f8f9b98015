// config.schema.json is the one description of the configuration file: types, limits and
// defaults. The host validates against it and reads every default from it here, and
// test/unit/config-schema.test.ts checks that the TypeScript types in types.ts list the same
// fields, so a new field is added in the schema and in types.ts, and nowhere else.
import type { ErrorObject } from 'ajv';
import schemaJson from '../../config.schema.json' with { type: 'json' };

export const schema: JsonSchema = schemaJson;

/**
 * What a policy module may say about itself (policy/metadata.ts): its name, modes, default
 * rules (the configuration's rule definition) and the JSON Schema of its settings.
 */
export const policyInfoSchema: JsonSchema = {
  type: 'object',
  additionalProperties: false,
  properties: {
    name: { type: 'string', maxLength: 253 },
    version: { type: 'string', maxLength: 128 },
    description: { type: 'string', maxLength: 4096 },
    modes: { type: 'array', items: { enum: ['validate', 'mutate'] }, uniqueItems: true },
    rules: { type: 'array', items: { $ref: '#/definitions/rule' } },
    settingsSchema: { type: 'object' },
  },
  definitions: schema.definitions,
};

export interface JsonSchema {
  type?: string;
  properties?: Record<string, JsonSchema>;
  required?: string[];
  items?: JsonSchema;
  $ref?: string;
  default?: unknown;
  definitions?: Record<string, JsonSchema>;
  [keyword: string]: unknown;
}

/** The schema of an object at a path of property names ("server", "tls"), following $refs. */
export function schemaAt(...path: string[]): JsonSchema {
  let node = schema;
  for (const name of path) {
    const next = resolveRef(node).properties?.[name];
    if (!next) throw new Error(`config.schema.json has no property ${path.join('.')}`);
    node = resolveRef(next);
  }
  node = resolveRef(node);
  // A list of objects stands for one entry: "policies" means the schema of one policy.
  const entry = node.type === 'array' && node.items ? resolveRef(node.items) : undefined;
  return entry?.type === 'object' ? entry : node;
}

function resolveRef(node: JsonSchema): JsonSchema {
  if (!node.$ref) return node;
  const name = node.$ref.replace('#/definitions/', '');
  const target = schema.definitions?.[name];
  if (!target) throw new Error(`config.schema.json: unresolved $ref ${node.$ref}`);
  return target;
}

/** The schema's default for each property of the object at `path` that declares one. */
export function defaultsAt<T extends object>(...path: string[]): Partial<T> {
  const properties = schemaAt(...path).properties ?? {};
  const out: Record<string, unknown> = {};
  for (const [name, property] of Object.entries(properties)) {
    const value = resolveRef(property).default;
    if (value !== undefined) out[name] = structuredClone(value);
  }
  return out as Partial<T>;
}

/** The default of one value (a property, or a shared definition such as "failurePolicy"). */
export function defaultOf<T>(...path: string[]): T {
  const value = path.length === 1 && schema.definitions?.[path[0]!] ? schema.definitions[path[0]!]!.default : schemaAt(...path).default;
  if (value === undefined) throw new Error(`config.schema.json gives no default for ${path.join('.')}`);
  return structuredClone(value) as T;
}

/** Ajv's first error, in an operator's words: the field, and what it may be. */
export function describeSchemaError(error: ErrorObject | undefined): string {
  if (!error) return 'is invalid';
  const path = error.instancePath || '/';
  if (error.keyword === 'additionalProperties') return `${path}: unknown field "${String(error.params.additionalProperty)}"`;
  if (error.keyword === 'required') return `${path}: missing required field "${String(error.params.missingProperty)}"`;
  if (error.keyword === 'enum') return `${path} must be one of ${(error.params.allowedValues as unknown[]).map((v) => JSON.stringify(v)).join(', ')}`;
  return `${path} ${error.message ?? 'is invalid'}`;
}
