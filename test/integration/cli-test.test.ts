// `portcullis test`: declarative suites run through the real CLI, against built example policies.
import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { cli } from '../helpers/cli.ts';
import { root } from '../helpers/policies.ts';
import { parseSuite, SuiteError } from '../../host/src/cli/test.ts';
import { module } from '../helpers/wasm.ts';

let dir: string;
const policy = (name: string) => `${root}policies/${name}/${name}.wasm`;

async function suite(name: string, text: string): Promise<string> {
  const path = join(dir, name);
  await writeFile(path, text);
  return path;
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'portcullis-cli-test-'));
});

const GOOD = (numbers: string, requireLabels: string) => `
policies:
  - module: ${numbers}
    rules: [{ operations: [CREATE, UPDATE], apiGroups: [kopf.dev], apiVersions: ["*"], resources: [kopfexamples] }]
  - module: ${requireLabels}
    settings: { labels: { team: unowned } }
    rules: [{ operations: [CREATE, UPDATE], apiGroups: [""], apiVersions: [v1], resources: [pods] }]
cases:
  - name: numbers in range are allowed
    object: { apiVersion: kopf.dev/v1, kind: KopfExample, metadata: { name: a, namespace: default }, spec: { numbers: [1, 2] } }
    expect: { allowed: true }
  - name: a number out of range is denied with the policy's code, and a string only warns
    object: { apiVersion: kopf.dev/v1, kind: KopfExample, metadata: { name: a }, spec: { numbers: ["7", 500] } }
    expect:
      allowed: false
      code: 499
      message: "Numbers must be within 0..100"
      warnings: ['is a string ("7")']
  - name: a pod without the team label is denied
    object: { apiVersion: v1, kind: Pod, metadata: { name: p, namespace: default }, spec: {} }
    expect: { allowed: false, message: "missing required label: team" }
  - name: in mutate mode the missing label is added
    mode: mutate
    object: { apiVersion: v1, kind: Pod, metadata: { name: p, namespace: default }, spec: {} }
    expect:
      allowed: true
      patched: { apiVersion: v1, kind: Pod, metadata: { name: p, namespace: default, labels: { team: unowned } }, spec: {} }
  - name: a whole AdmissionRequest works too
    mode: mutate
    request:
      uid: r-1
      kind: { group: "", version: v1, kind: ConfigMap }
      resource: { group: "", version: v1, resource: configmaps }
      namespace: default
      operation: CREATE
      userInfo: { username: alice }
      object: { apiVersion: v1, kind: ConfigMap, metadata: { name: c } }
    expect: { allowed: true }
`;

