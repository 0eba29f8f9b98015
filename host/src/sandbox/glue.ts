// Two hot spots of the JavaScript jco generates for a component, rewritten once when it is
// transpiled (issue 14). Measured on a TypeScript policy's call, they were a fifth of the
// worker's time outside the guest:
// - `_utf8AllocateAndEncode` counts a string's UTF-8 bytes one character at a time in
//   JavaScript (~25 µs for the 5 KiB review every call carries); Buffer.byteLength counts them
//   natively, with the same answer for lone surrogates (3 bytes, as encodeInto writes them).
// - `_debugLog`, called several times per call, reads process.env (a getenv) every time;
//   JCO_DEBUG is read once, when the glue is instantiated.
// - Every call of an import goes through jco's task machinery for the component model's async
//   (a task, a subtask, promise resolvers, several closures: ~8 µs, a third of a context read).
//   `portcullis:policy/context.read` is synchronous, takes and returns a string and never calls
//   back into the guest, so it is bound to a function that does only what the canonical ABI
//   asks: check the instance may be left, decode the request, call the host, write the answer.
// Each rewrite matches jco's text exactly or is skipped: a jco that generates something else
// gets its glue unchanged (slower, never wrong). test/unit/glue.test.ts holds the rewrites to
// the glue of the jco version in package-lock.json.

import { MAX_REQUEST_DECODE_BYTES } from '../context/read.ts';

/** Part of the transpile cache's key: cached glue from an older revision is transpiled again. */
export const GLUE_REVISION = 8;

/** Live handles of one resource type a component instance may hold, and reps of one type it may make. */
export const MAX_RESOURCE_HANDLES = 4096;
/** Handle tables a component's glue may declare (the example TypeScript policies have 14). */
export const MAX_RESOURCE_TABLES = 64;
/** A glue's handle tables, as jco declares them. */
export const HANDLE_TABLE = /\bconst handleTable\d+ = \[T_FLAG, 0\];/g;

