import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/unit/**/*.test.ts', 'test/integration/**/*.test.ts', 'policies/*/*.test.ts', 'sdk/**/*.test.ts'],
    testTimeout: 30_000,
    hookTimeout: 60_000,
    // Worker-thread sandboxes and real servers: files run in parallel, one fork each.
    pool: 'forks',
    // The test files run sandboxes in-process, as the host does: see host/bin/portcullis.js. The
    // official CI run on 66ecf91 lost sandbox-faults.test.ts's fork to SIGTRAP.
    execArgv: ['--no-memory-protection-keys'],
    globalSetup: ['test/helpers/scratch-tmpdir.ts'],
  },
});
