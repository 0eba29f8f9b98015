// What an operator sees: the metrics port (plain HTTP), /readyz failing while a policy failed
// to load (server.readyWhenAllPoliciesLoaded), Prometheus default and Portcullis metrics, the
// start-up TLS and ready lines, and info lines for allowed and mutated reviews with the user.
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it, onTestFinished } from 'vitest';
import { embedPolicyInfo } from '../../host/src/policy/metadata.ts';
import { openClient, resolveOptions } from '../../host/src/oci/options.ts';
import { pushPolicy } from '../../host/src/oci/push.ts';
import { parseReference } from '../../host/src/oci/reference.ts';
import { startRegistry } from '../helpers/registry.ts';
import { admissionReview, POLICIES, policyYaml, startServer, type TestServer } from '../helpers/server.ts';

let current: TestServer | undefined;
/** A module file that is not a module: it exists, so the host starts, and its policy fails to load. */
async function junkModule(): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'portcullis-junk-'));
  onTestFinished(() => rm(dir, { recursive: true, force: true }));
  await writeFile(join(dir, 'broken.wasm'), 'hello');
  return join(dir, 'broken.wasm');
}

afterEach(async () => {
  await current?.close();
  current = undefined;
});

const review = (object: Record<string, unknown>, kind = 'ConfigMap') => ({
  apiVersion: 'admission.k8s.io/v1', kind: 'AdmissionReview',
  request: {
    uid: 'uid-obs-1', kind: { group: '', version: 'v1', kind }, resource: { group: '', version: 'v1', resource: 'configmaps' },
    operation: 'CREATE', namespace: 'team-a', name: 'x', userInfo: { username: 'alice@example.com' }, object,
  },
});
const rule = 'rules:\n  - { operations: [CREATE], apiGroups: [""], apiVersions: [v1], resources: [configmaps] }';

async function get(url: string): Promise<{ status: number; text: string }> {
  const res = await fetch(url);
  return { status: res.status, text: await res.text() };
}

