// Two hot spots of the JavaScript jco generates for a component, rewritten once when it is
// transpiled (issue 14). Measured on a TypeScript policy's call, they were a fifth of the
// worker's time outside the guest:
// - `_utf8AllocateAndEncode` counts a string's UTF-8 bytes one character at a time in
//   JavaScript (~25 µs for the 5 KiB review every call carries); Buffer.byteLength counts them
//   natively, with the same answer for lone surrogates (3 bytes, as encodeInto writes them).
// - `_debugLog`, called several times per call, reads process.env (a getenv) every time;
//   JCO_DEBUG is read once, when the glue is instantiated.
// Each rewrite matches jco's text exactly or is skipped: a jco that generates something else
// gets its glue unchanged (slower, never wrong). test/unit/glue.test.ts holds the rewrites to
// the glue of the jco version in package-lock.json.

/** Part of the transpile cache's key: cached glue from an older revision is transpiled again. */
export const GLUE_REVISION = 2;

const UTF8_LENGTH = /(function _utf8AllocateAndEncode\(s, realloc, memory\) \{[^]*?)let len = 0;\s*let codepoints = 0;\s*for \(let i = 0; i < s\.length; i\+\+\) \{[^]*?\n(\s*)const ptr = realloc\(0, 0, 1, len\);/;
const DEBUG_LOG = /const _debugLog = \(\.\.\.args\) => \{\s*if \(!globalThis\?\.process\?\.env\?\.JCO_DEBUG\) \{ return; \}\s*console\.debug\(\.\.\.args\);\s*\};/;

export interface TunedGlue {
  text: string;
  /** Which rewrites applied. */
  applied: ('utf8-length' | 'debug-log')[];
}

export function tuneGlue(glue: string): TunedGlue {
  const applied: TunedGlue['applied'] = [];
  let text = glue.replace(UTF8_LENGTH, (_match, head: string, indent: string) => {
    applied.push('utf8-length');
    // For ASCII (byte length = string length) every unit is a code point; otherwise each
    // surrogate pair counts once, as jco's loop counts them (without building an array).
    return `${head}const len = Buffer.byteLength(s, 'utf8');\n` +
      `${indent}let codepoints = s.length;\n` +
      `${indent}if (len !== s.length) for (let i = 0; i + 1 < s.length; i++) { const ch = s.charCodeAt(i); ` +
      'if (ch >= 0xd800 && ch <= 0xdbff && (s.charCodeAt(i + 1) & 0xfc00) === 0xdc00) { codepoints--; i++; } }\n' +
      `${indent}const ptr = realloc(0, 0, 1, len);`;
  });
  text = text.replace(DEBUG_LOG, () => {
    applied.push('debug-log');
    return 'const _debugLog = globalThis?.process?.env?.JCO_DEBUG ? (...args) => { console.debug(...args); } : () => {};';
  });
  return { text, applied };
}