describe('portcullis test', () => {
  it('runs every case of a suite through the sandbox and the merge, one line each, then the summary', async () => {
    const file = await suite('good.test.yaml', GOOD(policy('numbers'), policy('require-labels')));
    const result = await cli(['test', file]);
    expect(result.stderr).toBe('');
    const lines = result.stdout.trim().split('\n');
    expect(lines).toHaveLength(6);
    expect(lines.slice(0, 5).every((l) => l.startsWith('PASS '))).toBe(true);
    expect(lines[1]).toContain('› a number out of range is denied');
    expect(lines[5]).toBe('5 passed, 0 failed');
    expect(result.code).toBe(0);
  });

  it('reports each unmet expectation on its case line and exits 1', async () => {
    const file = await suite('bad.test.yaml', `
policy: ${policy('added-by')}
settings: { value: portcullis }
cases:
  - name: wrong decision
    mode: mutate
    object: { apiVersion: v1, kind: ConfigMap, metadata: { name: c } }
    expect: { allowed: false, code: 403 }
  - name: wrong patched object
    mode: mutate
    object: { apiVersion: v1, kind: ConfigMap, metadata: { name: c } }
    expect: { patched: { apiVersion: v1, kind: ConfigMap, metadata: { name: c } } }
  - name: right patched object
    mode: mutate
    object: { apiVersion: v1, kind: ConfigMap, metadata: { name: c } }
    expect: { patched: { apiVersion: v1, kind: ConfigMap, metadata: { name: c, annotations: { portcullis.dev/added-by: portcullis } } } }
`);
    const result = await cli(['test', file]);
    const lines = result.stdout.trim().split('\n');
    expect(lines[0]).toMatch(/^FAIL .*› wrong decision: expected denied, got allowed; expected code 403, got none$/);
    expect(lines[1]).toMatch(/^FAIL .*› wrong patched object: the patched object differs: expected .*, got .*added-by/);
    expect(lines[2]).toMatch(/^PASS .*› right patched object$/);
    expect(lines[3]).toBe('1 passed, 2 failed');
    expect(result.code).toBe(1);
  });

  it('reads `warnings: []` as "no warnings", not as "none wanted"', async () => {
    // Newcomer: a policy that always warned passed a case expecting none.
    const file = join(await mkdtemp(join(tmpdir(), 'portcullis-cli-warnings-')), 'warnings.test.yaml');
    await writeFile(file, `
policy: ${policy('numbers')}
cases:
  - name: warned
    object: { apiVersion: kopf.dev/v1, kind: KopfExample, metadata: { name: a }, spec: { numbers: ["7"] } }
    expect: { allowed: true, warnings: [] }
  - name: quiet
    object: { apiVersion: kopf.dev/v1, kind: KopfExample, metadata: { name: a }, spec: { numbers: [7] } }
    expect: { allowed: true, warnings: [] }
`);
    const result = await cli(['test', file]);
    const lines = result.stdout.trim().split('\n');
    expect(lines[0]).toMatch(/^FAIL .*› warned: expected no warnings, got \[".*is a string.*"\]$/);
    expect(lines[1]).toMatch(/^PASS .*› quiet$/);
    expect(result.code).toBe(1);
  });

  it('says when no policy evaluated a case whose verdict is not the expected one (its rules match nothing)', async () => {
    // In a folder of its own: the folder test below counts the suites in the shared one.
    const file = join(await mkdtemp(join(tmpdir(), 'portcullis-cli-unmatched-')), 'unmatched.test.yaml');
    await writeFile(file, `
policies:
  - module: ${policy('require-labels')}
    settings: { labels: { team: unowned } }
    rules: [{ operations: [CREATE], apiGroups: [apps], apiVersions: [v1], resources: [deployments] }]
cases:
  - name: a pod no rule matches
    object: { apiVersion: v1, kind: Pod, metadata: { name: p, namespace: default }, spec: {} }
    expect: { allowed: false }
`);
    const result = await cli(['test', file]);
    expect(result.stdout).toMatch(/FAIL .*› a pod no rule matches: expected denied, got allowed; no policy evaluated this request: none of their rules matches its operation and resource \(or its mode\)\n/);
    expect(result.code).toBe(1);
  });

  it('finds *.test.yaml in a folder, and a bad suite file is one ERROR line that counts as failed', async () => {
    const sub = await mkdtemp(join(dir, 'tree-'));
    await writeFile(join(sub, 'ok.test.yaml'), `policy: ${policy('numbers')}\ncases:\n  - object: { apiVersion: v1, kind: X, spec: { numbers: [1] } }\n    expect: { allowed: true }\n`);
    await writeFile(join(sub, 'broken.test.yaml'), 'policy: [unclosed\n');
    await writeFile(join(sub, 'missing.test.yaml'), `policy: ${join(sub, 'nope.wasm')}\ncases:\n  - object: { apiVersion: v1, kind: X }\n    expect: { allowed: true }\n`);
    await writeFile(join(sub, 'ignored.yaml'), 'not a suite');
    const result = await cli(['test', sub]);
    const lines = result.stdout.trim().split('\n');
    expect(lines).toHaveLength(4);
    expect(lines[0]).toMatch(/^ERROR .*broken\.test\.yaml: not valid YAML/);
    expect(lines[1]).toMatch(/^ERROR .*missing\.test\.yaml: .*nope\.wasm/);
    expect(lines[2]).toMatch(/^PASS .*ok\.test\.yaml › case 1$/);
    expect(lines[3]).toBe('1 passed, 2 failed');
    expect(result.code).toBe(1);
  });

  it('a policy that fails does not pass a case expecting a denial; a bad case is its own ERROR line and the rest still run', async () => {
    const folder = await mkdtemp(join(tmpdir(), 'portcullis-cli-failing-'));
    // validate is `unreachable`: a crash, which failurePolicy Fail turns into a denial.
    await writeFile(join(folder, 'trap.wasm'), module({
      memories: [{ min: 1 }], functions: [[0x00]],
      exports: [{ name: 'memory', kind: 'memory', index: 0 }, { name: 'validate', kind: 'func', index: 0 }],
    }));
    const file = join(folder, 'failing.test.yaml');
    await writeFile(file, `policy: trap.wasm
cases:
  - name: expects a denial
    object: { apiVersion: v1, kind: Pod, metadata: { name: p } }
    expect: { allowed: false }
  - name: a typo in this case
    object: { apiVersion: v1, kind: Pod, metadata: { name: p } }
    expect: { alowed: false }
  - name: expects the failure
    object: { apiVersion: v1, kind: Pod, metadata: { name: p } }
    expect: { failed: true, allowed: false }
`);
    const result = await cli(['test', file]);
    const lines = result.stdout.trim().split('\n');
    expect(lines).toHaveLength(4);
    expect(lines[0]).toMatch(/^FAIL .*› expects a denial: policy trap failed \(crash\) instead of deciding: crashed: wasm trap: unreachable/);
    expect(lines[1]).toMatch(/^ERROR .*› a typo in this case: cases\[1\] \("a typo in this case"\): expect takes .*not alowed$/);
    expect(lines[2]).toMatch(/^PASS .*› expects the failure$/);
    expect(lines[3]).toBe('1 passed, 2 failed');
    expect(result.code).toBe(1);
  });

  it('gives policies cluster context, and the caller headers and a TLS peer, from the suite', async () => {
    await writeFile(join(dir, 'objects.yaml'), 'apiVersion: v1\nkind: Namespace\nmetadata: { name: shop, labels: { owner: ann } }\n');
    const file = await suite('caller.test.yaml', `
context: objects.yaml
policies:
  - module: ${policy('namespace-owner')}
    rules: [{ operations: [CREATE], apiGroups: [""], apiVersions: [v1], resources: [pods] }]
  - module: ${policy('show-auth')}
    rules: [{ operations: [CREATE], apiGroups: [""], apiVersions: [v1], resources: [configmaps] }]
cases:
  - name: a pod in an owned namespace
    object: { apiVersion: v1, kind: Pod, metadata: { name: p, namespace: shop } }
    expect: { allowed: true }
  - name: a pod in a namespace the context does not hold
    object: { apiVersion: v1, kind: Pod, metadata: { name: p, namespace: nowhere } }
    expect: { failed: true, message: 'namespace "nowhere" is not in the cache yet' }
  - name: the caller as the server would see it
    object: { apiVersion: v1, kind: ConfigMap, metadata: { name: c, namespace: shop } }
    headers: { Authorization: Bearer x }
    sslpeer: { subject: { CN: kube-apiserver, O: [a, b] } }
    expect: { allowed: true, warnings: ['TLS peer: CN=kube-apiserver', 'groups (O): ["a","b"]', 'Authorization header: present'] }
  - name: a secret no policy looks at
    object: { apiVersion: v1, kind: Secret, metadata: { name: s, namespace: shop } }
    expect: { allowed: true }
`);
    const result = await cli(['test', file]);
    const lines = result.stdout.trim().split('\n');
    expect(lines.slice(0, 3).every((l) => l.startsWith('PASS ') && !l.includes('no policy evaluated'))).toBe(true);
    // A case that reaches no policy passes, saying so.
    expect(lines[3]).toMatch(/^PASS .*› a secret no policy looks at \(no policy evaluated this request: none of their rules matches its operation and resource, or its mode\)$/);
    expect(lines[4]).toBe('4 passed, 0 failed');
    expect(result.code).toBe(0);
  });

  it('grants a policy only the kinds its context entry names', async () => {
    const file = await suite('grants.test.yaml', `
context:
  - { apiVersion: v1, kind: Namespace, metadata: { name: shop, labels: { owner: ann } } }
policies:
  - module: ${policy('namespace-owner')}
    context: [{ apiVersion: networking.k8s.io/v1, kind: Ingress }]
cases:
  - object: { apiVersion: v1, kind: Pod, metadata: { name: p, namespace: shop } }
    expect: { allowed: true }
`);
    const result = await cli(['test', file]);
    expect(result.stdout).toMatch(/^FAIL .*may not read Namespace/m);
    expect(result.stdout).not.toContain('hint:'); // the suite has a context: the grant is the policy's
    expect(result.code).toBe(1);
  });

  it('says how a suite gives its policies cluster objects, when one reads them without any (newcomer)', async () => {
    const file = await suite('no-context.test.yaml', `
policies:
  - module: ${policy('namespace-owner')}
cases:
  - name: one
    object: { apiVersion: v1, kind: Pod, metadata: { name: p, namespace: shop } }
    expect: { allowed: true }
  - name: two
    object: { apiVersion: v1, kind: Pod, metadata: { name: q, namespace: shop } }
    expect: { allowed: true }
`);
    const result = await cli(['test', file]);
    expect(result.stdout).toMatch(/^FAIL .*› one: .*may not read Namespace \(v1\): it has no context grants/m);
    // Once per suite.
    expect(result.stdout.match(/hint:/g)).toHaveLength(1);
    expect(result.stdout).toMatch(/^ {2}hint: give .*no-context\.test\.yaml cluster objects with a top-level context: \(a YAML file, as run --context, or a list of objects\); a policy may read every kind in it, or the kinds its own context: lists$/m);
    expect(result.code).toBe(1);
  });

  it('says plainly when there is nothing to run (usage error, exit 2)', async () => {
    const empty = await mkdtemp(join(dir, 'empty-'));
    const result = await cli(['test', empty]);
    expect(result.code).toBe(2);
    expect(result.stderr).toMatch(/^portcullis test: no test suites found in/);
  });

  it('says to build first when a suite\'s policy was never built (outsider: "does not exist" alone)', async () => {
    const path = await suite('unbuilt.test.yaml', `policies:\n  - module: ${join(dir, 'unbuilt.wasm')}\ncases:\n  - name: x\n    object: { apiVersion: v1, kind: ConfigMap, metadata: { name: a } }\n    expect: { allowed: true }\n`);
    const result = await cli(['test', path]);
    expect(result.code).not.toBe(0);
    expect(`${result.stdout}${result.stderr}`).toMatch(/unbuilt\.wasm does not exist: build it first \(`npm run build` in a project `portcullis new` made, or `portcullis build SOURCE -o FILE\.wasm`\)/);
  });
});

