// `portcullis build` type-checks a TypeScript policy before bundling it: esbuild only strips
// types, so without this a wrong field name in a policy compiles and fails in the cluster.
// The policy's own tsconfig.json (the nearest one above it) decides the options; without one,
// strict defaults that fit the SDK apply.
import { dirname, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { CompilerOptions } from 'typescript';

/** The SDK's own files are checked where the SDK is built, not in every policy that uses it. */
const sdkRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..') + sep;

const DEFAULTS = {
  target: 'es2022', module: 'nodenext', moduleResolution: 'nodenext', strict: true, noEmit: true, skipLibCheck: true, types: [],
};

/** Type errors, one per line with file:line:column, or an empty list. */
export async function typeErrors(source: string): Promise<string[]> {
  const ts = (await import('typescript')).default;
  const configFile = ts.findConfigFile(dirname(source), (file) => ts.sys.fileExists(file));
  let options: CompilerOptions;
  if (configFile) {
    const read = ts.readConfigFile(configFile, (file) => ts.sys.readFile(file));
    if (read.error) return [ts.flattenDiagnosticMessageText(read.error.messageText, '\n')];
    options = ts.parseJsonConfigFileContent(read.config, ts.sys, dirname(configFile)).options;
  } else {
    options = ts.convertCompilerOptionsFromJson(DEFAULTS, dirname(source)).options;
  }
  const program = ts.createProgram([source], { ...options, noEmit: true });
  const errors = ts.getPreEmitDiagnostics(program).filter((d) => d.category === ts.DiagnosticCategory.Error && !d.file?.fileName.startsWith(sdkRoot));
  return errors.map((d) => {
    const text = ts.flattenDiagnosticMessageText(d.messageText, '\n');
    if (!d.file || d.start === undefined) return text;
    const { line, character } = d.file.getLineAndCharacterOfPosition(d.start);
    return `${d.file.fileName}:${line + 1}:${character + 1}: ${text}`;
  });
}
