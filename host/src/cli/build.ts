// `portcullis build SOURCE -o OUT.wasm`: type-check (TypeScript), compile, embed the policy's
// metadata, and load the result once in the real sandbox before writing it, so a module the
// host would refuse is never written.
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import { basename, dirname, extname, join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { errorMessage } from '../errors.ts';
import { checkInfo, embedPolicyInfo, type PolicyInfo } from '../policy/metadata.ts';
import { probeModes } from '../policy/load.ts';
import { SandboxPool } from '../sandbox/pool.ts';
import { BUILD_HELP } from './help.ts';
import { UsageError } from './usage.ts';

export default async function build(args: string[]): Promise<number> {
  const { values, positionals } = parseCli(args);
  const source = positionals[0];
  if (!source) throw new UsageError(`give the policy's source file\n${BUILD_HELP}`);
  // Outsider: the usage alone did not say what was missing.
  if (!values.out) throw new UsageError(`give -o FILE.wasm, where to write the policy (e.g. -o ${basename(source, extname(source))}.wasm)\n${BUILD_HELP}`);
  if (!existsSync(resolve(source))) throw new UsageError(`${source} does not exist`);
  const timeout = values.timeout === undefined ? undefined : Number(values.timeout);
  if (timeout !== undefined && !(timeout > 0)) throw new UsageError('--timeout must be a positive number of seconds');
  const language = values.lang === undefined ? undefined : normalizeLanguage(values.lang);
  const { buildPolicy } = await import('@portcullis/sdk/build');
  const started = performance.now();
  const { info, file: infoFile } = await packageInfo(resolve(source));
  const result = await buildPolicy({
    source, typecheck: !values['no-typecheck'], ...(language ? { language } : {}), ...(timeout ? { timeoutMs: timeout * 1000 } : {}),
  });
  let modes: PolicyInfo['modes'];
  let note = '';
  if (values['no-check']) {
    // A core module says what it can do by its exports, so its modes need no sandbox; a
    // component says it only when called.
    modes = result.language === 'assemblyscript' ? coreModes(result.bytes) : undefined;
    if (!modes) note = '; modes not embedded (--no-check): the host finds them at load';
  } else {
    const pool = new SandboxPool(1);
    try {
      modes = await probeModes(pool, info.name ?? 'policy', result.bytes);
    } catch (error) {
      throw new Error(`built ${source}, but the result does not load in the sandbox, so it was not written: ${errorMessage(error)}`);
    } finally {
      await pool.close();
    }
  }
  // Outsider: one with no handler built, and `run` then said "does not mutate; it supports: ".
  if (modes?.length === 0) {
    throw new Error(`${source} has ${result.language === 'assemblyscript'
      ? 'neither a validate nor a mutate export: export `function validate(): i32` (with handleValidate) or `mutate`'
      : 'neither a validate nor a mutate handler: give definePolicy `validate(request)` or `mutate(request)`'}; nothing was written`);
  }
  const bytes = embedPolicyInfo(result.bytes, { ...info, ...(modes ? { modes } : {}) });
  await mkdir(dirname(resolve(values.out)), { recursive: true });
  await writeFile(values.out, bytes);
  process.stderr.write(`built ${values.out} (${result.language}, ${bytes.length} bytes, ${Math.round(performance.now() - started)} ms${note}); ${metadataFrom(info, infoFile)}\n`);
  return 0;
}

function coreModes(bytes: Uint8Array): PolicyInfo['modes'] {
  const exported = new Set(WebAssembly.Module.exports(new WebAssembly.Module(bytes as Uint8Array<ArrayBuffer>)).map((e) => e.name));
  return (['validate', 'mutate'] as const).filter((mode) => exported.has(mode));
}

/** Metadata from the nearest package.json above the source, checked as the host will check it. */
async function packageInfo(source: string): Promise<{ info: PolicyInfo; file?: string }> {
  for (let dir = dirname(source); ; dir = dirname(dir)) {
    const file = join(dir, 'package.json');
    const text = await readFile(file, 'utf8').catch(() => undefined);
    if (text !== undefined) return { info: await infoFrom(file, text), file };
    if (dirname(dir) === dir) return { info: {} };
  }
}

/**
 * Where the embedded name and version came from. Newcomer: a policy written beside the folder's
 * own package.json (`npm init -y`) was built as that folder's package, and only `inspect` showed it.
 */
function metadataFrom(info: PolicyInfo, file: string | undefined): string {
  if (file === undefined) return 'no package.json above the source: no name, version or rules embedded';
  const what = info.name === undefined ? 'no name' : `name "${info.name}"${info.version === undefined ? '' : ` ${info.version}`}`;
  // Newcomer: "no rules" did not say that such a policy is called for everything.
  const rules = info.rules === undefined
    ? 'no rules (the configuration\'s rules apply, or else it is sent every namespaced CREATE, UPDATE and DELETE: add "portcullis": { "rules": [...] } there)'
    : `${info.rules.length} rule${info.rules.length === 1 ? '' : 's'}`;
  return `${what}, ${rules}, from ${file}`;
}

async function infoFrom(file: string, text: string): Promise<PolicyInfo> {
  let pkg: Record<string, unknown>;
  try {
    pkg = JSON.parse(text) as Record<string, unknown>;
  } catch (error) {
    throw new Error(`${file} is not JSON: ${errorMessage(error)}`);
  }
  const field = pkg.portcullis ?? {};
  if (typeof field !== 'object' || field === null || Array.isArray(field)) throw new Error(`${file}: "portcullis" must be an object with "rules" and/or "settingsSchema"`);
  const own = field as Record<string, unknown>;
  // A misspelt key would leave the module without rules, and a policy without rules runs on
  // every request (outside author: "rule" built silently, then a Pod policy denied Secrets).
  const unknown = Object.keys(own).filter((key) => key !== 'rules' && key !== 'settingsSchema');
  if (unknown.length > 0) throw new Error(`${file}: "portcullis" has ${unknown.map((k) => `"${k}"`).join(', ')}, which it does not know: its keys are "rules" and "settingsSchema"`);
  const info: Record<string, unknown> = {};
  if (typeof pkg.name === 'string') info.name = pkg.name.replace(/^@[^/]+\//, '');
  if (typeof pkg.version === 'string') info.version = pkg.version;
  if (typeof pkg.description === 'string' && pkg.description) info.description = pkg.description;
  if (own.rules !== undefined) info.rules = own.rules;
  if (typeof own.settingsSchema === 'string') {
    const schemaFile = resolve(dirname(file), own.settingsSchema);
    try {
      info.settingsSchema = JSON.parse(await readFile(schemaFile, 'utf8')) as unknown;
    } catch (error) {
      throw new Error(`${file}: portcullis.settingsSchema ${schemaFile}: ${errorMessage(error)}`);
    }
  } else if (own.settingsSchema !== undefined) {
    info.settingsSchema = own.settingsSchema;
  }
  return checkInfo(info, `${file} (its "portcullis" field and name/version/description)`);
}

function parseCli(args: string[]) {
  try {
    return parseArgs({
      args, allowPositionals: true,
      options: {
        out: { type: 'string', short: 'o' }, lang: { type: 'string' }, timeout: { type: 'string' },
        'no-typecheck': { type: 'boolean' }, 'no-check': { type: 'boolean' },
      },
    });
  } catch (error) {
    throw new UsageError(`${(error as Error).message}\n${BUILD_HELP}`);
  }
}

function normalizeLanguage(lang: string): 'typescript' | 'assemblyscript' {
  if (lang === 'ts' || lang === 'typescript') return 'typescript';
  if (lang === 'as' || lang === 'assemblyscript') return 'assemblyscript';
  throw new UsageError(`--lang must be typescript (ts) or assemblyscript (as), not "${lang}"`);
}
