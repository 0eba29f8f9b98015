// Two mutating policies whose patches are large (3,000 label adds each) through a real server:
// their patches are combined on the merger's thread and the response carries the merged patch.
import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { applyPatch } from 'fast-json-patch';
import { admissionReview, decodePatch, startServer, type TestServer } from '../helpers/server.ts';
import { threadsAtNice } from '../helpers/threads.ts';
import { answering } from '../helpers/wasm.ts';

const adds = (prefix: string, n: number) => Array.from({ length: n }, (_, i) => ({ op: 'add', path: `/metadata/labels/${prefix}${i}`, value: prefix }));

/** Threads of this process (the server runs in it) at nice 10. */
const niceThreads = () => threadsAtNice(10);

let t: TestServer;
beforeAll(async () => {
  const dir = await mkdtemp(join(tmpdir(), 'portcullis-offload-'));
  const policies = { 'wave-a': adds('a', 3000), 'wave-b': adds('b', 3000), clash: [{ op: 'add', path: '/metadata/labels/a7', value: 'clash' }] };
  const entries = await Promise.all(Object.entries(policies).map(async ([name, patch]) => {
    await writeFile(join(dir, `${name}.wasm`), await answering({ outcome: 'allow', patch }));
    const ignore = name === 'clash' ? ', failurePolicy: Ignore' : '';
    return `  - { name: ${name}, module: ${join(dir, `${name}.wasm`)}${ignore}, rules: [{ operations: [CREATE], apiGroups: ["*"], apiVersions: ["*"], resources: ["*"] }] }\n`;
  }));
  t = await startServer(`server: { tls: { mode: self-signed, hostnames: [127.0.0.1] } }\npolicies:\n${entries.join('')}`);
}, 60_000);
afterAll(() => t.close());

it('two large patches are merged into one off the main thread; a third that conflicts fails alone (Ignore: a warning)', async () => {
  const object = { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'cm', labels: { keep: 'yes' } }, data: { a: '1' } };
  const before = niceThreads();
  const res = await t.post('/mutate?timeout=10s', admissionReview(object));
  expect(res.status).toBe(200);
  // The merger's thread started for this review (lazily, at nice 10 like the sandbox workers).
  expect(niceThreads().filter((tid) => !before.includes(tid))).toHaveLength(1);
  expect(res.body.response.allowed).toBe(true);
  expect(res.body.response.warnings).toEqual([expect.stringMatching(/^policy "clash": failed and was ignored \(failurePolicy Ignore\): its patch conflicts with policy "wave-a" at \/metadata\/labels\/a7$/)]);
  const labels = applyPatch(structuredClone(object), decodePatch(res.body.response) as never).newDocument.metadata.labels as Record<string, string>;
  expect(Object.keys(labels)).toHaveLength(6001);
  expect(labels).toMatchObject({ keep: 'yes', a0: 'a', a7: 'a', a2999: 'a', b0: 'b', b2999: 'b' });
  expect((await t.get('/healthz')).status).toBe(200);
});

it('an object nested 5,000 levels deep (the apiserver allows 10,000) is merged on the thread too, from the review\'s own bytes', async () => {
  const depth = 5000;
  const review = admissionReview({ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'deep', labels: {} }, data: 'DEEP' });
  // Written as text: JSON.stringify (and structuredClone) recurse, and give up near 4,000 levels.
  const body = JSON.stringify(review).replace('"data":"DEEP"', `"data":${'{"d":'.repeat(depth)}1${'}'.repeat(depth)}`);
  const res = await t.post('/mutate', body);
  expect(res.status).toBe(200);
  expect(res.body.response.status).toBeUndefined();
  expect(res.body.response.allowed).toBe(true);
  const operations = decodePatch(res.body.response) as { op: string; path: string; value: Record<string, string> }[];
  expect(operations).toEqual([{ op: 'replace', path: '/metadata/labels', value: expect.objectContaining({ a0: 'a', a2999: 'a', b0: 'b', b2999: 'b' }) }]);
  expect(Object.keys(operations[0]!.value)).toHaveLength(6000);
});