describe('observability', () => {
  it('serves /metrics, /healthz and /readyz on the metrics port; readyz fails while a policy failed to load', async () => {
    const broken = await junkModule();
    current = await startServer(`server:
  metricsPort: 0
  readyWhenAllPoliciesLoaded: true
  tls: { mode: self-signed, hostnames: [127.0.0.1] }
policies:
${policyYaml('added-by', `settings: { value: t }\n${rule}`)}  - name: broken
    module: ${broken}
    ${rule.replace('\n', '\n    ')}
`);
    const base = current.server.metricsUrl!;
    expect(base).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    const ready = await get(`${base}/readyz`);
    expect(ready.status).toBe(503);
    expect(JSON.parse(ready.text)).toMatchObject({ status: 'not ready', failed: [{ policy: 'broken', code: 'POLICY_LOAD_FAILED', error: expect.stringMatching(/not a WebAssembly module or component/) }] });
    expect((await current.get('/readyz')).status).toBe(503);
    expect((await get(`${base}/healthz`)).status).toBe(200);
    expect((await get(`${base}/validate`)).status).toBe(404);
    const metrics = (await get(`${base}/metrics`)).text;
    expect(metrics).toMatch(/^portcullis_build_info\{version="0\.1\.0",revision="[^"]+",node="v24\.[^"]+"\} 1$/m);
    expect(metrics).toMatch(/^process_cpu_user_seconds_total \d/m);
    expect(metrics).toMatch(/^nodejs_heap_size_total_bytes \d/m);
    expect(metrics).toMatch(new RegExp(`^portcullis_policy_info\\{policy="added-by",digest="sha256:[0-9a-f]{64}",source="${POLICIES}/added-by/added-by.wasm",state="loaded",code=""\\} 1$`, 'm'));
    expect(metrics).toMatch(/^portcullis_policy_info\{policy="broken",digest="",source="[^"]*broken.wasm",state="failed",code="POLICY_LOAD_FAILED"\} 0$/m);
    expect(metrics).toMatch(/^portcullis_leader 0$/m);
    // No review has reached it yet; the policy that did not load has no standing.
    expect(metrics).toMatch(/^portcullis_policy_standing\{policy="added-by",standing="untried"\} 1$/m);
    expect(metrics).toMatch(/^portcullis_policy_standing\{policy="added-by",standing="normal"\} 0$/m);
    expect(metrics).not.toContain('portcullis_policy_standing{policy="broken"');
    // How long it took to instantiate (well under the slow-loader mark), and in how many workers.
    const loadSeconds = Number(/^portcullis_policy_load_seconds\{policy="added-by"\} (\S+)$/m.exec(metrics)?.[1]);
    expect(loadSeconds).toBeGreaterThan(0);
    expect(loadSeconds).toBeLessThan(0.5);
    expect(metrics).toMatch(/^portcullis_policy_instances\{policy="added-by"\} [12]$/m);
    expect(metrics).not.toContain('portcullis_policy_load_seconds{policy="broken"');
    const lines = current.logs.map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(lines.find((l) => l.msg === 'TLS')).toMatchObject({ mode: 'self-signed', source: expect.stringMatching(/^(generated at start|kept from an earlier start) for 127\.0\.0\.1 \(development only/) });
    expect(lines.find((l) => l.msg === 'ready')).toMatchObject({ loadMs: expect.any(Number), policies: 2, loaded: 1, failed: ['broken'] });
    // It has rules of its own: it fails only what they match.
    expect(lines.find((l) => l.policy === 'broken' && l.level === 'error')).toMatchObject({ msg: 'policy not loaded; requests it matches fail per its failurePolicy' });
  });

  it('without the option, /readyz is ready once every policy was tried, failed or not', async () => {
    current = await startServer(`server: { metricsPort: 0, tls: { mode: self-signed, hostnames: [127.0.0.1] } }
policies:
  - name: broken
    module: ${await junkModule()}
`);
    expect((await get(`${current.server.metricsUrl!}/readyz`)).status).toBe(200);
    // No rules in the file, and none from the module it could not read: it fails every request.
    const line = current.logs.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.policy === 'broken' && l.level === 'error');
    expect(line).toMatchObject({ failurePolicy: 'Fail', msg: expect.stringMatching(/^policy not loaded, and it has no rules in the configuration: every request on \/validate and \/mutate \(and on its own webhooks. \/validate\/<policy>, \/mutate\/<policy>\) fails per its failurePolicy/) });
  });

  it('a policy whose settings are refused fails only the requests its module\'s rules and modes cover (outsider: a typo in settings denied every write in the cluster)', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'portcullis-refused-'));
    onTestFinished(() => rm(dir, { recursive: true, force: true }));
    const settingsSchema = { type: 'object', required: ['label'], properties: { label: { type: 'string' } } };
    const rules = [{ operations: ['CREATE' as const], apiGroups: [''], apiVersions: ['v1'], resources: ['pods'] }];
    await writeFile(join(dir, 'pods-only.wasm'), embedPolicyInfo(await readFile(`${POLICIES}/numbers/numbers.wasm`), { name: 'pods-only', modes: ['validate'], rules, settingsSchema }));
    current = await startServer(`server: { tls: { mode: self-signed, hostnames: [127.0.0.1] } }
policies:
  - name: pods-only
    module: ${dir}/pods-only.wasm
    settings: { lable: team }
`);
    const line = current.logs.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.policy === 'pods-only' && l.level === 'error');
    expect(line).toMatchObject({ msg: 'policy not loaded; requests it matches fail per its failurePolicy', code: 'POLICY_SETTINGS_INVALID' });
    // A ConfigMap is not the module's: allowed. Nor is anything on /mutate: it only validates.
    const configMap = await current.post('/validate', admissionReview({ kind: 'ConfigMap', metadata: { name: 'cm' } }));
    expect(configMap.body.response).toMatchObject({ allowed: true });
    const mutate = await current.post('/mutate', admissionReview({ kind: 'Pod', metadata: { name: 'p' } }));
    expect(mutate.body.response).toMatchObject({ allowed: true });
    // A Pod it covers fails per its failurePolicy (Fail), saying why.
    const pod = await current.post('/validate', admissionReview({ kind: 'Pod', metadata: { name: 'p' } }));
    expect(pod.body.response).toMatchObject({ allowed: false, status: { code: 500, message: expect.stringMatching(/^policy "pods-only": .*settings/) } });
  });

  it('logAllowedReviews logs allowed and mutated reviews at info with the requesting user', async () => {
    const { createLogger } = await import('../../host/src/util/log.ts');
    const logs: string[] = [];
    current = await startServer(`server: { logAllowedReviews: true, tls: { mode: self-signed, hostnames: [127.0.0.1] } }
policies:
${policyYaml('added-by', `settings: { value: t }\n${rule}`)}`, { log: createLogger('info', (l) => logs.push(l)) });
    expect((await current.post('/mutate', review({ metadata: { name: 'x' } }))).status).toBe(200);
    expect((await current.post('/validate', review({ metadata: { name: 'x' } }))).status).toBe(200);
    const lines = logs.map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(lines.find((l) => l.msg === 'mutated')).toMatchObject({ level: 'info', uid: 'uid-obs-1', user: 'alice@example.com', endpoint: '/mutate', patchOperations: expect.any(Number) });
    expect(lines.find((l) => l.msg === 'allowed')).toMatchObject({ level: 'info', user: 'alice@example.com', endpoint: '/validate' });
  });

  it('allowed reviews stay out of the info log by default', async () => {
    const { createLogger } = await import('../../host/src/util/log.ts');
    const logs: string[] = [];
    current = await startServer(`server: { tls: { mode: self-signed, hostnames: [127.0.0.1] } }
policies:
${policyYaml('added-by', `settings: { value: t }\n${rule}`)}`, { log: createLogger('info', (l) => logs.push(l)) });
    expect((await current.post('/mutate', review({ metadata: { name: 'x' } }))).status).toBe(200);
    expect(logs.some((l) => /"msg":"(mutated|allowed|reviewed)"/.test(l))).toBe(false);
  });
});

