import { expect, it } from 'vitest';
import { cli } from '../helpers/cli.ts';
import { startServer } from '../helpers/server.ts';

it('exits 1 with one clear line when the port is taken, instead of hanging', async () => {
  const taken = await startServer('policies: []');
  try {
    const { code, stderr } = await cli(['serve', '--host', '127.0.0.1', '--port', String(taken.server.address.port)]);
    expect(code).toBe(1);
    expect(stderr.trim().split('\n').at(-1)).toMatch(/^portcullis serve: cannot listen on 127\.0\.0\.1:\d+: listen EADDRINUSE/);
  } finally {
    await taken.close();
  }
});

it('refuses an invalid configuration file with the path of the bad field', async () => {
  const { writeFile, mkdtemp } = await import('node:fs/promises');
  const { join } = await import('node:path'); // eslint-disable-line @typescript-eslint/unbound-method -- path.join does not use this
  const { tmpdir } = await import('node:os');
  const dir = await mkdtemp(join(tmpdir(), 'portcullis-cfg-'));
  await writeFile(join(dir, 'bad.yaml'), 'policies:\n  - { name: x, module: x.wasm, enforcement: sometimes }\n');
  const { code, stderr } = await cli(['serve', '--config', join(dir, 'bad.yaml')]);
  expect(code).toBe(1);
  expect(stderr.trim()).toBe(`portcullis serve: ${join(dir, 'bad.yaml')}: /policies/0/enforcement must be one of "enforce", "warn", "audit"`);
});
