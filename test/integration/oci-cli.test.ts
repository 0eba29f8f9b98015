// `portcullis push` and `portcullis pull` against a real registry: the digest reference on
// stdout, exit 0; one line on stderr and exit 1 on failure; exit 2 on usage errors.
import { mkdtemp, readFile, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cli } from '../helpers/cli.ts';
import { root, wasm } from '../helpers/policies.ts';
import { freePort, sha256, startRegistry, type TestRegistry } from '../helpers/registry.ts';

let registry: TestRegistry;
let dir: string;
let env: NodeJS.ProcessEnv;
const numbers = await readFile(wasm('numbers'));

beforeAll(async () => {
  registry = await startRegistry();
  dir = await mkdtemp(join(tmpdir(), 'portcullis-oci-cli-'));
  // No stray credentials or cache from the machine running the tests.
  env = { PORTCULLIS_CACHE: join(dir, 'cache'), DOCKER_CONFIG: join(dir, 'docker') };
});
afterAll(() => registry?.stop());

const oneLine = (stderr: string) => expect(stderr.trimEnd().split('\n')).toHaveLength(1);

describe('portcullis push / pull', () => {
  it('pushes, printing the digest reference, and pulls the same bytes back', async () => {
    const reference = `oci://${registry.host}/cli/numbers:v1`;
    const pushed = await cli(['push', wasm('numbers'), reference, '--insecure'], { env });
    expect(pushed).toMatchObject({ code: 0, stderr: '' });
    expect(pushed.stdout).toMatch(new RegExp(`^oci://${registry.host}/cli/numbers@sha256:[0-9a-f]{64}\\n$`));
    const out = join(dir, 'pulled.wasm');
    const pulled = await cli(['pull', reference, '-o', out, '--insecure'], { env });
    expect(pulled).toMatchObject({ code: 0, stderr: '', stdout: pushed.stdout });
    expect((await readFile(out)).equals(numbers)).toBe(true);
  });

  it('lets `portcullis run` use an oci:// policy, with insecure registries from the environment', async () => {
    await cli(['push', wasm('numbers'), `oci://${registry.host}/cli/numbers:run`, '--insecure'], { env });
    const { code, stdout, stderr } = await cli(
      ['run', '--policy', `oci://${registry.host}/cli/numbers:run`, '--request', `${root}test/fixtures/reviews/numbers-bad.json`],
      { env: { ...env, PORTCULLIS_INSECURE_REGISTRIES: `other.example,${registry.host}` } },
    );
    expect(stderr).toBe('');
    expect(code).toBe(0);
    expect(JSON.parse(stdout).response).toMatchObject({ allowed: false, status: { message: 'policy "numbers": Numbers must be within 0..100.' } });
    // Named as a configuration names it, without the tag (newcomer: it was "numbers:run").
    // A TypeScript policy from an empty cache: ~12 s of transpiling here, more on a loaded machine.
  }, 60_000);

  it('lets `portcullis run --insecure` reach a plain-HTTP registry without any environment', async () => {
    await cli(['push', wasm('numbers'), `oci://${registry.host}/cli/numbers:flag`, '--insecure'], { env });
    const refused = await cli(['run', '--policy', `oci://${registry.host}/cli/numbers:flag`, '--request', `${root}test/fixtures/reviews/numbers-bad.json`], { env: { PORTCULLIS_CACHE: env.PORTCULLIS_CACHE } });
    expect(refused.code).toBe(1);
    const { code, stdout, stderr } = await cli(
      ['run', '--policy', `oci://${registry.host}/cli/numbers:flag`, '--request', `${root}test/fixtures/reviews/numbers-bad.json`, '--insecure'],
      { env: { PORTCULLIS_CACHE: env.PORTCULLIS_CACHE } },
    );
    expect(stderr).toBe('');
    expect(code).toBe(0);
    expect(JSON.parse(stdout).response).toMatchObject({ allowed: false });
  });

  it.each([
    [['push'], /^portcullis push: usage: portcullis push POLICY\.wasm oci:\/\//],
    [['push', 'a.wasm', 'oci://127.0.0.1:1/x@sha256:' + 'a'.repeat(64)], /^portcullis push: push needs a tag/],
    [['push', 'a.wasm', 'nope'], /^portcullis push: "nope" is not a usable OCI reference/],
    [['push', 'a.wasm', 'oci://127.0.0.1:1/x:v1', '-o', 'x'], /^portcullis push: .*-o/],
    [['pull', 'oci://127.0.0.1:1/x:v1'], /^portcullis pull: usage: portcullis pull oci:\/\//],
    [['pull', 'oci://127.0.0.1:1/x:v1', '-o', 'x', '--verbose'], /^portcullis pull: unknown option --verbose/],
    [['pull', 'oci://127.0.0.1:1/x:v1', '-o', 'x', '--max-module-mib', '0'], /^portcullis pull: --max-module-mib must be a number of MiB above 0/],
  ])('exits 2 on usage errors: %j', async (args, message) => {
    const { code, stderr } = await cli(args, { env });
    expect(code).toBe(2);
    expect(stderr).toMatch(message);
    oneLine(stderr);
  });

  it('fails with one line naming the registry when it cannot be reached', async () => {
    const port = await freePort();
    const { code, stdout, stderr } = await cli(['push', wasm('numbers'), `oci://127.0.0.1:${port}/cli/numbers:v1`, '--insecure'], { env });
    expect(code).toBe(1);
    expect(stdout).toBe('');
    expect(stderr).toBe(`portcullis push: blob ${sha256(numbers)} (numbers.wasm) of oci://127.0.0.1:${port}/cli/numbers:v1: cannot reach 127.0.0.1:${port} (http): connection refused (is the registry running, and on that port?)\n`);
  });

  it('fails with one line when the tag does not exist', async () => {
    const reference = `oci://${registry.host}/cli/numbers:missing`;
    const { code, stderr } = await cli(['pull', reference, '-o', join(dir, 'x.wasm'), '--insecure'], { env });
    expect(code).toBe(1);
    expect(stderr).toMatch(new RegExp(`^portcullis pull: manifest of ${reference}: the registry has no such manifest \\(push it first, or check the tag or digest\\) \\(HTTP 404 MANIFEST_UNKNOWN: manifest unknown\\)\\n$`));
  });

  it('refuses to push a file that is not WebAssembly, and plain HTTP without --insecure', async () => {
    await writeFile(join(dir, 'text.wasm'), 'hello');
    const text = await cli(['push', join(dir, 'text.wasm'), `oci://${registry.host}/cli/x:v1`, '--insecure'], { env });
    expect(text).toMatchObject({ code: 1, stderr: `portcullis push: ${join(dir, 'text.wasm')} is not a WebAssembly module (it does not start with \\0asm)\n` });
    const plain = await cli(['push', wasm('numbers'), `oci://${registry.host}/cli/x:v1`], { env });
    expect(plain.code).toBe(1);
    expect(plain.stderr).toMatch(/^portcullis push: .*TLS error talking to 127\.0\.0\.1:\d+ \(https\).*list it as insecure/);
    oneLine(plain.stderr);
  });

  it('names a docker config given with --docker-config that does not exist', async () => {
    const { code, stderr } = await cli(['pull', `oci://${registry.host}/cli/numbers:v1`, '-o', join(dir, 'y.wasm'), '--insecure', '--docker-config', join(dir, 'none.json')], { env });
    expect(code).toBe(1);
    expect(stderr).toBe(`portcullis pull: cannot use docker config ${join(dir, 'none.json')}: no such file\n`);
  });

  it('refuses to pull a module above --max-module-mib, writing nothing', async () => {
    const big = new Uint8Array(1.5 * 2 ** 20).fill(0x61);
    big.set([0, 0x61, 0x73, 0x6d, 1, 0, 0, 0]);
    await writeFile(join(dir, 'big.wasm'), big);
    const reference = `oci://${registry.host}/cli/big:v1`;
    expect((await cli(['push', join(dir, 'big.wasm'), reference, '--insecure'], { env })).code).toBe(0);
    const out = join(dir, 'big-pulled.wasm');
    const { code, stdout, stderr } = await cli(['pull', reference, '-o', out, '--insecure', '--max-module-mib', '1'], { env });
    expect({ code, stdout }).toEqual({ code: 1, stdout: '' });
    expect(stderr).toBe(`portcullis pull: layer big.wasm of ${reference} is 1.5 MiB, above --max-module-mib (1 MiB); refused without downloading it (raise --max-module-mib if the policy really is that large)\n`);
    await expect(readFile(out)).rejects.toMatchObject({ code: 'ENOENT' });
  });
});
