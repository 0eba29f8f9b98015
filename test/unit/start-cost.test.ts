// What `serve` loads before it listens is paid on every start (bench: cold start ≤ 1.5 s).
import { execFileSync } from 'node:child_process';
import { expect, it } from 'vitest';

it('loads neither an HTTP client, nor the certificate maker, nor a schema compiler with the host\'s code', () => {
  // node:http is taken as CommonJS: its ES namespace would load Node's bundled undici (~55 ms).
  // selfsigned and @peculiar/x509 (~190 ms) load when a certificate is made, while the workers boot;
  // Ajv (~40 ms) when a policy brings a settings schema.
  const script = "import { createRequire } from 'node:module';" +
    "await import('./host/src/cli/serve.ts'); await import('./host/src/server/metrics-listener.ts');" +
    'const loaded = [...process.moduleLoadList, ...Object.keys(createRequire(import.meta.url).cache)];' +
    'console.log(JSON.stringify(loaded.filter((m) => /deps\\/undici|selfsigned|peculiar|ajv\\/dist\\/ajv\\.js/.test(m))));';
  const loaded = execFileSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8' });
  expect(JSON.parse(loaded)).toEqual([]);
}, 30_000);