describe('registry pull metrics', () => {
  it('counts oci:// fetches per registry, ok and failed', async () => {
    const registry = await startRegistry();
    try {
      const reference = `oci://${registry.host}/policies/metrics-added-by:v1`;
      const client = await openClient(parseReference(reference), await resolveOptions({ insecure: [registry.host] }), 'pull,push');
      try {
        await pushPolicy(client, parseReference(reference), await readFile(`${POLICIES}/added-by/added-by.wasm`), 'added-by.wasm');
      } finally {
        await client.close();
      }
      const cache = await mkdtemp(join(tmpdir(), 'portcullis-obs-cache-'));
      current = await startServer(`server: { metricsPort: 0, tls: { mode: self-signed, hostnames: [127.0.0.1] } }
registries: { insecure: ["${registry.host}"], cacheDir: ${cache} }
policies:
  - name: pulled
    module: ${reference}
    settings: { value: t }
  - name: missing
    module: oci://${registry.host}/policies/does-not-exist:v1
`);
      const metrics = (await get(`${current.server.metricsUrl!}/metrics`)).text;
      const host = registry.host.replace(/[.]/g, '\\.');
      expect(metrics).toMatch(new RegExp(`^portcullis_registry_pulls_total\\{registry="${host}",result="ok"\\} 1$`, 'm'));
      expect(metrics).toMatch(new RegExp(`^portcullis_registry_pulls_total\\{registry="${host}",result="failed"\\} 1$`, 'm'));
      expect(metrics).toMatch(new RegExp(`^portcullis_policy_info\\{policy="pulled",digest="sha256:[0-9a-f]{64}",source="oci://${host}/policies/metrics-added-by:v1",state="loaded",code=""\\} 1$`, 'm'));
    } finally {
      await current?.close();
      current = undefined;
      await registry.stop();
    }
  });
});
