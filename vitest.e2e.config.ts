import { defineConfig } from 'vitest/config';

// End-to-end: a real kube-apiserver (started once in global-setup.ts) calls real `portcullis
// serve` processes. One control plane and one set of cluster-wide webhook configurations, so
// files run one after another.
export default defineConfig({
  test: {
    include: ['test/e2e/**/*.test.ts'],
    globalSetup: ['test/e2e/global-setup.ts'],
    setupFiles: ['test/e2e/setup.ts'],
    fileParallelism: false,
    pool: 'forks',
    testTimeout: 120_000,
    hookTimeout: 180_000,
  },
});
