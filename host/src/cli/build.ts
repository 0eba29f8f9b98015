import { parseArgs } from 'node:util';
import { UsageError } from './usage.ts';

export default async function build(args: string[]): Promise<number> {
  const { values, positionals } = parseCli(args);
  const source = positionals[0];
  if (!source || !values.out) throw new UsageError('usage: portcullis build SOURCE.ts -o OUT.wasm [--lang typescript|assemblyscript] [--timeout SECONDS]');
  const timeout = values.timeout === undefined ? undefined : Number(values.timeout);
  if (timeout !== undefined && !(timeout > 0)) throw new UsageError('--timeout must be a positive number of seconds');
  const language = values.lang === undefined ? undefined : normalizeLanguage(values.lang);
  const { buildPolicyToFile } = await import('@portcullis/sdk/build');
  const started = performance.now();
  const result = await buildPolicyToFile({ source, out: values.out, ...(language ? { language } : {}), ...(timeout ? { timeoutMs: timeout * 1000 } : {}) });
  process.stderr.write(`built ${values.out} (${result.language}, ${result.bytes.length} bytes, ${Math.round(performance.now() - started)} ms)\n`);
  return 0;
}

function parseCli(args: string[]) {
  try {
    return parseArgs({ args, allowPositionals: true, options: { out: { type: 'string', short: 'o' }, lang: { type: 'string' }, timeout: { type: 'string' } } });
  } catch (error) {
    throw new UsageError((error as Error).message);
  }
}

function normalizeLanguage(lang: string): 'typescript' | 'assemblyscript' {
  if (lang === 'ts' || lang === 'typescript') return 'typescript';
  if (lang === 'as' || lang === 'assemblyscript') return 'assemblyscript';
  throw new UsageError(`--lang must be typescript (ts) or assemblyscript (as), not "${lang}"`);
}
