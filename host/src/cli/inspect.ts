// `portcullis inspect FILE.wasm | oci://REG/REPO:TAG [--json]`: what a policy module is before
// anyone runs it: kind, size, digest, what it imports and exports, and the metadata that
// `portcullis build` embedded. Nothing of the module runs; components are read by wasm-tools.
import { parseArgs } from 'node:util';
import { errorMessage } from '../errors.ts';
import { readPolicyInfo, type PolicyInfo } from '../policy/metadata.ts';
import { checkCodeSection } from '../sandbox/code-walk.ts';
import { readLayout } from '../sandbox/memory-cap.ts';
import { moduleKind } from '../sandbox/module-kind.ts';
import { readPointedFile, sha256 } from '../util/files.ts';
import { MAX_MODULE_FILE_BYTES } from '../config/limits.ts';
import { INSPECT_HELP } from './help.ts';
import { UsageError } from './usage.ts';

interface Inspection {
  source: string;
  kind: 'component' | 'core';
  language: string;
  size: number;
  digest: string;
  imports: string[];
  exports: string[];
  metadata: PolicyInfo | null;
  metadataError?: string;
}

export default async function inspect(args: string[]): Promise<number> {
  let parsed;
  try {
    parsed = parseArgs({ args, allowPositionals: true, options: { json: { type: 'boolean' }, insecure: { type: 'boolean' }, 'docker-config': { type: 'string' } } });
  } catch (error) {
    throw new UsageError(`${errorMessage(error)}\n${INSPECT_HELP}`);
  }
  const { values, positionals } = parsed;
  const [source, ...extra] = positionals;
  if (!source || extra.length > 0) throw new UsageError(INSPECT_HELP);
  const bytes = await readBytes(source, values.insecure ?? false, values['docker-config']);
  const inspection = await inspectBytes(source, bytes);
  process.stdout.write(values.json ? `${JSON.stringify(inspection, null, 2)}\n` : text(inspection));
  return 0;
}

async function readBytes(source: string, insecure: boolean, dockerConfig: string | undefined): Promise<Uint8Array> {
  if (source.startsWith('oci://')) {
    const { fetchOci } = await import('../oci/fetcher.ts');
    const registry = source.slice('oci://'.length).split('/')[0] ?? '';
    return (await fetchOci(source, { insecure: insecure ? [registry] : [], ...(dockerConfig ? { dockerConfig } : {}) })).bytes;
  }
  try {
    return new Uint8Array(await readPointedFile(source, MAX_MODULE_FILE_BYTES));
  } catch (error) {
    throw new Error(`cannot read ${source}: ${errorMessage(error)}`);
  }
}

export async function inspectBytes(source: string, bytes: Uint8Array): Promise<Inspection> {
  const kind = moduleKind(bytes);
  if (!kind) throw new Error(`${source} is not a WebAssembly module or component (bad header)`);
  let metadata: PolicyInfo | null = null;
  let metadataError: string | undefined;
  try {
    metadata = readPolicyInfo(bytes) ?? null;
  } catch (error) {
    metadataError = errorMessage(error);
  }
  const { imports, exports } = kind === 'core' ? coreInterface(bytes) : await componentInterface(bytes);
  return {
    source, kind,
    language: kind === 'component' ? 'TypeScript/JavaScript (QuickJS component, run by jco)' : 'AssemblyScript or other (core module, Extism ABI)',
    size: bytes.length, digest: `sha256:${sha256(bytes)}`, imports, exports, metadata,
    ...(metadataError ? { metadataError } : {}),
  };
}

function coreInterface(bytes: Uint8Array): { imports: string[]; exports: string[] } {
  let module: WebAssembly.Module;
  try {
    // The host's bounded walks first: V8 validates a module whole, and 30 MB of nested blocks (a
    // module one inspects before trusting it) took 15.7 s and 1.7 GB here (red team); the host
    // refuses it at once.
    const { codeSection } = readLayout(bytes);
    if (codeSection) checkCodeSection(bytes, codeSection.start, codeSection.end);
  } catch (error) {
    throw new Error(`the core module is not one Portcullis would load: ${errorMessage(error)}`);
  }
  try {
    module = new WebAssembly.Module(bytes as Uint8Array<ArrayBuffer>);
  } catch (error) {
    throw new Error(`the core module does not compile: ${errorMessage(error)}`);
  }
  return {
    imports: WebAssembly.Module.imports(module).map((i) => `${i.module}.${i.name} (${i.kind})`),
    exports: WebAssembly.Module.exports(module).map((e) => `${e.name} (${e.kind})`),
  };
}

async function componentInterface(bytes: Uint8Array): Promise<{ imports: string[]; exports: string[] }> {
  const { componentWit } = await import('@bytecodealliance/jco');
  let wit: string;
  try {
    wit = await componentWit(bytes);
  } catch (error) {
    throw new Error(`the component cannot be read: ${errorMessage(error)}`);
  }
  // The world's own lines are enough: "import iface;" and "export iface;" / "export name: func(...)".
  const lines = wit.split('\n').map((l) => l.trim());
  const pick = (word: string) => lines.filter((l) => l.startsWith(`${word} `)).map((l) => l.slice(word.length + 1).replace(/;$/, ''));
  return { imports: pick('import'), exports: pick('export') };
}

function text(i: Inspection): string {
  const out = [
    `${i.source}`,
    `  kind:     ${i.kind} — ${i.language}`,
    `  size:     ${i.size} bytes`,
    `  digest:   ${i.digest}`,
    `  imports:  ${i.imports.length ? i.imports.join('\n            ') : '(none)'}`,
    `  exports:  ${i.exports.join('\n            ')}`,
  ];
  if (i.metadataError) out.push(`  metadata: unreadable: ${i.metadataError}`);
  else if (!i.metadata) out.push('  metadata: none (not built by portcullis build, or built before it embedded metadata)');
  else {
    const m = i.metadata;
    out.push(`  name:     ${m.name ?? '-'}${m.version ? ` ${m.version}` : ''}`);
    if (m.description) out.push(`  about:    ${m.description}`);
    if (m.modes) out.push(`  modes:    ${m.modes.join(', ')}`);
    if (m.rules) out.push(`  rules:    ${m.rules.map(ruleText).join('; ')}`);
    if (m.settingsSchema) out.push(`  settings: ${JSON.stringify(m.settingsSchema)}`);
  }
  return `${out.join('\n')}\n`;
}

/** `CREATE|UPDATE core,apps/v1/pods,deployments`: the core group is "", named so wherever it is listed. */
export function ruleText(rule: { operations: string[]; apiGroups: string[]; apiVersions: string[]; resources: string[] }): string {
  return `${rule.operations.join('|')} ${rule.apiGroups.map((g) => g || 'core').join(',')}/${rule.apiVersions.join(',')}/${rule.resources.join(',')}`;
}
