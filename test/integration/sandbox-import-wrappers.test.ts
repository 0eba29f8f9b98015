// The host makes no compiled wasm-to-JavaScript import wrapper (sandbox/import-wrappers.ts):
// V8's process-wide cache of them crashed the whole host when it freed one (`Check failed:
// jit_page.has_value()`, three CI runs). V8 prints every wrapper it compiles under
// --print-wasm-stub-code. `portcullis bench` calls an AssemblyScript policy (Extism, which binds
// the host functions it is given) 3,000 times in the real sandbox, past V8's tier-up budget of
// 1,000 calls per import; before the fix that compiled 7 wrappers.
import { expect, it } from 'vitest';
import { root, wasm } from '../helpers/policies.ts';
import { run } from '../helpers/process.ts';

const wrappers = (stdout: string) => (stdout.match(/^kind: wasm-to-js$/gm) ?? []).length;

it('a policy called thousands of times through the CLI makes V8 compile no wasm-to-JavaScript wrapper', async () => {
  const bench = await run(process.execPath, [
    '--print-wasm-stub-code', `${root}host/bin/portcullis.js`, 'bench', '--policy', wasm('no-delete'),
    '--request', `${root}test/fixtures/reviews/numbers-bad.json`, '--iterations', '3000', '--warmup', '1', '--json',
  ], { cwd: root });
  expect(bench.code, bench.stderr).toBe(0);
  // The policy really ran: the JSON summary is the last thing printed.
  expect(bench.stdout).toMatch(/"iterations": 3000/);
  expect(wrappers(bench.stdout)).toBe(0);
}, 120_000);

it('(control) the same Node prints a wrapper when one is compiled, for a bound import', async () => {
  // (module (import "env" "f" (func (result i32))))
  const control = 'new WebAssembly.Instance(new WebAssembly.Module(new Uint8Array([0, 97, 115, 109, 1, 0, 0, 0, 1, 5, 1, 96, 0, 1, 127, 2, 9, 1, 3, 101, 110, 118, 1, 102, 0, 0])), { env: { f: (() => 1).bind(null) } });';
  const node = await run(process.execPath, ['--print-wasm-stub-code', '-e', control]);
  expect(node.code, node.stderr).toBe(0);
  expect(wrappers(node.stdout)).toBe(1);
});