describe('suite files are checked field by field', () => {
  const bad = (text: string) => () => parseSuite('/x/s.test.yaml', text);
  it.each([
    ['a list instead of a mapping', '- a\n', /must be a YAML mapping/],
    ['no cases', 'policy: p.wasm\n', /"cases" must be a non-empty list/],
    ['both policy and policies', 'policy: a.wasm\npolicies: [b.wasm]\ncases: [{}]\n', /not both/],
    ['bad rules', 'policies: [{ module: p.wasm, rules: [{ operations: CREATE }] }]\ncases:\n  - { object: { apiVersion: v1, kind: Pod }, expect: { allowed: true } }\n', /policies\[0\]\.rules must be/],
    // A misspelt key would be a setting or a context quietly left out.
    ['an unknown top-level key', 'policy: p.wasm\nsettinsg: { a: 1 }\ncases: [{}]\n', /unknown field\(s\) settinsg \(known: policy, settings, policies, context, cases\)/],
    ['an unknown policy key', 'policies: [{ module: p.wasm, grants: [] }]\ncases: [{}]\n', /policies\[0\] has unknown field\(s\) grants/],
    ['a context that is neither file nor list', 'policy: p.wasm\ncontext: { kind: Namespace }\ncases: [{}]\n', /"context" must be the path of a YAML file/],
    ['a context object without a name', 'policy: p.wasm\ncontext: [{ apiVersion: v1, kind: Namespace }]\ncases: [{}]\n', /has no metadata\.name/],
    ['a bad grant', 'policies: [{ module: p.wasm, context: [v1/Namespace] }]\ncases: [{}]\n', /policies\[0\]\.context must be a list of \{apiVersion, kind\}/],
  ])('the whole suite: %s', (_name, text, message) => {
    expect(bad(text)).toThrow(SuiteError);
    expect(bad(text)).toThrow(message);
  });

  // A mistake in one case is that case's error; the suite's other cases still parse.
  const GOOD_CASE = '  - { name: fine, object: { apiVersion: v1, kind: Pod }, expect: { allowed: true } }\n';
  it.each([
    ['an unknown case field', '  - { objet: {}, expect: { allowed: true } }\n', /cases\[1\] has unknown field\(s\) objet/],
    ['no expectation', '  - { object: { apiVersion: v1, kind: Pod } }\n', /"expect" must be a mapping/],
    ['an unknown expectation', '  - { object: { apiVersion: v1, kind: Pod }, expect: { allow: true } }\n', /not allow/],
    ['a bad expect.failed', '  - { object: { apiVersion: v1, kind: Pod }, expect: { failed: yes please } }\n', /expect\.failed must be true or false/],
    ['an object without kind', '  - { object: { metadata: {} }, expect: { allowed: true } }\n', /needs apiVersion and kind/],
    ['a bad operation', '  - { operation: PATCH, object: { apiVersion: v1, kind: Pod }, expect: { allowed: true } }\n', /operation must be/],
    ['a bad request', '  - { request: { uid: x }, expect: { allowed: true } }\n', /request: request x: request.kind/],
    ['headers that are not strings', '  - { object: { apiVersion: v1, kind: Pod }, headers: { x-n: 1 }, expect: { allowed: true } }\n', /headers must be a mapping of header names to strings/],
    ['a peer without a subject', '  - { object: { apiVersion: v1, kind: Pod }, sslpeer: { issuer: {} }, expect: { allowed: true } }\n', /sslpeer must be a mapping with subject/],
    ['a peer with an unknown field', '  - { object: { apiVersion: v1, kind: Pod }, sslpeer: { subject: {}, cn: x }, expect: { allowed: true } }\n', /sslpeer must be/],
    ['a duplicate case name', '  - { name: fine, object: { apiVersion: v1, kind: Pod }, expect: { allowed: false } }\n', /another case is already named "fine"/],
  ])('one case: %s', (_name, text, message) => {
    const parsed = parseSuite('/x/s.test.yaml', `policy: p.wasm\ncases:\n${GOOD_CASE}${text}`);
    expect(parsed.cases).toHaveLength(2);
    expect(parsed.cases[0]).not.toHaveProperty('error');
    expect(parsed.cases[1]).toMatchObject({ error: expect.stringMatching(message) });
  });

  it('builds the request from the object: kind, resource, namespace, operation and user', () => {
    const parsed = parseSuite('/x/s.test.yaml', `policy: p.wasm
cases:
  - object: { apiVersion: networking.k8s.io/v1, kind: Ingress, metadata: { name: i, namespace: shop } }
    oldObject: { apiVersion: networking.k8s.io/v1, kind: Ingress, metadata: { name: i, namespace: shop } }
    user: alice
    groups: [dev]
    expect: { allowed: true }
`);
    expect(parsed.policies).toEqual([{ name: 'p', module: '/x/p.wasm', settings: {}, rules: undefined, grants: undefined }]);
    expect(parsed.cases[0]).toHaveProperty('request');
    expect((parsed.cases[0] as { request: unknown }).request).toMatchObject({
      kind: { group: 'networking.k8s.io', version: 'v1', kind: 'Ingress' },
      resource: { group: 'networking.k8s.io', version: 'v1', resource: 'ingresses' },
      name: 'i', namespace: 'shop', operation: 'UPDATE', userInfo: { username: 'alice', groups: ['dev'] },
    });
  });
});
