// The regular expressions of a module's settings schema (`pattern`, `patternProperties`,
// `propertyNames`) come from whoever built the module, and Ajv runs them on the main thread
// while the policy loads. With V8's backtracking RegExp, one 800-character pattern held the
// main thread for 54 s on a three-letter settings key, and every reload or restart did it
// again (red team 8). RE2's engine (re2js, a pure JavaScript port) takes time linear in the
// input, whatever the pattern; Kubernetes checks its own schemas' patterns with RE2 too.
import { createRequire } from 'node:module';
import type { RE2JS as RE2JSClass } from 're2js';
import { foreignText } from '../util/text.ts';

/** What Ajv needs of a compiled pattern; toString is Ajv's cache key for it. */
export interface LinearRegExp {
  test(input: string): boolean;
  toString(): string;
}

/** Ajv's `code.regExp` option: a function, and the name standalone code would call it by (never generated here). */
export type RegExpEngine = ((pattern: string, flags: string) => LinearRegExp) & { code: string };

/**
 * RE2 program units all the patterns of one schema may compile to. Linear is not free: matching
 * costs ~26 µs per character per 1,000 units, and compiling 310 patterns of `{1000}` repeats took
 * 0.85 s (review of red team 8). Real settings patterns are tens of units; `^[a-z0-9.-]{1,253}$`,
 * a DNS name, is about 760.
 */
export const MAX_PROGRAM_UNITS = 10_000;

/** A regExp option for one schema's compile: patterns compiled once each, within MAX_PROGRAM_UNITS together. */
export function linearRegExps(): RegExpEngine {
  const seen = new Map<string, LinearRegExp>();
  let units = 0;
  const engine = (pattern: string, flags: string): LinearRegExp => {
    const key = `/${pattern}/${flags}`;
    const known = seen.get(key);
    if (known) return known;
    const compiled = compileRe2(pattern);
    units += compiled.programSize();
    if (units > MAX_PROGRAM_UNITS) {
      throw new Error(`its patterns compile to more than ${MAX_PROGRAM_UNITS} RE2 program units together (at ${shown(pattern)}); ` +
        'settings patterns are matched on the host\'s main thread, so keep them to what a setting needs (smaller repeat counts)');
    }
    const regExp = { test: (input: string) => compiled.test(input), toString: () => key };
    seen.set(key, regExp);
    return regExp;
  };
  return Object.assign(engine, { code: 'linearRegExp' });
}

function compileRe2(pattern: string): RE2JSClass {
  try {
    return re2().compile(fromEcmaScript(pattern));
  } catch (error) {
    throw new Error(
      `pattern ${shown(pattern)}: ${foreignText((error as Error).message)}. ` +
      'Settings patterns are matched by RE2, as Kubernetes matches its schemas\' patterns, so that they run in linear time: ' +
      'no lookaround, no backreferences, repeat counts up to 1000, Unicode classes by short name (\\p{L}, \\p{Greek})',
      { cause: error },
    );
  }
}

const shown = (pattern: string) => JSON.stringify(foreignText(pattern, 80));

// What ECMAScript's `\s` matches (with the u flag), for RE2, whose `\s` is ASCII only.
const JS_SPACE = '\\t\\n\\v\\f\\r \\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}\\x{feff}';

/**
 * An ECMAScript pattern (JSON Schema's dialect) in RE2's syntax, where the two differ in ways a
 * settings pattern meets: `\uXXXX` and `\u{…}` (RE2 writes `\x{…}`), `\s` and `\S` (ASCII only in
 * RE2) and `.` (in RE2 it also matches \r, U+2028 and U+2029). Inside a class `\S` stays RE2's:
 * a class cannot hold a negated set.
 */
export function fromEcmaScript(pattern: string): string {
  let out = '';
  let inClass = false;
  for (let i = 0; i < pattern.length; i++) {
    const c = pattern[i]!;
    if (c === '\\') {
      const next = pattern[i + 1];
      if (next === 'u') {
        const braced = /^\{([0-9a-fA-F]{1,6})\}/.exec(pattern.slice(i + 2, i + 10));
        const plain = /^[0-9a-fA-F]{4}/.exec(pattern.slice(i + 2, i + 6));
        if (braced) {
          out += `\\x{${braced[1]!}}`;
          i += 1 + braced[0].length;
          continue;
        }
        if (plain) {
          out += `\\x{${plain[0]}}`;
          i += 5;
          continue;
        }
      }
      if (next === 's') {
        out += inClass ? JS_SPACE : `[${JS_SPACE}]`;
        i++;
        continue;
      }
      if (next === 'S' && !inClass) {
        out += `[^${JS_SPACE}]`;
        i++;
        continue;
      }
      out += next === undefined ? c : c + next;
      i++;
      continue;
    }
    if (inClass) {
      if (c === ']') inClass = false;
      out += c;
      continue;
    }
    if (c === '[') {
      inClass = true;
      out += c;
      if (pattern[i + 1] === '^') {
        out += '^';
        i++;
      }
      continue;
    }
    out += c === '.' ? '[^\\n\\r\\x{2028}\\x{2029}]' : c;
  }
  return out;
}

/** Loaded with Ajv, when a policy first brings a settings schema. */
function re2(): typeof RE2JSClass {
  return (re2Class ??= (createRequire(import.meta.url)('re2js') as { RE2JS: typeof RE2JSClass }).RE2JS);
}
let re2Class: typeof RE2JSClass | undefined;
