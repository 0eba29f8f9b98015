import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/unit/**/*.test.ts', 'test/integration/**/*.test.ts', 'policies/*/*.test.ts', 'sdk/**/*.test.ts'],
    testTimeout: 30_000,
    hookTimeout: 60_000,
    // Worker-thread sandboxes and real servers: files run in parallel, one fork each.
    pool: 'forks',
    globalSetup: ['test/helpers/scratch-tmpdir.ts'],
  },
});
