// The metadata section portcullis build embeds: read back exactly, replaced not duplicated,
// and refused with one clear reason when a module carries a broken or hostile one.
import { describe, expect, it } from 'vitest';
import { compileSettingsSchema, embedPolicyInfo, MAX_METADATA_BYTES, METADATA_SECTION, MetadataError, readPolicyInfo } from '../../host/src/policy/metadata.ts';
import { writeLeb as leb } from '../../host/src/sandbox/memory-cap.ts';
import { ruleText } from '../../host/src/cli/inspect.ts';
import { module, RETURN_0 } from '../helpers/wasm.ts';

const base = () => module({ functions: [RETURN_0], exports: [{ name: 'validate', kind: 'func', index: 0 }] });
const info = {
  name: 'require-team', version: '1.2.3', description: 'Pods need a team', modes: ['validate' as const],
  rules: [{ operations: ['CREATE'], apiGroups: [''], apiVersions: ['v1'], resources: ['pods'] }],
  settingsSchema: { type: 'object', required: ['label'] },
};

/** A module with a custom section of this name and raw payload appended. */
function withSection(bytes: Uint8Array, name: string, payload: Uint8Array): Uint8Array {
  const nameBytes = new TextEncoder().encode(name);
  const body = [...leb(nameBytes.length), ...nameBytes, ...payload];
  return Uint8Array.from([...bytes, 0, ...leb(body.length), ...body]);
}

