// Overload with a costly policy in the review, over real HTTPS: a costly policy's calls are judged
// by its own backlog, and a refusal that denies the review (failurePolicy Fail) refuses the rest
// of it, so no quick call runs for a review already denied.
import { afterAll, beforeAll, expect, it } from 'vitest';
import { admissionReview, startServer, type TestServer } from '../helpers/server.ts';
import { wasm } from '../helpers/policies.ts';

let t: TestServer;
beforeAll(async () => {
  // The same module twice: `quick` allows at once with a warning; `costly` first spins about
  // 35 ms (over 10 ms a call makes a policy costly; under a tenth of its 2 s deadline, or it
  // would be slow, and a slow policy's calls wait for each other instead). Both Fail, on /mutate.
  t = await startServer(`
server: { tls: { mode: self-signed, hostnames: [127.0.0.1] } }
policies:
  - name: quick
    module: ${wasm('spin')}
    modes: [mutate]
    settings: { iterations: 0 }
    match: [{ kind: ConfigMap }]
  - name: costly
    module: ${wasm('spin')}
    modes: [mutate]
    settings: { iterations: 400000 }
    match: [{ kind: ConfigMap }]
`);
}, 60_000);
afterAll(() => t.close());

const review = () => admissionReview({ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'cm' }, data: {} });

it('refuses a review whole once its costly policy is refused with failurePolicy Fail: the quick policy does not run for nothing', async () => {
  // Both answer once, so neither is new (untrusted) any more and the pool knows their costs.
  expect((await t.post('/mutate', review())).body.response).toMatchObject({ allowed: true });
  let answers: { allowed: boolean; message?: string; warnings?: string[] }[] = [];
  // Callers sending again as soon as answered, until the costly policy's backlog passes its share
  // (a quarter of its 2 s deadline per worker): 40 callers do once its calls take 25 ms, but in a
  // fast phase of the machine the spin took less and nothing was refused; more callers then.
  for (const callers of [40, 100, 250]) {
    answers = [];
    const until = performance.now() + 3000;
    await Promise.all(Array.from({ length: callers }, async () => {
      while (performance.now() < until) {
        const { response } = (await t.post('/mutate', review())).body as { response: { allowed: boolean; status?: { message: string }; warnings?: string[] } };
        answers.push({ allowed: response.allowed, message: response.status?.message, warnings: response.warnings });
      }
    }));
    if (answers.some((a) => !a.allowed && /the sandboxes are overloaded/.test(a.message ?? ''))) break;
  }
  const refused = answers.filter((a) => !a.allowed && /the sandboxes are overloaded/.test(a.message ?? ''));
  const ran = answers.filter((a) => a.allowed);
  // Should it fail: what the answers said (a machine so loaded that the costly policy turns slow,
  // over a tenth of its deadline a call, has its calls wait for each other instead).
  const seen = `${answers.length} answers: ${[...new Set(answers.map((a) => a.message ?? 'allowed'))].slice(0, 3).join(' | ')}`;
  expect(refused.length, seen).toBeGreaterThan(0);
  expect(ran.length, seen).toBeGreaterThan(0);
  // A review allowed ran both; one refused ran neither (before: the quick one could run, its
  // warning kept, for a review the costly one's refusal denied).
  expect(ran.every((a) => a.warnings?.includes('policy "quick": spun 0'))).toBe(true);
  expect(refused.filter((a) => a.warnings?.includes('policy "quick": spun 0'))).toEqual([]);
}, 60_000);
