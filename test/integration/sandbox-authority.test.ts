// No ambient authority: a policy gets no files, network, environment, clock or entropy, and a
// module that asks for them is refused before it runs.
import { readFile } from 'node:fs/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { evaluatePolicy } from '../../host/src/evaluate/evaluate.ts';
import { loadPolicy } from '../../host/src/policy/load.ts';
import { SandboxPool } from '../../host/src/sandbox/pool.ts';
import { input, load, options, wasm } from '../helpers/policies.ts';

let pool: SandboxPool;
beforeAll(() => { pool = new SandboxPool(2); });
afterAll(() => pool.close());

async function probe(name: string) {
  const policy = await load(pool, `hostile-${name}`, { file: 'hostile', settings: { probe: name } });
  return evaluatePolicy(pool, policy, 'validate', input());
}

describe('a hostile TypeScript policy', () => {
  it.each(['fetch', 'process', 'require', 'std', 'os', 'crypto'])('finds no %s', async (name) => {
    const outcome = await probe(name);
    expect(outcome.status).toBe('allowed');
    expect(outcome.warnings[0]).toMatch(new RegExp(`^${name}: threw TypeError`));
  });

  it.each([
    ['clock', 'Date.now()'], ['date', 'new Date() without arguments'], ['performance', 'performance.now()'],
  ])('cannot read the clock (%s throws, saying why)', async (name, what) => {
    const outcome = await probe(name);
    expect(outcome.warnings).toEqual([`${name}: threw Error: ${what} is not available in a policy: the sandbox has no clock ` +
      '(a decision must not depend on the time; pass a time in settings if you need one)']);
  });

  it('gets no entropy: Math.random is the same sequence in every fresh instance', async () => {
    const first = await probe('random');
    const again = await loadPolicy(pool, options('hostile-random-fresh', { file: 'hostile', settings: { probe: 'random' }, isolation: 'fresh' }));
    const second = await evaluatePolicy(pool, again, 'validate', input());
    expect(first.warnings[0]).toMatch(/^random: returned 0\.\d+$/);
    expect(second.warnings).toEqual(first.warnings);
  });
});

describe('modules asking for more than the host grants are refused at load', () => {
  it('a component importing WASI interfaces', async () => {
    await expect(load(pool, 'wasi-component')).rejects.toThrow(
      /policy "wasi-component" could not be loaded: it imports .*wasi:.*, which Portcullis does not grant to policies/,
    );
  });

  it('a core module importing WASI functions', async () => {
    const bytes = coreModuleImporting('wasi_snapshot_preview1', 'path_open');
    await expect(loadPolicy(pool, options('wasi-core'), bytes)).rejects.toThrow(
      'policy "wasi-core" could not be loaded: it imports wasi_snapshot_preview1.path_open, which Portcullis does not grant to policies',
    );
  });

  it('a core module importing the Extism HTTP function', async () => {
    await expect(loadPolicy(pool, options('http-core'), coreModuleImporting('extism:host/env', 'http_request'))).rejects.toThrow(
      'it imports extism:host/env.http_request, which Portcullis does not grant',
    );
  });

  it('bytes that are not WebAssembly, a truncated module, and a missing file', async () => {
    await expect(loadPolicy(pool, options('text'), new TextEncoder().encode('#!/bin/sh\nrm -rf /'))).rejects.toThrow(
      'policy "text" could not be loaded: the file is not a WebAssembly module or component (bad header)',
    );
    const real = new Uint8Array(await readFile(wasm('no-delete')));
    await expect(loadPolicy(pool, options('truncated'), real.subarray(0, real.length / 2))).rejects.toThrow(/policy "truncated" could not be loaded: /);
    await expect(load(pool, 'missing', { module: '/nonexistent/policy.wasm' })).rejects.toThrow(
      'policy "missing" could not be loaded: /nonexistent/policy.wasm does not exist',
    );
  });
});

/** A minimal core module: one function import, and exports `validate` and `memory`. */
function coreModuleImporting(module: string, name: string): Uint8Array {
  const str = (s: string) => [s.length, ...new TextEncoder().encode(s)];
  const section = (id: number, body: number[]) => [id, body.length, ...body];
  return new Uint8Array([
    0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00,
    ...section(1, [1, 0x60, 0, 1, 0x7f]), // type 0: () -> i32
    ...section(2, [1, ...str(module), ...str(name), 0x00, 0]), // import func of type 0
    ...section(3, [1, 0]), // one function of type 0
    ...section(5, [1, 0x00, 1]), // memory, min 1 page
    ...section(7, [2, ...str('validate'), 0x00, 1, ...str('memory'), 0x02, 0]),
    ...section(10, [1, 4, 0, 0x41, 0, 0x0b]), // body: i32.const 0
  ]);
}
