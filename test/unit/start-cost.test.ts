// What `serve` loads before it listens is paid on every start (bench: cold start ≤ 1.5 s).
import { execFileSync } from 'node:child_process';
import { expect, it } from 'vitest';

it('loads no HTTP client to start serving: node:http is taken as CommonJS, whose ES namespace would load Node\'s bundled undici (~55 ms)', () => {
  const script = "await import('./host/src/cli/serve.ts'); await import('./host/src/server/metrics-listener.ts');" +
    "console.log(JSON.stringify(process.moduleLoadList.filter((m) => m.includes('deps/undici'))));";
  const loaded = execFileSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8' });
  expect(JSON.parse(loaded)).toEqual([]);
}, 30_000);
