import { expect, it } from 'vitest';
import { stringifyDeep } from '../../host/src/util/deep-json.ts';

/** A small seeded generator, so a failure names a case that can be run again. */
function random(seed: number): () => number {
  return () => {
    seed = (seed * 1103515245 + 12345) % 2 ** 31;
    return seed / 2 ** 31;
  };
}

function value(rnd: () => number, depth: number): unknown {
  const pick = Math.floor(rnd() * (depth > 3 ? 6 : 8));
  switch (pick) {
    case 0: return null;
    case 1: return rnd() < 0.5;
    case 2: return [0, -0, 1.5, -2e21, 1e-7, 2 ** 60, Number.MAX_SAFE_INTEGER][Math.floor(rnd() * 7)];
    case 3: return ['', 'a"b\\c', 'line\nbreak\t', '\u0000\u001f', 'é☃😀', '\ud800 lone', '</script>'][Math.floor(rnd() * 7)];
    case 4: return undefined;
    case 5: return Infinity;
    case 6: return Array.from({ length: Math.floor(rnd() * 4) }, () => value(rnd, depth + 1));
    default: return Object.fromEntries(Array.from({ length: Math.floor(rnd() * 4) }, (_, i) => [['k', '', '"q"', '__proto__x', `n${i}`][i % 5]!, value(rnd, depth + 1)]));
  }
}

it('writes what JSON.stringify writes, on random values', () => {
  for (let seed = 1; seed <= 2000; seed++) {
    const v = value(random(seed), 0);
    expect(stringifyDeep(v), `seed ${seed}`).toBe(JSON.stringify(v) ?? 'null');
  }
});

it('writes values nested far deeper than JSON.stringify can', () => {
  const depth = 20_000;
  const text = `{"a":${'['.repeat(depth)}{"b":${'{"c":'.repeat(depth)}1${'}'.repeat(depth)}}${']'.repeat(depth)}}`;
  const parsed: unknown = JSON.parse(text);
  expect(() => JSON.stringify(parsed)).toThrow(RangeError);
  expect(stringifyDeep(parsed)).toBe(text);
});
