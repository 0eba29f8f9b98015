// `portcullis push POLICY.wasm oci://REG/REPO:TAG` and `portcullis pull oci://REG/REPO:TAG -o FILE.wasm`.
// Push prints the pushed artifact pinned by digest, the reference to put in a configuration;
// pull prints the same for what it fetched. Failures throw: main.ts makes them one stderr line.
import { writeFile } from 'node:fs/promises';
import { basename } from 'node:path';
import { parseArgs } from 'node:util';
import { errorMessage } from '../errors.ts';
import { MAX_MODULE_FILE_BYTES } from '../config/limits.ts';
import { readPointedFile } from '../util/files.ts';
import { isWasm } from '../oci/artifact.ts';
import { RegistryError } from '../oci/errors.ts';
import { fetchOci } from '../oci/fetcher.ts';
import { openClient, resolveOptions } from '../oci/options.ts';
import { pushPolicy } from '../oci/push.ts';
import { parseReference, pinnedReference, type OciReference } from '../oci/reference.ts';
import { UsageError } from './usage.ts';

const PUSH_USAGE = 'usage: portcullis push POLICY.wasm oci://REGISTRY/REPO:TAG [--insecure] [--docker-config PATH]';
const PULL_USAGE = 'usage: portcullis pull oci://REGISTRY/REPO[:TAG|@sha256:DIGEST] -o FILE.wasm [--insecure] [--docker-config PATH] [--max-module-mib N]';

export async function push(args: string[]): Promise<number> {
  const { values, positionals } = parseCli(args, PUSH_USAGE);
  const [file, reference, ...extra] = positionals;
  if (!file || !reference || extra.length) throw new UsageError(PUSH_USAGE);
  const ref = parseRef(reference);
  if (!ref.tag || ref.digest) throw new UsageError(`push needs a tag (oci://REGISTRY/REPO:TAG), not a digest: ${reference}`);
  let wasm: Uint8Array;
  try {
    wasm = new Uint8Array(await readPointedFile(file, MAX_MODULE_FILE_BYTES));
  } catch (error) {
    throw new Error(`cannot read ${file}: ${errorMessage(error)}`);
  }
  if (!isWasm(wasm)) throw new Error(`${file} is not a WebAssembly module (it does not start with \\0asm)`);
  const settings = await resolveOptions(registryOptions(values, ref));
  const client = await openClient(ref, settings, 'pull,push');
  try {
    const digest = await pushPolicy(client, ref, wasm, basename(file));
    process.stdout.write(`${pinnedReference(ref, digest)}\n`);
    return 0;
  } finally {
    await client.close();
  }
}

export async function pull(args: string[]): Promise<number> {
  const { values, positionals } = parseCli(args, PULL_USAGE, true);
  const [reference, ...extra] = positionals;
  if (!reference || extra.length || !values.output) throw new UsageError(PULL_USAGE);
  const ref = parseRef(reference);
  const pulled = await fetchOci(reference, { ...registryOptions(values, ref), ...maxModule(values['max-module-mib']) });
  try {
    await writeFile(values.output, pulled.bytes);
  } catch (error) {
    throw new Error(`cannot write ${values.output}: ${errorMessage(error)}`);
  }
  process.stdout.write(`${pinnedReference(ref, pulled.manifestDigest)}\n`);
  return 0;
}

type Values = ReturnType<typeof parseCli>['values'];

function parseCli(args: string[], usage: string, output = false) {
  try {
    const { values, positionals } = parseArgs({
      args, allowPositionals: true,
      options: { insecure: { type: 'boolean' }, 'docker-config': { type: 'string' }, output: { type: 'string', short: 'o' }, 'max-module-mib': { type: 'string' } },
    });
    if (values.output !== undefined && !output) throw new Error('-o/--output is only for pull');
    if (values['max-module-mib'] !== undefined && !output) throw new Error('--max-module-mib is only for pull');
    return { values, positionals };
  } catch (error) {
    throw new UsageError(`${errorMessage(error)}; ${usage}`);
  }
}

function parseRef(text: string): OciReference {
  try {
    return parseReference(text);
  } catch (error) {
    if (error instanceof RegistryError) throw new UsageError(error.message);
    throw error;
  }
}

// The same bound as a served policy's (limits.maxModuleMiB, default 32): pull is how an
// operator looks at an artifact, and a hostile one must not fill their disk either.
function maxModule(text: string | undefined): { maxModuleBytes?: number; maxModuleSetting: string } {
  if (text === undefined) return { maxModuleSetting: '--max-module-mib' };
  const value = Number(text);
  if (!(value > 0 && value <= 1024)) throw new UsageError(`--max-module-mib must be a number of MiB above 0 and at most 1024, not ${JSON.stringify(text)}; ${PULL_USAGE}`);
  return { maxModuleBytes: value * 2 ** 20, maxModuleSetting: '--max-module-mib' };
}

function registryOptions(values: Values, ref: OciReference) {
  return {
    insecure: values.insecure ? [ref.registry] : [],
    ...(values['docker-config'] ? { dockerConfig: values['docker-config'] } : {}),
  };
}
