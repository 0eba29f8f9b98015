// A component whose transpile is costly (many exports make jco's bindgen quadratic: 20,000
// exports in 1.4 MB take ~40 s and ~600 MB) is transpiled in a child process: the host's
// event loop keeps turning meanwhile, and the child is stopped by its time and memory bounds.
import { mkdtemp, readFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parse } from '@bytecodealliance/jco';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { DEFAULT_LIMITS } from '../../host/src/config/limits.ts';
import { prepareSandbox } from '../../host/src/sandbox/prepare.ts';
import { transpileIsolated, TRANSPILE_BOUNDS } from '../../host/src/sandbox/transpile.ts';
import { wasm } from '../helpers/policies.ts';

/** A component exporting `count` functions that do nothing. */
async function manyExports(count: number): Promise<Uint8Array> {
  const core = `(core module $m ${Array.from({ length: count }, (_, i) => `(func (export "f${i}"))`).join(' ')})`;
  const lifts = Array.from({ length: count }, (_, i) => `(func $f${i} (canon lift (core func $i "f${i}"))) (export "f${i}" (func $f${i}))`).join(' ');
  return parse(`(component ${core} (core instance $i (instantiate $m)) ${lifts})`);
}

/** `count` exported functions taking a list of `width`-u32 tuples: ~5 KB of glue per function per 1,000 of width. */
async function wideTypes(count: number, width: number): Promise<Uint8Array> {
  const core = '(core module $m (memory (export "mem") 1) (func (export "realloc") (param i32 i32 i32 i32) (result i32) i32.const 8) (func (export "f") (param i32 i32)))';
  const lifts = Array.from({ length: count }, (_, i) => `(func $f${i} (type $ft) (canon lift (core func $cf) (memory $mem) (realloc (core func $re)))) (export "f${i}" (func $f${i}))`);
  return parse(`(component ${core} (core instance $i (instantiate $m))
    (alias core export $i "f" (core func $cf)) (alias core export $i "mem" (core memory $mem)) (alias core export $i "realloc" (core func $re))
    (type $t (tuple ${Array(width).fill('u32').join(' ')})) (type $l (list $t)) (type $ft (func (param "x" $l)))
    ${lifts.join(' ')})`);
}

/** Runs `work` and reports the longest the event loop went without a turn meanwhile (ms). */
async function longestStall<T>(work: () => Promise<T>): Promise<{ result: T; stallMs: number }> {
  let last = performance.now();
  let stallMs = 0;
  const ticker = setInterval(() => {
    const now = performance.now();
    stallMs = Math.max(stallMs, now - last);
    last = now;
  }, 10);
  try {
    const result = await work();
    return { result, stallMs: Math.max(stallMs, performance.now() - last) };
  } finally {
    clearInterval(ticker);
  }
}

beforeAll(async () => {
  process.env.PORTCULLIS_CACHE = await mkdtemp(join(tmpdir(), 'portcullis-cache-'));
});
afterAll(() => {
  delete process.env.PORTCULLIS_CACHE;
});

it('transpiles a costly component without stalling the host', async () => {
  // ~3 s of transpiling in the host's thread before this change; its ~9 MB of glue is refused.
  const bytes = await manyExports(5000);
  const { result, stallMs } = await longestStall(() => prepareSandbox('many-exports', bytes, DEFAULT_LIMITS, false).then(() => 'loaded', (error: Error) => error.message));
  expect(result).toMatch(/JavaScript may be at most 8 MiB/);
  expect(stallMs).toBeLessThan(500);
}, 120_000);

it('stops a transpile that outlives its time bound, and says so', async () => {
  const bytes = await manyExports(20000);
  const { result, stallMs } = await longestStall(() => transpileIsolated(bytes, { ...TRANSPILE_BOUNDS, timeoutMs: 2000 }));
  expect(result).toEqual({ ok: false, reason: 'transpiling it took longer than 2s', lasting: true });
  expect(stallMs).toBeLessThan(500);
}, 60_000);

it('stops a transpile that outgrows its memory bound, and says so', async () => {
  const bytes = new Uint8Array(await readFile(wasm('require-labels')));
  const result = await transpileIsolated(bytes, { ...TRANSPILE_BOUNDS, heapMiB: 8 });
  expect(result.ok).toBe(false);
  expect(!result.ok && result.reason).toMatch(/^transpiling it ran out of the memory it may use \(8 MiB heap/);
});

it('refuses a component whose glue would be enormous, and remembers the refusal', async () => {
  // 12 KB of component, ~55 MB of JavaScript.
  const bytes = await wideTypes(58, 10_000);
  expect(bytes.length).toBeLessThan(16_000);
  await expect(prepareSandbox('wide', bytes, DEFAULT_LIMITS, false)).rejects.toThrow(/^transpiling it produced more than \d+ MiB \(its JavaScript may be at most 8 MiB\)$/);
  // The same bytes again (a reload): refused at once, without holding the transpiler.
  const again = performance.now();
  await expect(prepareSandbox('wide-again', bytes, DEFAULT_LIMITS, false)).rejects.toThrow(/^transpiling it produced more than/);
  expect(performance.now() - again).toBeLessThan(200);
}, 60_000);

it('refuses a component that is not well formed, with a reason', async () => {
  const bytes = new Uint8Array(await readFile(wasm('require-labels')));
  bytes.fill(0x41, 100, 2000);
  await expect(prepareSandbox('broken', bytes, DEFAULT_LIMITS, false)).rejects.toThrow(/^not a well-formed component: the nested component at byte \d+ is too short$/);
  // Sections intact, contents not: jco's own reason.
  const inside = new Uint8Array(await readFile(wasm('require-labels')));
  inside.fill(0x41, 30, 40);
  await expect(prepareSandbox('broken-inside', inside, DEFAULT_LIMITS, false)).rejects.toThrow(/^not a (usable|well-formed) component: /);
});

it('still transpiles real policies within the default bounds', async () => {
  const result = await transpileIsolated(new Uint8Array(await readFile(wasm('require-labels'))));
  expect(result.ok && Object.keys(result.files).some((name) => name.endsWith('.js'))).toBe(true);
});
