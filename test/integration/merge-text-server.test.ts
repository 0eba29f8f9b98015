// A long answer's large patch travels from the worker as text and is combined on the merger's
// thread, through a real server: red team 11's one `add` of a wide map cost the main thread
// 4-8 ms a review to parse, combine and write out when it was combined in place.
import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { PATCH_TEXT_FROM } from '../../host/src/sandbox/outcome.ts';
import { admissionReview, decodePatch, startServer, type TestServer } from '../helpers/server.ts';
import { threadsAtNice } from '../helpers/threads.ts';
import { answering } from '../helpers/wasm.ts';

const map = (n: number) => Object.fromEntries(Array.from({ length: n }, (_, i) => [`k${i}`, 'v']));

let t: TestServer;
beforeAll(async () => {
  const dir = await mkdtemp(join(tmpdir(), 'portcullis-patch-text-'));
  // One operation each: the count the merger's thresholds go by is 1. `narrow` is long enough to be read in the worker, and light.
  const policies = { wide: map(4000), narrow: { pad: 'p'.repeat(10_000), ...map(PATCH_TEXT_FROM - 10) } };
  const entries = await Promise.all(Object.entries(policies).map(async ([name, value]) => {
    await writeFile(join(dir, `${name}.wasm`), await answering({ outcome: 'allow', patch: [{ op: 'add', path: '/metadata/annotations', value }] }));
    return `  - { name: ${name}, module: ${join(dir, `${name}.wasm`)}, rules: [{ operations: [CREATE], apiGroups: [""], apiVersions: ["*"], resources: ["${name === 'wide' ? 'pods' : 'configmaps'}"] }] }\n`;
  }));
  // Five copies: cheap to answer, and more than are combined in place (merge/offload.ts).
  const copies = Array.from({ length: 5 }, (_, i) => ({ op: 'copy', from: '/spec/a', path: `/spec/c${i}` }));
  await writeFile(join(dir, 'copier.wasm'), await answering({ outcome: 'allow', patch: copies }));
  entries.push(`  - { name: copier, module: ${join(dir, 'copier.wasm')}, rules: [{ operations: [CREATE], apiGroups: [kopf.dev], apiVersions: ["*"], resources: [kopfexamples] }] }\n`);
  t = await startServer(`server: { tls: { mode: self-signed, hostnames: [127.0.0.1] } }\npolicies:\n${entries.join('')}`);
}, 60_000);
afterAll(() => t.close());

const annotations = async (kind: 'Pod' | 'ConfigMap') => {
  const res = await t.post('/mutate', admissionReview({ apiVersion: 'v1', kind, metadata: { name: 'x' } }));
  expect(res.status).toBe(200);
  expect(res.body.response).toMatchObject({ allowed: true, patchType: 'JSONPatch' });
  const operations = decodePatch(res.body.response) as { op: string; path: string; value: Record<string, string> }[];
  expect(operations).toHaveLength(1);
  expect(operations[0]).toMatchObject({ op: 'add', path: '/metadata/annotations' });
  return operations[0]!.value;
};

it('a patch below PATCH_TEXT_FROM members is combined in place; one above, on the merger\'s thread, with the same answer', async () => {
  const before = threadsAtNice(10);
  expect(Object.keys(await annotations('ConfigMap'))).toHaveLength(PATCH_TEXT_FROM - 9);
  expect(threadsAtNice(10).filter((tid) => !before.includes(tid))).toHaveLength(0);
  const value = await annotations('Pod');
  expect(value).toEqual(map(4000));
  // The merger's thread started for it (lazily, at nice 10 like the sandbox workers).
  expect(threadsAtNice(10).filter((tid) => !before.includes(tid))).toHaveLength(1);
  expect((await t.get('/healthz')).status).toBe(200);
});

it('a burst of 128 reviews whose patches go to the merger is merged, none refused on its queue (review: 42 of 128 were, at 16 reviews waiting)', async () => {
  const object = { apiVersion: 'kopf.dev/v1', kind: 'KopfExample', metadata: { name: 'x' }, spec: { a: 1 } };
  const sent = Array.from({ length: 128 }, () => t.post('/mutate', admissionReview(object)));
  const answers = await Promise.all(sent);
  expect(answers.map((a) => a.status)).toEqual(Array(128).fill(200));
  expect(answers.filter((a) => a.body.response.allowed !== true).map((a) => a.body.response.status?.message)).toEqual([]);
  // One policy's patch is only checked: it goes back as the policy wrote it.
  expect(decodePatch(answers[0]!.body.response)).toEqual(Array.from({ length: 5 }, (_, i) => ({ op: 'copy', from: '/spec/a', path: `/spec/c${i}` })));
}, 60_000);
