// The build's table from bundle lines back to the author's source lines, which the SDK uses to
// say where a TypeScript policy threw (QuickJS only knows lines of the bundle).
import { mkdir, mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { build } from 'esbuild';
import { expect, it } from 'vitest';
import { SOURCE_LINES_GLOBAL, withSourceLines } from '../../sdk/build/source-lines.ts';

it('maps each bundle line to the author file and line it came from, and leaves out node_modules', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'portcullis-lines-'));
  await mkdir(join(dir, 'lib'));
  await mkdir(join(dir, 'node_modules', 'dep'), { recursive: true });
  await writeFile(join(dir, 'node_modules', 'dep', 'index.js'), 'export function fromDep() {\n  return "dep";\n}\n');
  await writeFile(join(dir, 'lib', 'helper.ts'), '// a helper\n\nexport function deep(): never {\n  throw new Error("deep");\n}\n');
  await writeFile(join(dir, 'policy.ts'), 'import { deep } from "./lib/helper.ts";\nimport { fromDep } from "dep";\nexport const run = () => fromDep() + deep();\n');
  const bundled = await build({ entryPoints: [join(dir, 'policy.ts')], bundle: true, format: 'esm', write: false, sourcemap: 'inline', absWorkingDir: dir });
  const text = withSourceLines(bundled.outputFiles[0]!.text, dir, dir);

  expect(text).not.toContain('sourceMappingURL');
  const last = text.trimEnd().split('\n').at(-1);
  expect(last.startsWith(`globalThis.${SOURCE_LINES_GLOBAL} = `)).toBe(true);
  const table = JSON.parse(last.slice(last.indexOf('=') + 1, -1)) as { files: string[]; lines: string };
  expect(table.files.sort()).toEqual(['lib/helper.ts', 'policy.ts']);
  const lines = table.lines.split(';');
  const at = (needle: string) => {
    const index = text.split('\n').findIndex((l) => l.includes(needle));
    const [file, line] = lines[index]!.split(':');
    return `${table.files[Number(file)]}:${line}`;
  };
  expect(at('throw new Error("deep")')).toBe('lib/helper.ts:4');
  expect(at('fromDep() + deep()')).toBe('policy.ts:3');
  expect(lines[text.split('\n').findIndex((l) => l.includes('return "dep"'))]).toBe('');
});

it('leaves a bundle without an inline map as it is', () => {
  expect(withSourceLines('export const a = 1;\n', '/x')).toBe('export const a = 1;\n');
});
