// Which line of the author's source each line of the bundle came from. QuickJS reports an
// exception's stack in lines of the bundle (componentize-qjs's user.js, which is the bundle
// line for line), and a message saying "user.js:337" tells the author nothing; the SDK's runtime
// turns it into "policy.ts:4" with this table (sdk/src/policy.ts, `located`).
import { isAbsolute, relative, resolve, sep } from 'node:path';

/** Where the SDK's runtime looks for the table; set by the statement appended to the bundle. */
export const SOURCE_LINES_GLOBAL = '__portcullisSourceLines';

const BASE64 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/';
const DIGIT = new Map([...BASE64].map((c, i) => [c, i]));
const INLINE_MAP = /\n?\/\/# sourceMappingURL=data:application\/json;base64,([A-Za-z0-9+/=]+)\s*$/;

interface SourceMap { sources: string[]; mappings: string }

/**
 * `bundle`: esbuild's output with an inline source map (`sourcemap: 'inline'`), whose source
 * paths are relative to `cwd`. Returns the bundle without the map and with one statement
 * appended (after the last line, so no line moves) that sets the table: the author's files
 * relative to `sourceDir`, and for each bundle line "file:line" (1-based) or nothing. The SDK
 * and anything under node_modules are left out: a location there would not help the author.
 */
export function withSourceLines(bundle: string, sourceDir: string, cwd = process.cwd()): string {
  const found = INLINE_MAP.exec(bundle);
  if (!found) return bundle;
  const code = bundle.slice(0, found.index);
  let map: SourceMap;
  try {
    map = JSON.parse(Buffer.from(found[1]!, 'base64').toString('utf8')) as SourceMap;
  } catch {
    return code;
  }
  const sdkDir = resolve(import.meta.dirname, '..');
  const files: string[] = [];
  const fileIndex = map.sources.map((source) => {
    const path = resolve(cwd, source);
    if (path.startsWith(sdkDir + sep) || path.split(sep).includes('node_modules') || source.endsWith('portcullis-entry.js')) return -1;
    const shown = relative(sourceDir, path);
    files.push(shown === '' || shown.startsWith('..') || isAbsolute(shown) ? path : shown);
    return files.length - 1;
  });
  const lines = firstSegments(map.mappings).map((at) => (at && fileIndex[at.source]! >= 0 ? `${fileIndex[at.source]}:${at.line + 1}` : ''));
  const table = JSON.stringify({ files, lines: lines.join(';').replace(/;+$/, '') });
  return `${code}\nglobalThis.${SOURCE_LINES_GLOBAL} = ${table};\n`;
}

/** For each generated line, the source and 0-based source line of its first segment. */
function firstSegments(mappings: string): ({ source: number; line: number } | undefined)[] {
  const out: ({ source: number; line: number } | undefined)[] = [];
  // Source index, line and column are deltas across the whole mapping; the generated column per line.
  let source = 0;
  let line = 0;
  for (const generatedLine of mappings.split(';')) {
    let first: { source: number; line: number } | undefined;
    for (const segment of generatedLine.split(',')) {
      if (segment === '') continue;
      const fields = decodeVlq(segment);
      if (fields.length < 4) continue;
      source += fields[1]!;
      line += fields[2]!;
      first ??= { source, line };
    }
    out.push(first);
  }
  return out;
}

function decodeVlq(segment: string): number[] {
  const values: number[] = [];
  let value = 0;
  let shift = 0;
  for (const char of segment) {
    const digit = DIGIT.get(char);
    if (digit === undefined) return [];
    value += (digit & 31) * 2 ** shift;
    if (digit & 32) {
      shift += 5;
      continue;
    }
    values.push(value & 1 ? -Math.floor(value / 2) : Math.floor(value / 2));
    value = 0;
    shift = 0;
  }
  return values;
}
