// Answers a policy may give that the host must not trust (red team, 2026-11-23): each of them
// once broke the main thread for every policy. Hand-made core modules that answer fixed JSON,
// served by a real server; each answer fails only the policy that gave it, and the server
// answers every later review as before.
import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { MAX_MESSAGE_LENGTH } from '../../host/src/sandbox/outcome.ts';
import { admissionReview, decodePatch, startServer, type TestServer } from '../helpers/server.ts';
import { answering } from '../helpers/wasm.ts';

const ANSWERS = {
  labeler: { outcome: 'allow', patch: [{ op: 'add', path: '/metadata/labels', value: { team: 'x' } }] },
  proto: { outcome: 'allow', patch: [{ op: 'add', path: '/__proto__', value: { policy: 'proto' } }] },
  'copy-bomb': { outcome: 'allow', patch: Array.from({ length: 30 }, (_, i) => ({ op: 'copy', from: '/data', path: `/data/a${i}` })) },
  'long-denial': { outcome: 'deny', message: 'x'.repeat(100_000) },
  denier: { outcome: 'deny', code: 403, message: 'denied by denier' },
  // 16,000 label adds, about 0.8 MB: within the default output cap (red team, 2026-11-27: 17,500).
  'label-flood': { outcome: 'allow', patch: Array.from({ length: 16_000 }, (_, i) => ({ op: 'add', path: `/metadata/labels/k${i}`, value: 'v' })) },
};

// Answers nested 100,000 levels (200 KB) where the host names what it refuses: JSON.parse reads
// them, JSON.stringify overflowed the stack on them (red team, 2026-11-27: every review 500).
const deep = `${'['.repeat(100_000)}${']'.repeat(100_000)}`;
const RAW_ANSWERS = {
  'deep-outcome': `{"outcome":${deep}}`,
  'deep-code': `{"outcome":"deny","code":${deep}}`,
  'deep-op': `{"outcome":"allow","patch":[{"op":${deep},"path":"/x"}]}`,
  // Accepted, but only with the members RFC 6902 names: the rest never reaches the response.
  'deep-extra': `{"outcome":"allow","patch":[{"op":"add","path":"/metadata/labels","value":{"team":"x"},"junk":${deep}}]}`,
};

let t: TestServer;
beforeAll(async () => {
  const dir = await mkdtemp(join(tmpdir(), 'portcullis-answers-'));
  const modules = [
    ...Object.entries(ANSWERS).map(([name, output]) => [name, answering(output)] as const),
    ...Object.entries(RAW_ANSWERS).map(([name, text]) => [name, answering(text, { raw: true })] as const),
  ];
  const entries = await Promise.all(modules.map(async ([name, module]) => {
    await writeFile(join(dir, `${name}.wasm`), await module);
    return `  - { name: ${name}, module: ${join(dir, `${name}.wasm`)}, rules: [{ operations: [CREATE], apiGroups: ["*"], apiVersions: ["*"], resources: ["*"] }] }\n`;
  }));
  t = await startServer(`server: { tls: { mode: self-signed, hostnames: [127.0.0.1] } }\npolicies:\n${entries.join('')}`);
}, 60_000);
afterAll(() => t.close());

const configMap = () => admissionReview({ kind: 'ConfigMap', metadata: { name: 'cm' }, data: { a: 'x'.repeat(2000) } });

it('a __proto__ patch next to another patching policy fails that policy only; later reviews answer as before', async () => {
  const alone = await t.post('/mutate/proto', configMap());
  expect(alone.status).toBe(200);
  expect(alone.body.response.status.message).toBe('policy "proto": returned a patch path through "__proto__": /__proto__');
  // The whole webhook: every policy at once (the proto policy beside the labeler).
  const all = await t.post('/mutate', configMap());
  expect(all.status).toBe(200);
  expect(all.body.response.allowed).toBe(false);
  expect(({} as Record<string, unknown>).policy).toBeUndefined();
  // Later reviews: answered, not 500 (before the fix, prom-client's labels saw the polluted key).
  const labeled = await t.post('/mutate/labeler', configMap());
  expect(labeled.status).toBe(200);
  expect(decodePatch(labeled.body.response)).toEqual([{ op: 'add', path: '/metadata/labels', value: { team: 'x' } }]);
  expect((await t.post('/validate/denier', configMap())).body.response.status).toEqual({ code: 403, message: 'policy "denier": denied by denier' });
});

it('a patch from validate fails the policy: a validating answer carries no patch', async () => {
  const res = await t.post('/validate/labeler', configMap());
  expect(res.body.response).toMatchObject({ allowed: false, status: { code: 500, message: 'policy "labeler": returned a patch from validate; only mutate may change the object' } });
  expect(res.body.response.patch).toBeUndefined();
});

it('thirty copies of a parent into its child fail that policy at 1 MiB of copies; the host lives', async () => {
  const res = await t.post('/mutate/copy-bomb', configMap());
  expect(res.body.response.status.message).toBe('policy "copy-bomb": returned a patch that does not apply to the object: its copy and move operations clone more than 1 MiB in all');
  expect((await t.get('/healthz')).status).toBe(200);
});

it('a 100 KB denial message is cut to 4096 characters in the response', async () => {
  const res = await t.post('/validate/long-denial', configMap());
  const message = res.body.response.status.message as string;
  expect(message.startsWith(`policy "long-denial": ${'x'.repeat(MAX_MESSAGE_LENGTH)}… (`)).toBe(true);
  expect(message.length).toBeLessThan(MAX_MESSAGE_LENGTH + 100);
});

it('a patch of 16,000 operations fails that policy at once; the host answers on', async () => {
  // Red team: half a second of the main thread per review, and every other review waited.
  const res = await t.post('/mutate/label-flood', configMap());
  expect(res.body.response).toMatchObject({ allowed: false, status: { code: 500, message: 'policy "label-flood": returned a patch of 16,000 operations; a policy may return at most 10,000, as the apiserver accepts in one JSON patch' } });
  const labeled = await t.post('/mutate/labeler', configMap());
  expect(decodePatch(labeled.body.response)).toEqual([{ op: 'add', path: '/metadata/labels', value: { team: 'x' } }]);
});

it('an answer nested 100,000 levels deep fails that policy only, by its failurePolicy; the other policies still decide', async () => {
  for (const [name, what] of [['deep-outcome', 'an unknown outcome'], ['deep-code', 'a denial with an invalid HTTP code'], ['deep-op', 'an invalid patch operation']]) {
    const alone = await t.post(`/mutate/${name}`, configMap());
    expect(alone.status).toBe(200);
    expect(alone.body.response.status.message).toBe(`policy "${name}": returned ${what} (a value nested too deeply to show)`);
  }
  // A patch operation with a member RFC 6902 does not name: the operation is applied, the member dropped.
  const extra = await t.post('/mutate/deep-extra', configMap());
  expect(extra.status).toBe(200);
  expect(decodePatch(extra.body.response)).toEqual([{ op: 'add', path: '/metadata/labels', value: { team: 'x' } }]);
  // All policies at once: the review is answered (not 500), and an explicit denial (the first
  // configured denier's) comes before the deep answers' failures.
  const all = await t.post('/validate', configMap());
  expect(all.status).toBe(200);
  expect(all.body.response.status.code).toBe(403);
  expect(all.body.response.status.message).toMatch(/^policy "long-denial": x{4096}… \(/);
});
