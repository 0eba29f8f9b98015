// The admission server over real HTTPS: every endpoint, both review versions, merging across
// policies, failure policies for unloadable policies, and the JSON errors.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { admissionReview, decodePatch, policyYaml, startServer, type TestServer } from '../helpers/server.ts';

let t: TestServer;
beforeAll(async () => {
  t = await startServer(`
server: { tls: { mode: self-signed, hostnames: [127.0.0.1] } }
policies:
${policyYaml('numbers', 'rules: [{ operations: [CREATE, UPDATE], apiGroups: [kopf.dev], apiVersions: ["*"], resources: [kopfexamples] }]')}
${policyYaml('require-labels', 'settings: { labels: { team: unowned } }\nrules: [{ operations: [CREATE], apiGroups: [""], apiVersions: [v1], resources: [configmaps, pods] }]')}
${policyYaml('added-by', 'settings: { value: tests }\nmatch: [{ kind: ConfigMap, name: "annotate-*" }]')}
${policyYaml('show-auth', 'enforcement: warn\nmatch: [{ kind: ConfigMap, labelSelector: { matchLabels: { show-auth: "yes" } } }]')}
  - name: broken-fail
    module: /nonexistent/broken.wasm
    modes: [validate]
    match: [{ kind: ConfigMap, name: "broken-*" }]
  - name: broken-ignore
    module: /nonexistent/broken.wasm
    modes: [validate]
    failurePolicy: Ignore
    match: [{ kind: ConfigMap, name: "ignored-*" }]
`);
});
afterAll(() => t.close());

const configMap = (name: string, labels: Record<string, string> = {}) => ({ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name, labels }, data: { a: 'b' } });

describe('health, readiness, metrics', () => {
  it('is healthy and ready, and lists failed policies', async () => {
    expect(await t.get('/healthz')).toEqual({ status: 200, text: '{"status":"ok"}' });
    const ready = await t.get('/readyz');
    expect(ready.status).toBe(200);
    expect(JSON.parse(ready.text).failed.map((f: { policy: string }) => f.policy)).toEqual(['broken-fail', 'broken-ignore']);
  });

  it('exposes Prometheus metrics', async () => {
    await t.post('/validate', admissionReview(configMap('metrics-probe', { team: 'a' })));
    const { status, text } = await t.get('/metrics');
    expect(status).toBe(200);
    expect(text).toContain('portcullis_reviews_total{endpoint="/validate",decision="allowed"}');
    expect(text).toMatch(/portcullis_evaluations_total\{policy="require-labels",outcome="allowed"\} \d+/);
    expect(text).toContain('portcullis_sandbox_workers');
    expect(text).toContain('portcullis_policies{state="failed"} 2');
  });
});

describe('/validate and /mutate: every matching policy, merged', () => {
  it('denies with the policy named, keeping the warnings of others', async () => {
    const { status, body } = await t.post('/validate', admissionReview(configMap('x', { 'show-auth': 'yes' })), { authorization: 'Bearer secret-token' });
    expect(status).toBe(200);
    expect(body.response).toMatchObject({ allowed: false, status: { code: 403, message: 'policy "require-labels": missing required label: team' } });
    expect(body.response.warnings).toEqual([
      'policy "show-auth": TLS peer: none (no verified client certificate)',
      'policy "show-auth": Authorization header: present',
    ]);
  });

  it('merges patches of several mutating policies', async () => {
    const { body } = await t.post('/mutate', admissionReview(configMap('annotate-me')));
    expect(body.response).toMatchObject({ allowed: true, patchType: 'JSONPatch' });
    expect(decodePatch(body.response)).toEqual([
      { op: 'add', path: '/metadata/labels/team', value: 'unowned' },
      { op: 'add', path: '/metadata/annotations', value: { 'portcullis.dev/added-by': 'tests' } },
    ]);
  });

  it('allows what no policy selects, without a patch', async () => {
    const { body } = await t.post('/mutate', admissionReview(configMap('cm'), { operation: 'UPDATE' }));
    expect(body.response).toEqual({ uid: expect.any(String), allowed: true });
  });

  it('fails closed for a policy that could not load (failurePolicy Fail), and warns for Ignore', async () => {
    const fail = await t.post('/validate', admissionReview(configMap('broken-one', { team: 'a' })));
    expect(fail.body.response.allowed).toBe(false);
    expect(fail.body.response.status.message).toMatch(/^policy "broken-fail": could not be loaded: .*broken\.wasm does not exist$/);
    const ignore = await t.post('/validate', admissionReview(configMap('ignored-one', { team: 'a' })));
    expect(ignore.body.response.allowed).toBe(true);
    expect(ignore.body.response.warnings[0]).toMatch(/^policy "broken-ignore": failed and was ignored \(failurePolicy Ignore\): could not be loaded/);
  });

  it('answers v1beta1 reviews in v1beta1', async () => {
    const { body } = await t.post('/validate', admissionReview(configMap('b', { team: 'x' }), {}, 'admission.k8s.io/v1beta1'));
    expect(body).toMatchObject({ apiVersion: 'admission.k8s.io/v1beta1', kind: 'AdmissionReview', response: { allowed: true } });
  });
});

describe('per-policy endpoints', () => {
  it('evaluates just that policy', async () => {
    const review = admissionReview({ apiVersion: 'kopf.dev/v1', kind: 'KopfExample', metadata: { name: 'k' }, spec: { numbers: [1, 500] } });
    const { body } = await t.post('/validate/numbers', review);
    expect(body.response).toMatchObject({ uid: review.request.uid, allowed: false, status: { code: 499, message: 'policy "numbers": Numbers must be within 0..100.' } });
    const mutated = await t.post('/mutate/numbers', admissionReview({ apiVersion: 'kopf.dev/v1', kind: 'KopfExample', metadata: { name: 'k' }, spec: {} }));
    expect(decodePatch(mutated.body.response)).toEqual([{ op: 'add', path: '/spec/numbers', value: [1, 2, 3] }]);
  });

  it('404s an unknown policy or a mode the policy lacks, 405s a wrong method, 404s other paths', async () => {
    expect(await t.post('/validate/nope', admissionReview(null))).toEqual({ status: 404, body: { error: { code: 'UNKNOWN_POLICY', message: 'no policy named "nope" is configured' } } });
    expect((await t.post('/mutate/show-auth', admissionReview(null))).body.error.message).toBe('policy "show-auth" does not mutate (it serves: validate)');
    const get = await t.get('/validate/numbers');
    expect(get.status).toBe(405);
    expect(JSON.parse(get.text).error.code).toBe('METHOD_NOT_ALLOWED');
    expect((await t.get('/nowhere')).status).toBe(404);
    expect((await t.post('/healthz', {})).status).toBe(405);
  });
});

describe('logs', () => {
  it('log one line per review with uid and decision, and never an Authorization value', async () => {
    const review = admissionReview(configMap('logged'));
    await t.post('/validate', review, { authorization: 'Bearer do-not-log-me' });
    const lines = t.logs.map((l) => JSON.parse(l));
    expect(lines.find((l) => l.uid === review.request.uid && l.msg === 'denied')).toMatchObject({ level: 'info', decision: 'denied', policy: 'require-labels', endpoint: '/validate' });
    expect(t.logs.join('\n')).not.toContain('do-not-log-me');
  });
});
