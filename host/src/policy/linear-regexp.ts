// The regular expressions of a module's settings schema (`pattern`, `patternProperties`,
// `propertyNames`) come from whoever built the module, and Ajv runs them on the main thread
// while the policy loads. With V8's backtracking RegExp, one 800-character pattern held the
// main thread for 54 s on a three-letter settings key, and every reload or restart did it
// again (red team 8). RE2's engine (re2js, a pure JavaScript port) takes time linear in the
// input, whatever the pattern; Kubernetes checks its own schemas' patterns with RE2 too.
import { createRequire } from 'node:module';
import type { RE2JS as RE2JSClass } from 're2js';

/** What Ajv needs of a compiled pattern; toString is Ajv's cache key for it. */
export interface LinearRegExp {
  test(input: string): boolean;
  toString(): string;
}

/** Ajv's `code.regExp`: compiles `pattern` with RE2, or throws saying what RE2 does not take. */
export function linearRegExp(pattern: string, flags: string): LinearRegExp {
  let compiled: RE2JSClass;
  try {
    compiled = re2().compile(pattern);
  } catch (error) {
    throw new Error(
      `pattern ${JSON.stringify(pattern.length > 80 ? `${pattern.slice(0, 80)}…` : pattern)}: ${(error as Error).message}. ` +
      'Settings patterns use RE2 syntax, as Kubernetes schemas do, so that they run in linear time: ' +
      'no lookaround, no backreferences, repeat counts up to 1000',
      { cause: error },
    );
  }
  const key = `/${pattern}/${flags}`;
  return { test: (input) => compiled.test(input), toString: () => key };
}
// Ajv writes this name into standalone code; the host never generates standalone code.
linearRegExp.code = 'linearRegExp';

/** Loaded with Ajv, when a policy first brings a settings schema. */
function re2(): typeof RE2JSClass {
  return (re2Class ??= (createRequire(import.meta.url)('re2js') as { RE2JS: typeof RE2JSClass }).RE2JS);
}
let re2Class: typeof RE2JSClass | undefined;