describe('embedded policy metadata', () => {
  it('reads back what was embedded, and the module still compiles with the same exports', () => {
    const bytes = embedPolicyInfo(base(), info);
    expect(readPolicyInfo(bytes)).toEqual(info);
    expect(WebAssembly.Module.exports(new WebAssembly.Module(bytes as Uint8Array<ArrayBuffer>)).map((e) => e.name)).toEqual(['validate']);
  });

  it('embedding again replaces the section instead of adding a second one', () => {
    const twice = embedPolicyInfo(embedPolicyInfo(base(), info), { name: 'other' });
    expect(readPolicyInfo(twice)).toEqual({ name: 'other' });
    expect(WebAssembly.Module.customSections(new WebAssembly.Module(twice as Uint8Array<ArrayBuffer>), METADATA_SECTION)).toHaveLength(1);
  });

  it('a module without the section has no metadata', () => {
    expect(readPolicyInfo(base())).toBeUndefined();
  });

  it.each([
    ['not JSON', new TextEncoder().encode('{nope'), /section is not UTF-8 JSON/],
    ['a mode that does not exist', new TextEncoder().encode('{"modes":["delete"]}'), /section: \/modes\/0 must be one of "validate", "mutate"/],
    ['an unknown field', new TextEncoder().encode('{"owner":"me"}'), /section: \/: unknown field "owner"/],
    ['a rule without operations', new TextEncoder().encode('{"rules":[{"apiGroups":[""],"apiVersions":["v1"],"resources":["pods"]}]}'), /\/rules\/0: missing required field "operations"/],
    ['a settings schema that is not a schema', new TextEncoder().encode('{"settingsSchema":{"type":"banana"}}'), /settingsSchema is not a usable JSON Schema/],
    ['invalid UTF-8', Uint8Array.of(0xff, 0xfe), /not UTF-8 JSON/],
    // 2,000 patterned properties (~100 KiB): seconds of code generation in the main thread, refused before it.
    ['a settings schema over the size limit', new TextEncoder().encode(JSON.stringify({ settingsSchema: {
      type: 'object', properties: Object.fromEntries(Array.from({ length: 2000 }, (_, i) => [`p${i}`, { type: 'string', pattern: `^[a-z]{1,${i + 1}}$` }])),
    } })), /settingsSchema is \d+ bytes, above the 16384-byte limit/],
  ])('refuses %s with the reason', (_, payload, reason) => {
    expect(() => readPolicyInfo(withSection(base(), METADATA_SECTION, payload))).toThrow(reason);
  });

  it('refuses two metadata sections, an oversized one, and a section that runs past the end', () => {
    const one = new TextEncoder().encode('{}');
    expect(() => readPolicyInfo(withSection(withSection(base(), METADATA_SECTION, one), METADATA_SECTION, one))).toThrow(/more than one/);
    expect(() => readPolicyInfo(withSection(base(), METADATA_SECTION, new Uint8Array(MAX_METADATA_BYTES + 1)))).toThrow(/above the 262144-byte limit/);
    const truncated = withSection(base(), METADATA_SECTION, one).subarray(0, -1);
    expect(() => readPolicyInfo(truncated)).toThrow(MetadataError);
  });

  it('walks a million-section module in bounded time without reading it all', () => {
    // 8-byte header + 2 MB of nameless custom sections (id 0, size 1, name length 0).
    const hostile = new Uint8Array(8 + 3 * 700_000);
    hostile.set(base().subarray(0, 8));
    for (let at = 8; at < hostile.length; at += 3) hostile[at + 1] = 1;
    const started = performance.now();
    expect(() => readPolicyInfo(hostile)).toThrow(/more than 10000 top-level sections/);
    expect(performance.now() - started).toBeLessThan(1000);
  });

  it('compiles a $ref once, not once per use (inlined, 150 uses of a 150-property definition took 9 s)', () => {
    const properties = (n: number, value: () => unknown) => Object.fromEntries(Array.from({ length: n }, (_, i) => [`p${i}`, value()]));
    const schema = {
      type: 'object',
      definitions: { d: { type: 'object', properties: properties(150, () => ({ type: 'string', minLength: 1 })) } },
      properties: properties(150, () => ({ $ref: '#/definitions/d' })),
    };
    const validate = compileSettingsSchema(schema);
    // The generated code grows with uses + definition, not uses × definition.
    expect(String(validate).length).toBeLessThan(100_000);
    expect(validate({ p0: { p1: 'x' } })).toBe(true);
    expect(validate({ p0: { p1: '' } })).toBe(false);
  });

  it('refuses a settings schema nested too deep to be read, as metadata', () => {
    // 200 KB, within the metadata cap; JSON.parse reads it, a recursive walk would overflow the stack.
    const payload = new TextEncoder().encode(`{"settingsSchema":{"enum":${'['.repeat(100_000)}${']'.repeat(100_000)}}}`);
    expect(() => readPolicyInfo(withSection(base(), METADATA_SECTION, payload))).toThrow(/settingsSchema nests too deep to be read/);
  });

  it('matches a module\'s patterns in linear time: a pattern that backtracks for a minute in V8 answers at once', () => {
    // Red team 8: with V8's RegExp, this held the main thread 54 s on the key "max", while the
    // policy loaded, at every reload and restart. RE2 gives the same answers without the wait.
    const evil = `^(?:${Array(400).fill('.').join('|')})*!$`;
    const validate = compileSettingsSchema({ type: 'object', propertyNames: { pattern: evil } });
    const started = performance.now();
    expect(validate({ max: 3 })).toBe(false);
    expect(validate({ 'max!': 3 })).toBe(true);
    expect(performance.now() - started).toBeLessThan(5000);
  });

  it('applies each pattern of a schema as written (each compiled pattern is its own, not one shared)', () => {
    const validate = compileSettingsSchema({
      type: 'object',
      properties: { team: { type: 'string', pattern: '^[a-z]+$' }, code: { type: 'string', pattern: '^[0-9]{3}$' } },
      patternProperties: { '^x-': { type: 'number' } },
    });
    expect(validate({ team: 'payments', code: '042', 'x-a': 1 })).toBe(true);
    expect(validate({ team: 'Payments' })).toBe(false);
    expect(validate({ code: '42' })).toBe(false);
    expect(validate({ code: 'abc' })).toBe(false);
    expect(validate({ 'x-a': 'one' })).toBe(false);
  });

  it('refuses a pattern RE2 cannot run in linear time, saying why, when the module is read', () => {
    for (const pattern of ['^(?=a)b', '(a)\\1', '((a{30}){30}){30}']) {
      const payload = new TextEncoder().encode(JSON.stringify({ settingsSchema: { type: 'string', pattern } }));
      expect(() => readPolicyInfo(withSection(base(), METADATA_SECTION, payload)))
        .toThrow(/settingsSchema is not a usable JSON Schema: pattern .*matched by RE2.*no lookaround, no backreferences/);
    }
  });

  it('matches as ECMAScript does where RE2 differs: \\u escapes, \\s and \\S beyond ASCII, and what `.` leaves out', () => {
    const cases: [string, string[]][] = [
      ['^\\S+$', ['ab', 'a b', 'a\u00a0b', 'a\u2003b', 'a\vb']],
      ['^[^\\s]+$', ['ab', 'a\u00a0b', 'a\u3000b']],
      ['^[\\s\\d]+$', ['1 2', '1\u00a02', 'a']],
      ['^.+$', ['ab', 'a\rb', 'a\u2028b', 'a\nb', 'é']],
      ['^[^\\u0000-\\u001f]*$', ['ab', 'a\u0001b']],
      ['^caf\\u00e9$', ['café', 'cafe']],
      ['^\\u{1F600}$', ['\u{1F600}', 'x']],
      ['^\\\\u0041$', ['\\u0041', 'A']],
      ['[\\]a]', [']', 'a', 'b']],
    ];
    for (const [pattern, inputs] of cases) {
      const validate = compileSettingsSchema({ type: 'string', pattern });
      for (const input of inputs) expect([pattern, input, validate(input)]).toEqual([pattern, input, new RegExp(pattern, 'u').test(input)]);
    }
  });

  it('refuses a schema whose patterns together would take too long to compile and match on the main thread', () => {
    // 16 KiB: 300 patterns of a 1,000-fold repeat took 0.85 s to compile (review of red team 8).
    const properties = Object.fromEntries(Array.from({ length: 12 }, (_, i) => [`p${i}`, { type: 'string', pattern: `^[a-${String.fromCharCode(98 + i)}]{1000}$` }]));
    const payload = new TextEncoder().encode(JSON.stringify({ settingsSchema: { type: 'object', properties } }));
    expect(() => readPolicyInfo(withSection(base(), METADATA_SECTION, payload))).toThrow(/its patterns compile to more than 10000 RE2 program units together/);
    // The same pattern used many times is compiled, and counted, once.
    const same = Object.fromEntries(Array.from({ length: 50 }, (_, i) => [`p${i}`, { type: 'string', pattern: '^[a-z0-9.-]{1,253}$' }]));
    expect(compileSettingsSchema({ type: 'object', properties: same })({ p0: 'example.com', p1: 'UPPER' })).toBe(false);
  });
});

describe('inspect shows rules', () => {
  it('names the core group "core" wherever it is listed', () => {
    expect(ruleText({ operations: ['CREATE', 'UPDATE'], apiGroups: ['', 'apps'], apiVersions: ['v1'], resources: ['pods', 'deployments'] }))
      .toBe('CREATE|UPDATE core,apps/v1/pods,deployments');
  });
});
