// Red team: a module path that names a FIFO, a device or a /proc file got past maxModuleMiB (its
// size reads 0) and hung or filled the host. Only regular files are read, never past the limit.
import { execFileSync } from 'node:child_process';
import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { expect, it } from 'vitest';
import { readModule } from '../../host/src/policy/source.ts';

it('refuses what is not a regular file, without opening it', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'portcullis-source-'));
  const fifo = join(dir, 'policy.wasm');
  execFileSync('mkfifo', [fifo]);
  // Opened, a FIFO with no writer would block here for good.
  await expect(readModule(fifo, 32 * 2 ** 20)).rejects.toThrow(`${fifo} is not a regular file (a FIFO); a policy module must be a file`);
  await expect(readModule('/dev/zero', 32 * 2 ** 20)).rejects.toThrow('/dev/zero is not a regular file (a device)');
  await expect(readModule(dir, 32 * 2 ** 20)).rejects.toThrow(`${dir} is not a regular file (a directory)`);
});

it('reads no more than the limit, whatever the size says', async () => {
  // /proc files say size 0 and have content: read up to the limit, and refused past it.
  await expect(readModule('/proc/self/status', 64)).rejects.toThrow(/^\/proc\/self\/status is larger than limits\.maxModuleMiB/);
  const file = join(await mkdtemp(join(tmpdir(), 'portcullis-source-')), 'm.wasm');
  await writeFile(file, new Uint8Array(3 * 2 ** 20 + 5).fill(1));
  expect((await readModule(file, 4 * 2 ** 20)).length).toBe(3 * 2 ** 20 + 5);
  await expect(readModule(file, 3 * 2 ** 20)).rejects.toThrow(/is 3 MiB, above limits\.maxModuleMiB \(3 MiB\)/);
});

it('refuses a FIFO swapped in after the path was judged a file, instead of waiting on it', async () => {
  // readAtMost is what readModule reads with once the path looked like a regular file.
  const { readAtMost } = await import('../../host/src/util/files.ts');
  const fifo = join(await mkdtemp(join(tmpdir(), 'portcullis-source-')), 'policy.wasm');
  execFileSync('mkfifo', [fifo]);
  await expect(readAtMost(fifo, 64, () => new Error('too large'))).rejects.toThrow(`${fifo} is no longer a regular file (it was replaced while being read)`);
});

it('reads a file whole into bytes that own their buffer, whatever its size or what its size says', async () => {
  const { readAtMost } = await import('../../host/src/util/files.ts');
  const dir = await mkdtemp(join(tmpdir(), 'portcullis-source-'));
  for (const size of [0, 10, 5_000, 3 * 2 ** 20 + 5]) {
    const content = new Uint8Array(size).map((_, i) => i % 251);
    const file = join(dir, `m-${size}.wasm`);
    await writeFile(file, content);
    const bytes = await readAtMost(file, 4 * 2 ** 20, () => new Error('too large'));
    expect(Buffer.compare(bytes, content)).toBe(0);
    // Never a view into a shared pool: callers hash, keep and hand these bytes to workers.
    expect([bytes.byteOffset, bytes.buffer.byteLength]).toEqual([0, size]);
  }
  // Its size says 0: read on to its end.
  const status = await readAtMost('/proc/self/cmdline', 2 ** 20, () => new Error('too large'));
  expect(Buffer.from(status).toString('utf8')).toContain(process.execPath);
});
