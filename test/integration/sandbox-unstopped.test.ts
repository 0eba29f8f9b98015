// A guest that V8 cannot interrupt outlives its worker's termination. The host cannot end that
// thread; it answers the call at its deadline, lets the thread no longer hold the process, and
// fails /healthz so that the kubelet restarts it (SandboxPool #stop, PortcullisServer #liveness).
import v8 from 'node:v8';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { WASM_TIERING_FLAG } from '../../host/src/sandbox/interrupts.ts';
import { admissionReview, startServer, type TestServer } from '../helpers/server.ts';
import { fillForever, module } from '../helpers/wasm.ts';

let t: TestServer;

beforeAll(async () => {
  // V8's default back for this process (a file of its own): with dynamic tiering a loop of
  // 16 MiB memory.fill calls looks for interrupts only every few minutes. The host turns it
  // off (interrupts.ts); a guest that still found a way would look like this one.
  expect(WASM_TIERING_FLAG).toBe('--no-wasm-dynamic-tiering');
  v8.setFlagsFromString('--wasm-dynamic-tiering');
  t = await startServer('policies: []\n');
  const file = join(t.dir, 'fill.wasm');
  await writeFile(file, module({
    memories: [{ min: 256 }], functions: [fillForever(16 * 2 ** 20)],
    exports: [{ name: 'memory', kind: 'memory', index: 0 }, { name: 'validate', kind: 'func', index: 0 }],
  }));
  await writeFile(t.configPath, `cache: { maxMiB: 0 }\npolicies:\n  - name: fill\n    module: ${file}\n    limits: { timeoutMs: 1000 }\n`);
  await t.server.reload();
}, 60_000);
afterAll(() => t?.close());

it('answers the call at its deadline, then fails /healthz while the worker thread runs on', async () => {
  expect((await t.get('/healthz')).status).toBe(200);
  const { body } = await t.post('/validate', admissionReview({ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'c' } }));
  expect(body.response).toMatchObject({ allowed: false, status: { message: expect.stringMatching(/policy "fill".*exceeded its 1s CPU deadline/) } });
  // Counted 10 s after the termination (UNSTOPPED_MS).
  let health = await t.get('/healthz');
  for (const started = performance.now(); health.status === 200 && performance.now() - started < 30_000;) {
    await new Promise((resolve) => setTimeout(resolve, 500));
    health = await t.get('/healthz');
  }
  expect(health.status).toBe(503);
  expect(JSON.parse(health.text)).toEqual({
    status: 'unhealthy',
    message: '1 sandbox worker thread kept running after being stopped at a policy\'s deadline (a guest V8 could not interrupt), each using a CPU core; restart the host to end them',
  });
  expect(t.server.pool.stats.unstopped).toBe(1);
  // Reviews are still answered: the pool replaced the worker.
  const again = await t.post('/validate', admissionReview({ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'd' } }));
  expect(again.status).toBe(200);
}, 60_000);
