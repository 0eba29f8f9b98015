// The glue rewrites must apply to what the jco in package-lock.json generates (or they silently
// stop paying off), and the rewritten encoder must give the guest the same bytes as jco's own.
import { readFileSync } from 'node:fs';
import { transpile } from '@bytecodealliance/jco';
import { beforeAll, expect, it } from 'vitest';
import { MAX_REQUEST_DECODE_BYTES } from '../../host/src/context/read.ts';
import { tuneGlue } from '../../host/src/sandbox/glue.ts';
import { wasm } from '../helpers/policies.ts';

let glue = '';
beforeAll(async () => {
  const out = await transpile(readFileSync(wasm('require-labels')), { name: 'policy', instantiation: 'async', noTypescript: true, nodejsCompat: false });
  glue = Buffer.from(out.files['policy.js']!).toString('utf8');
}, 60_000);

type Realloc = (old: number, oldLen: number, align: number, len: number) => number;
type Encode = (s: string, realloc: Realloc, memory: { buffer: ArrayBuffer }) => { ptr: number; len: number; codepoints: number };

/** jco's `_utf8AllocateAndEncode` as a function of its own, from a glue text. */
function encoderOf(text: string): Encode {
  const source = /function _utf8AllocateAndEncode\(s, realloc, memory\) \{[^]*?\n {2}\}\n/.exec(text)![0];
  // eslint-disable-next-line @typescript-eslint/no-implied-eval
  return new Function('TEXT_ENCODER_UTF8', `${source}; return _utf8AllocateAndEncode;`)(new TextEncoder()) as Encode;
}

it('applies every rewrite to the glue of the jco in use', () => {
  const { text, applied } = tuneGlue(glue);
  expect(applied).toEqual(['utf8-length', 'debug-log', 'context-read', 'resource-cap']);
  // Resource handle tables are capped where handles are made, owned or borrowed.
  expect(text.match(/if \(free === 0 && table\.length >= 8194\) throw new WebAssembly\.RuntimeError\('the component holds more than 4096 resource handles of one type'\);/g)).toHaveLength(2);
  expect(text).toContain("if (table._createdReps.size >= 4096 && !table._createdReps.has(rep)) throw new WebAssembly.RuntimeError('the component made more than 4096 resources of one type');");
  // A dropped owned handle's rep leaves the Set of reps made, which otherwise only grew.
  expect(text).toMatch(/table\[0\] = handle \| T_FLAG;\n {4}if \(own\) table\._createdReps\?\.delete\(rep\);/);
  expect(text).not.toContain('process?.env?.JCO_DEBUG) { return; }');
  expect(text).toContain("Buffer.byteLength(s, 'utf8')");
  // The context import is bound to the direct function; jco's own stays defined, unused.
  const [, fast] = /let trampoline\d+ = (_trampoline\d+Fast);/.exec(text) ?? ['', ''];
  expect(fast).toMatch(/^_trampoline\d+Fast$/);
  expect(text).toContain(`const ${fast} = function(arg0, arg1, arg2) {`);
  // A request longer than the reader takes is decoded only as far as needed to refuse it.
  expect(text).toContain(`Math.min(arg1, ${MAX_REQUEST_DECODE_BYTES})`);
  expect(text.match(/_lowerImportBackwardsCompat\.bind\(/g)?.length).toBe(glue.match(/_lowerImportBackwardsCompat\.bind\(/g)!.length - 2);
  expect(text).toContain(`${fast.replace(/Fast$/, '')}.fnName = 'portcullis:policy/context@0.1.0#read'`);
});

it('skips the context rewrite when jco binds the import some other way', () => {
  const renamed = glue.replace(/let (trampoline\d+) = (_trampoline\d+)\.manuallyAsync/g, 'let $1 = $2.isManuallyAsync');
  const { applied } = tuneGlue(renamed);
  expect(applied).toEqual(['utf8-length', 'debug-log', 'resource-cap']);
});

it.each([
  ['ASCII', '{"request":{"uid":"abc"}}'],
  ['two- and three-byte characters', 'é€ Grüße ☃'],
  ['surrogate pairs', 'emoji 😀 and 𝄞'],
  ['a lone surrogate (encoded as U+FFFD)', 'a\ud800b'],
])('encodes %s to the same bytes, length and code points as jco', (_, input) => {
  const run = (encode: Encode) => {
    const memory = { buffer: new ArrayBuffer(1024) };
    const result = encode(input, (_old, _oldLen, _align, len) => {
      expect(len).toBeGreaterThan(0);
      return 16;
    }, memory);
    return { ...result, bytes: Buffer.from(memory.buffer, result.ptr, result.len).toString('hex') };
  };
  const before = run(encoderOf(glue));
  const after = run(encoderOf(tuneGlue(glue).text));
  expect(after).toEqual(before);
  expect(after.bytes).toBe(Buffer.from(input, 'utf8').toString('hex'));
});

it('leaves glue it does not recognise unchanged', () => {
  const other = 'function _utf8AllocateAndEncode(str, realloc, memory) { let n = 0; }\nconst _debugLog = () => {};';
  expect(tuneGlue(other)).toEqual({ text: other, applied: [] });
});

it('gives every example TypeScript policy the glue the inline lane has reviewed (update REVIEWED_GLUE only after reading a new one)', async () => {
  const { REVIEWED_GLUE } = await import('../../host/src/sandbox/inline-lane.ts');
  const { createHash } = await import('node:crypto');
  const hashes = new Set<string>();
  for (const name of ['require-labels', 'numbers', 'show-auth']) {
    const out = await transpile(readFileSync(wasm(name)), { name: 'policy', instantiation: 'async', noTypescript: false, nodejsCompat: false });
    hashes.add(createHash('sha256').update(tuneGlue(Buffer.from(out.files['policy.js']!).toString('utf8')).text).digest('hex'));
  }
  expect([...hashes].filter((hash) => !REVIEWED_GLUE.has(hash))).toEqual([]);
}, 60_000);

it('a glue whose handle tables the caps cannot reach is refused, not loaded without them (review 9)', async () => {
  const { resourceProblem } = await import('../../host/src/sandbox/prepare.ts');
  expect(() => resourceProblem(glue, tuneGlue(glue))).not.toThrow();
  // A jco that writes the helper another way: the rewrite does not apply, and the component is refused.
  const other = glue.replace('table._createdReps.add(rep);', 'table._createdReps.add(rep); /* another jco */');
  const reworded = other.replace(/const free = table\[0\] & ~T_FLAG;\s*table\._createdReps/, 'let free = table[0] & ~T_FLAG; table._createdReps');
  expect(tuneGlue(reworded).applied).not.toContain('resource-cap');
  expect(() => resourceProblem(reworded, tuneGlue(reworded))).toThrow(/it makes resources, and the glue this jco wrote for it does not have the shape glue\.ts caps/);
});