const UTF8_LENGTH = /(function _utf8AllocateAndEncode\(s, realloc, memory\) \{[^]*?)let len = 0;\s*let codepoints = 0;\s*for \(let i = 0; i < s\.length; i\+\+\) \{[^]*?\n(\s*)const ptr = realloc\(0, 0, 1, len\);/;
// jco's trampoline for the context import (its name, memory, host function and realloc), and the
// statement that binds it behind the task machinery (its component index). Neither may reach
// into another trampoline or binding.
const CONTEXT_TRAMPOLINE = new RegExp(
  String.raw`const (_trampoline\d+) = function\(arg0, arg1, arg2\) \{\s*var ptr0 = arg0;\s*var len0 = arg1;\s*` +
  String.raw`var result0 = TEXT_DECODER_UTF8\.decode\(new Uint8Array\((memory\d+)\.buffer, ptr0, len0\)\);` +
  String.raw`(?:(?!const _trampoline)[^])*?fn: \(\) => _trackHostOperation\(\(\) => ([\w$]+)\(result0\)\),` +
  String.raw`(?:(?!const _trampoline)[^])*?var encodeRes = _utf8AllocateAndEncode\(ret, (realloc\d+), \2\);` +
  String.raw`(?:(?!const _trampoline)[^])*?\n\s*\}\n\s*\1\.fnName = 'portcullis:policy\/context@0\.1\.0#read';`,
);
const bindingOf = (trampoline: string) => new RegExp(
  String.raw`let (trampoline\d+) = ${trampoline}\.manuallyAsync \? (?:(?!\blet trampoline)[^])*?` +
  String.raw`_lowerImportBackwardsCompat\.bind\(\s*null,\s*\{\s*trampolineIdx: \d+,\s*componentIdx: (\d+),\s*isAsync: false,` +
  String.raw`(?:(?!\blet trampoline)[^])*?importFn: ${trampoline},\s*\},\s*\);`,
);

// jco's handle tables for resources a component defines itself (canon resource.new): one slot
// pair per live handle, and a Set of every rep ever made, on the worker's heap and for the life
// of the instance.
const CREATE_OWN = /(function rscTableCreateOwn\(table, rep\) \{\s*const free = table\[0\] & ~T_FLAG;)(\s*table\._createdReps\.add\(rep\);)/;
// Dropping an owned handle ends its resource: its rep leaves the Set of reps made (review 9: the
// Set only grew, so a component that made and dropped one resource a call failed at call 4097).
const REMOVE_OWN = /(function rscTableRemove\(table, handle\) \{[^]*?table\[0\] = handle \| T_FLAG;)/;
const CREATE_BORROW = /(function rscTableCreateBorrow\(table, rep, scopeId\) \{\s*if \(scopeId === undefined\) \{ throw new Error\("missing scopeId"\); \}\s*const free = table\[0\] & ~T_FLAG;)/;

const DEBUG_LOG = /const _debugLog = \(\.\.\.args\) => \{\s*if \(!globalThis\?\.process\?\.env\?\.JCO_DEBUG\) \{ return; \}\s*console\.debug\(\.\.\.args\);\s*\};/;

export interface TunedGlue {
  text: string;
  /** Which rewrites applied. */
  applied: ('utf8-length' | 'debug-log' | 'context-read' | 'resource-cap')[];
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
  text = fastContextRead(text, applied);
  text = capResourceTables(text, applied);
  return { text, applied };
}

/**
 * Red team 6: a component that made a million handles a call held 900 MiB of worker heap, past a
 * 64 MiB memory cap, until its worker was replaced. Past MAX_RESOURCE_HANDLES live handles of one
 * type, or as many live reps made, the call traps; prepare.ts refuses a component with more than
 * MAX_RESOURCE_TABLES tables (a resource type in each component instance: review 9 instantiated
 * one type 1,600 times), and one that makes resources when these rewrites did not apply. A
 * policy's contract has no resources: only its toolchain's WASI plumbing declares any, and 2,000
 * calls of the example policies (logging and context reads included) made none.
 * test/unit/glue.test.ts holds the rewrites to the glue of the jco in package-lock.json.
 */
function capResourceTables(text: string, applied: TunedGlue['applied']): string {
  if (!CREATE_OWN.test(text) || !REMOVE_OWN.test(text)) return text;
  applied.push('resource-cap');
  // A new slot pair is pushed only when no freed one is left: the table's length is its peak of live handles.
  const full = `\n    if (free === 0 && table.length >= ${2 * MAX_RESOURCE_HANDLES + 2}) ` +
    `throw new WebAssembly.RuntimeError('the component holds more than ${MAX_RESOURCE_HANDLES} resource handles of one type');`;
  return text
    .replace(CREATE_OWN, (_match, head: string, add: string) => `${head}${full}` +
      `\n    if (table._createdReps.size >= ${MAX_RESOURCE_HANDLES} && !table._createdReps.has(rep)) throw new WebAssembly.RuntimeError('the component made more than ${MAX_RESOURCE_HANDLES} resources of one type');${add}`)
    .replace(REMOVE_OWN, (_match, head: string) => `${head}\n    if (own) table._createdReps?.delete(rep);`)
    // jco writes the borrow helper only for components that lend handles: capped where it is there.
    .replace(CREATE_BORROW, (_match, head: string) => `${head}${full}`);
}

function fastContextRead(text: string, applied: TunedGlue['applied']): string {
  const trampoline = CONTEXT_TRAMPOLINE.exec(text);
  if (!trampoline) return text;
  const [definition, name, memory, read, realloc] = trampoline as unknown as [string, string, string, string, string];
  const binding = bindingOf(name).exec(text);
  if (!binding) return text;
  const [statement, bound, componentIdx] = binding as unknown as [string, string, string];
  applied.push('context-read');
  const fast = `
    const ${name}Fast = function(arg0, arg1, arg2) {
      _checkMayLeave(${componentIdx});
      const ret = ${read}(TEXT_DECODER_UTF8.decode(new Uint8Array(${memory}.buffer, arg0, Math.min(arg1, ${MAX_REQUEST_DECODE_BYTES}))));
      const encoded = _utf8AllocateAndEncode(ret, ${realloc}, ${memory});
      const view = dataView(${memory});
      view.setUint32(arg2 + 4, encoded.len, true);
      view.setUint32(arg2 + 0, encoded.ptr, true);
    };`;
  return text.replace(definition, () => definition + fast).replace(statement, () => `let ${bound} = ${name}Fast;`);
}
