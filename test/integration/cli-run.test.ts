import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { cli } from '../helpers/cli.ts';
import { root, wasm } from '../helpers/policies.ts';
import { answering, fillForever, module } from '../helpers/wasm.ts';

const review = `${root}test/fixtures/reviews/numbers-bad.json`;
let dir: string;
beforeAll(async () => { dir = await mkdtemp(join(tmpdir(), 'portcullis-cli-')); });

describe('portcullis run', () => {
  it('prints the response review and exits 0 on a denial', async () => {
    const { code, stdout, stderr } = await cli(['run', '--policy', wasm('numbers'), '--request', review]);
    expect(stderr).toBe('');
    expect(code).toBe(0);
    expect(JSON.parse(stdout)).toEqual({
      apiVersion: 'admission.k8s.io/v1', kind: 'AdmissionReview',
      response: {
        uid: '705ab4f5-6393-11e8-b7cc-42010a800002', allowed: false,
        status: { code: 499, message: 'policy "numbers": Numbers must be within 0..100.' },
        warnings: ['policy "numbers": spec.numbers[1] is a string ("7"); it should be a number.'],
      },
    });
  });

  it('stops a loop of 16 MiB memory.fill calls at its deadline, and exits: the worker thread ended', async () => {
    // V8's dynamic tiering looked for interrupts in such a loop only every few minutes, so the
    // call was answered on time and the thread spun on: the process never exited (red team).
    const file = join(dir, 'fill.wasm');
    await writeFile(file, module({
      memories: [{ min: 256 }], functions: [fillForever(16 * 2 ** 20)],
      exports: [{ name: 'memory', kind: 'memory', index: 0 }, { name: 'validate', kind: 'func', index: 0 }],
    }));
    const started = performance.now();
    const { code, stderr } = await cli(['run', '--policy', file, '--request', review, '--timeout-ms', '1000']);
    expect(stderr).toMatch(/^portcullis run: policy "fill" .* exceeded its 1s CPU deadline\n$/);
    expect(code).toBe(1);
    expect(performance.now() - started).toBeLessThan(20_000);
  }, 60_000);

  it('exits 1 naming why when the policy\'s patch does not apply to the object', async () => {
    const file = join(dir, 'bad-patch.wasm');
    await writeFile(file, await answering({ outcome: 'allow', patch: [{ op: 'replace', path: '/spec/missing/deep', value: 1 }] }));
    const { code, stdout, stderr } = await cli(['run', '--policy', file, '--request', review, '--mode', 'mutate']);
    expect(JSON.parse(stdout).response).toMatchObject({ allowed: false, status: { code: 500 } });
    expect(stderr).toMatch(/^portcullis run: policy "bad-patch" .* failed on request .*: returned a patch that does not apply to the object: \/spec\/missing\/deep.*\n$/);
    expect(code).toBe(1);
  });

  it('with --config, exits 1 with a line for each policy that failed, beside the response', async () => {
    const config = join(dir, 'failing.yaml');
    await writeFile(config, `policies:\n  - name: trap\n    module: ${wasm('trap')}\n    failurePolicy: Ignore\n  - name: numbers\n    module: ${wasm('numbers')}\n`);
    const { code, stdout, stderr } = await cli(['run', '--config', config, '--request', review]);
    expect(JSON.parse(stdout).response).toMatchObject({ allowed: false, status: { code: 499 } });
    // One line per call that failed: trap is called to mutate, then to validate.
    const lines = stderr.trim().split('\n');
    expect(lines).toHaveLength(2);
    for (const line of lines) expect(line).toMatch(/^portcullis run: policy "trap" failed on request 705ab4f5-6393-11e8-b7cc-42010a800002: crashed: wasm trap: unreachable/);
    expect(code).toBe(1);
  });

  it('with --config and managed webhooks, one per policy, mutates one policy after another as the apiserver calls them; /mutate\'s merge with singleWebhook', async () => {
    // Newcomer: two policies setting one label differently were a conflict in run --config, and
    // the cluster (one webhook each, called in turn) admitted the Pod with the second's value.
    const label = (value: string) => answering({ outcome: 'allow', patch: [{ op: 'add', path: '/metadata/labels', value: { 'checked-by': value } }] });
    await writeFile(join(dir, 'first.wasm'), await label('first'));
    await writeFile(join(dir, 'second.wasm'), await label('second'));
    const policies = `policies:\n  - { name: first, module: ${join(dir, 'first.wasm')} }\n  - { name: second, module: ${join(dir, 'second.wasm')} }\n`;
    const perPolicy = join(dir, 'per-policy.yaml');
    await writeFile(perPolicy, `webhooks: { managed: labels.example.com, url: "https://127.0.0.1:8443", namespace: portcullis }\n${policies}`);
    const ok = `${root}test/fixtures/reviews/numbers-ok.json`;
    const inTurn = await cli(['run', '--config', perPolicy, '--request', ok, '--mode', 'mutate', '--show', 'patched']);
    expect(inTurn.stderr).toBe('');
    expect(JSON.parse(inTurn.stdout).metadata.labels).toEqual({ 'checked-by': 'second' });
    const single = join(dir, 'single.yaml');
    await writeFile(single, `webhooks: { managed: labels.example.com, url: "https://127.0.0.1:8443", namespace: portcullis, singleWebhook: true }\n${policies}`);
    const merged = await cli(['run', '--config', single, '--request', ok, '--mode', 'mutate']);
    expect(JSON.parse(merged.stdout).response).toMatchObject({ allowed: false, status: { code: 500, message: expect.stringContaining('its patch conflicts with policy "first"') as unknown } });
    expect(merged.code).toBe(1);
  });

  it('with --config and managed webhooks, calls an IfNeeded policy again when a later one changed the object, as the apiserver does', async () => {
    // Newcomer: the cluster called the first policy a second time, and run --config showed one call.
    const module = `${root}policies/added-by/added-by.wasm`;
    const config = (first: 'IfNeeded' | 'Never', last: 'IfNeeded' | 'Never') => `webhooks: { managed: order.example.com, url: "https://127.0.0.1:8443", namespace: portcullis }
policies:
  - { name: first, module: ${module}, settings: { value: first }, reinvocationPolicy: ${first} }
  - { name: quiet, module: ${module}, settings: { value: quiet }, reinvocationPolicy: IfNeeded, match: [{ kind: Secret }] }
  - { name: last, module: ${module}, settings: { value: last }, reinvocationPolicy: ${last} }
`;
    const ok = `${root}test/fixtures/reviews/numbers-ok.json`;
    const annotation = async (first: 'IfNeeded' | 'Never', last: 'IfNeeded' | 'Never') => {
      const file = join(dir, `order-${first}-${last}.yaml`);
      await writeFile(file, config(first, last));
      const result = await cli(['run', '--config', file, '--request', ok, '--mode', 'mutate', '--show', 'patched']);
      expect(result.stderr).toBe('');
      expect(result.code).toBe(0);
      return (JSON.parse(result.stdout) as { metadata: { annotations: Record<string, string> } }).metadata.annotations['portcullis.dev/added-by'];
    };
    // first, then last changes it: first is called again and has the last word.
    expect(await annotation('IfNeeded', 'Never')).toBe('first');
    // Both IfNeeded: first's second call changes it back, so last is called again too, after it
    // in the same second pass (there is no third).
    expect(await annotation('IfNeeded', 'IfNeeded')).toBe('last');
    // Never: once only.
    expect(await annotation('Never', 'IfNeeded')).toBe('last');
  });

  it('with --config and managed webhooks, counts a policy as called where the apiserver calls its webhook, though the host selected nothing then', async () => {
    // Red team, against a real apiserver: two match entries push no objectSelector down, so the
    // apiserver calls the policy's webhook before the label is there (the host selects nothing)
    // and again after a later policy added it (now the host does). run --config left it out.
    await writeFile(join(dir, 'labeller.wasm'), await answering({ outcome: 'allow', patch: [{ op: 'add', path: '/metadata/labels', value: { added: 'yes' } }] }));
    const file = join(dir, 'selected-later.yaml');
    await writeFile(file, `webhooks: { managed: later.example.com, url: "https://127.0.0.1:8443", namespace: portcullis }
policies:
  - name: stamp
    module: ${root}policies/added-by/added-by.wasm
    settings: { value: stamped }
    reinvocationPolicy: IfNeeded
    match: [{ labelSelector: { matchLabels: { added: "yes" } } }, { kind: Secret }]
  - { name: labeller, module: ${join(dir, 'labeller.wasm')} }
`);
    const result = await cli(['run', '--config', file, '--request', `${root}test/fixtures/reviews/numbers-ok.json`, '--mode', 'mutate', '--show', 'patched']);
    expect(result.stderr).toBe('');
    expect(JSON.parse(result.stdout).metadata).toMatchObject({ labels: { added: 'yes' }, annotations: { 'portcullis.dev/added-by': 'stamped' } });
  });

  it('with --config, a policy called twice that warns the same says it once, as the apiserver keeps warnings', async () => {
    // Newcomer: three identical "failed and was ignored" warnings in one response.
    await writeFile(join(dir, 'labeller-2.wasm'), await answering({ outcome: 'allow', patch: [{ op: 'add', path: '/metadata/labels', value: { added: 'yes' } }] }));
    const file = join(dir, 'twice.yaml');
    await writeFile(file, `webhooks: { managed: twice.example.com, url: "https://127.0.0.1:8443", namespace: portcullis }
policies:
  - { name: trap, module: ${wasm('trap')}, failurePolicy: Ignore, modes: [mutate], reinvocationPolicy: IfNeeded }
  - { name: labeller, module: ${join(dir, 'labeller-2.wasm')} }
`);
    const { stdout, stderr } = await cli(['run', '--config', file, '--request', review, '--mode', 'mutate']);
    const warnings = (JSON.parse(stdout) as { response: { warnings: string[] } }).response.warnings;
    expect(warnings.filter((w) => w.startsWith('policy "trap"'))).toHaveLength(1);
    expect(stderr.trim().split('\n').filter((l) => l.includes('policy "trap" failed'))).toHaveLength(1);
  });

  it('with --config and managed webhooks, evaluates a rule-less policy on a manifest given without a namespace (kubectl would put it in one)', async () => {
    // Review: its webhook's default rules are namespaced, and a manifest without a namespace read
    // as cluster-scoped: the policy was left out, silently.
    const file = join(dir, 'rule-less.yaml');
    await writeFile(file, `webhooks: { managed: ruleless.example.com, url: "https://127.0.0.1:8443", namespace: portcullis }
policies:
  - { name: require-labels, module: ${wasm('require-labels')}, settings: { labels: { team: unowned } }, namespaceSelector: { matchLabels: { a: b } } }
`);
    await writeFile(join(dir, 'bare-pod.yaml'), 'apiVersion: v1\nkind: Pod\nmetadata: { name: p }\n');
    const result = await cli(['run', '--config', file, '--request', join(dir, 'bare-pod.yaml'), '--mode', 'validate']);
    expect(JSON.parse(result.stdout).response).toMatchObject({ allowed: false, status: { message: 'policy "require-labels": missing required label: team' } });
    // No namespace, so no namespace's labels to miss: nothing said of its namespaceSelector.
    expect(result.stderr).toBe('');
    const namespaced = await cli(['run', '--config', file, '--request', join(dir, 'bare-pod.yaml'), '--namespace', 'shop', '--mode', 'validate']);
    expect(namespaced.stderr).toBe('portcullis run: "require-labels" has a namespaceSelector, taken as matching: run does not know the namespace\'s labels\n');
  });

  it('with --config and managed webhooks, runs no policy in a namespace every managed webhook leaves out, and says so', async () => {
    const file = join(dir, 'own-namespace.yaml');
    // No webhooks.namespace: the host takes "default" as its own, and the review is in "default".
    await writeFile(file, `webhooks: { managed: own.example.com, url: "https://127.0.0.1:8443" }\npolicies:\n  - { name: stamp, module: ${root}policies/added-by/added-by.wasm, settings: { value: x } }\n`);
    const result = await cli(['run', '--config', file, '--request', `${root}test/fixtures/reviews/numbers-ok.json`, '--mode', 'mutate']);
    expect(result.code).toBe(0);
    expect(JSON.parse(result.stdout).response).toEqual({ uid: '705ab4f5-6393-11e8-b7cc-42010a800002', allowed: true });
    expect(result.stderr).toBe('portcullis run: no managed webhook covers namespace "default" (the host\'s own, a system one, or webhooks.excludeNamespaces: ' +
      'default, kube-node-lease, kube-system): the apiserver does not call the host for it, and no policy runs\n');
  });

  it('with --config, --context gives the policies that read cluster objects the file\'s objects, within their own grants', async () => {
    // Newcomer: --context was ignored with --config, and the reads said "not synced; retry shortly".
    const ingress = `${root}policies/unique-ingress-host`;
    const file = join(dir, 'context.yaml');
    await writeFile(file, `policies:\n  - { name: unique-ingress-host, module: ${ingress}/unique-ingress-host.wasm, context: [{ apiVersion: networking.k8s.io/v1, kind: Ingress }] }\n`);
    const args = ['run', '--config', file, '--request', `${ingress}/examples/review.json`];
    const denied = await cli([...args, '--context', `${ingress}/examples/ingresses.yaml`]);
    expect(denied.stderr).toBe('');
    expect(JSON.parse(denied.stdout).response).toMatchObject({ allowed: false, status: { code: 409, message: 'policy "unique-ingress-host": host "shop.example.com" is already used by Ingress shop/web' } });
    const none = await cli(args);
    expect(none.stderr).toContain('portcullis run: "unique-ingress-host" reads cluster objects (context: in the configuration); give them some with --context OBJECTS.yaml');
    const grant = await cli([...args, '--context', `${ingress}/examples/ingresses.yaml`, '--grant', 'v1/Namespace']);
    expect(grant.code).toBe(2);
    expect(grant.stderr).toContain('--grant goes with --policy; with --config each policy reads what its context: list in the configuration grants');
  });

  it('with --config, applies a patch the worker handed over as text (2,000 members) as any other', async () => {
    const value = Object.fromEntries(Array.from({ length: 2000 }, (_, i) => [`k${i}`, 'v']));
    await writeFile(join(dir, 'wide.wasm'), await answering({ outcome: 'allow', patch: [{ op: 'add', path: '/metadata/annotations', value }] }));
    const config = join(dir, 'wide.yaml');
    await writeFile(config, `policies:\n  - { name: wide, module: ${join(dir, 'wide.wasm')} }\n`);
    const { code, stdout, stderr } = await cli(['run', '--config', config, '--request', `${root}test/fixtures/reviews/numbers-ok.json`, '--mode', 'mutate', '--show', 'patched']);
    expect(stderr).toBe('');
    expect(code).toBe(0);
    expect(JSON.parse(stdout).metadata.annotations).toEqual(value);
  });

  it('says to build a source file or a module not built yet, naming what was given (newcomer)', async () => {
    const hint = 'build it first (`npm run build` in a project `portcullis new` made, or `portcullis build SOURCE -o FILE.wasm`)';
    const source = await cli(['run', '--policy', `${root}policies/numbers/policy.ts`, '--request', review]);
    expect(source.stderr).toBe(`portcullis run: policy "policy.ts" could not be loaded: ${root}policies/numbers/policy.ts is a source file, not a built module: ${hint}\n`);
    expect(source.code).toBe(1);
    const missing = await cli(['run', '--policy', join(dir, 'not-built.wasm'), '--request', review]);
    expect(missing.stderr).toBe(`portcullis run: policy "not-built" could not be loaded: ${join(dir, 'not-built.wasm')} does not exist: ${hint}\n`);
  });

  it('runs the mutate entry point with --mode mutate, and takes the review on stdin', async () => {
    const { readFile } = await import('node:fs/promises');
    const { code, stdout } = await cli(['run', '--policy', wasm('numbers'), '--request', '-', '--mode', 'mutate'], { input: await readFile(review, 'utf8') });
    expect(code).toBe(0);
    const response = JSON.parse(stdout).response;
    expect(response).toMatchObject({ allowed: true, patchType: 'JSONPatch' });
    expect(JSON.parse(Buffer.from(response.patch, 'base64').toString())).toEqual([{ op: 'replace', path: '/spec/numbers/1', value: 7 }]);
  });

  it('passes settings inline or from a file, and answers v1beta1 in v1beta1', async () => {
    const body = JSON.parse(await (await import('node:fs/promises')).readFile(review, 'utf8'));
    body.apiVersion = 'admission.k8s.io/v1beta1';
    await writeFile(join(dir, 'beta.json'), JSON.stringify(body));
    await writeFile(join(dir, 'settings.json'), JSON.stringify({ value: 'from-file' }));
    const inline = await cli(['run', '--policy', wasm('added-by'), '--request', join(dir, 'beta.json'), '--settings', '{"value":"inline"}']);
    const fromFile = await cli(['run', '--policy', wasm('added-by'), '--request', join(dir, 'beta.json'), '--settings', join(dir, 'settings.json')]);
    const patchOf = (out: string) => JSON.parse(Buffer.from(JSON.parse(out).response.patch, 'base64').toString());
    // A YAML file too, as the configuration's settings are written (outsider).
    await writeFile(join(dir, 'settings.yaml'), 'value: from-yaml # a comment\n');
    const fromYaml = await cli(['run', '--policy', wasm('added-by'), '--request', join(dir, 'beta.json'), '--settings', join(dir, 'settings.yaml')]);
    await writeFile(join(dir, 'set.yaml'), 'value: !!set { a }\n');
    const notJson = await cli(['run', '--policy', wasm('added-by'), '--request', join(dir, 'beta.json'), '--settings', join(dir, 'set.yaml')]);
    expect(notJson.stderr).toMatch(/^portcullis run: --settings file .*set\.yaml: \/value is a YAML !!set, which JSON has no form for/);
    await writeFile(join(dir, 'flow.yaml'), '{value: from-flow}\n');
    const flow = await cli(['run', '--policy', wasm('added-by'), '--request', join(dir, 'beta.json'), '--settings', join(dir, 'flow.yaml')]);
    expect(patchOf(flow.stdout)[0].value).toEqual({ 'portcullis.dev/added-by': 'from-flow' });
    await writeFile(join(dir, 'empty.yaml'), '\n');
    const empty = await cli(['run', '--policy', wasm('added-by'), '--request', join(dir, 'beta.json'), '--settings', join(dir, 'empty.yaml')]);
    expect(empty.stderr).toMatch(/^portcullis run: --settings file .*empty\.yaml is empty: write \{\} for no settings/);
    expect(JSON.parse(inline.stdout).apiVersion).toBe('admission.k8s.io/v1beta1');
    expect(patchOf(inline.stdout)[0].value).toEqual({ 'portcullis.dev/added-by': 'inline' });
    expect(patchOf(fromFile.stdout)[0].value).toEqual({ 'portcullis.dev/added-by': 'from-file' });
    expect(patchOf(fromYaml.stdout)[0].value).toEqual({ 'portcullis.dev/added-by': 'from-yaml' });
  });

  describe('bad input: one clear line on stderr and a non-zero exit', () => {
    const cases: [string, () => Promise<string[]>, RegExp][] = [
      ['a missing .wasm', async () => ['--policy', join(dir, 'nope.wasm'), '--request', review], /^portcullis run: policy "nope" could not be loaded: .*nope\.wasm does not exist: build it first/],
      ['a corrupt .wasm', async () => {
        await writeFile(join(dir, 'corrupt.wasm'), 'garbage, not wasm');
        return ['--policy', join(dir, 'corrupt.wasm'), '--request', review];
      }, /^portcullis run: policy "corrupt" could not be loaded: the file is not a WebAssembly module or component \(bad header\)$/],
      ['a review that is not JSON', async () => {
        await writeFile(join(dir, 'bad.json'), '{"apiVersion": ');
        return ['--policy', wasm('numbers'), '--request', join(dir, 'bad.json')];
      }, /^portcullis run: .*bad\.json: not valid JSON/],
      ['JSON that is neither a review nor a manifest', async () => {
        await writeFile(join(dir, 'list.json'), '[1, 2]');
        return ['--policy', wasm('numbers'), '--request', join(dir, 'list.json')];
      }, /^portcullis run: .*list\.json: the object must be a mapping \(a Kubernetes manifest\)$/],
      ['an AdmissionReview that is not valid', async () => {
        await writeFile(join(dir, 'review-bad.json'), '{"apiVersion":"admission.k8s.io/v2","kind":"AdmissionReview","request":{}}');
        return ['--policy', wasm('numbers'), '--request', join(dir, 'review-bad.json')];
      }, /^portcullis run: .*review-bad\.json: unsupported apiVersion "admission.k8s.io\/v2"/],
      ['a missing review file', async () => ['--policy', wasm('numbers'), '--request', join(dir, 'absent.json')], /^portcullis run: cannot read the request .*absent\.json: no such file$/],
      // Red team 5: /dev/zero grew the CLI to 690 MB before "Invalid string length".
      ['a device as the review', async () => ['--policy', wasm('numbers'), '--request', '/dev/zero'], /^portcullis run: cannot read the request \/dev\/zero: it is not a regular file \(a FIFO or a device\?\)$/],
      ['settings that are not JSON', async () => ['--policy', wasm('numbers'), '--request', review, '--settings', '{value: 1}'], /^portcullis run: --settings is not valid JSON/],
      ['a policy that traps', async () => ['--policy', wasm('trap'), '--request', review], /^portcullis run: policy "trap" \(.*trap\.wasm\) failed on request 705ab4f5-6393-11e8-b7cc-42010a800002: crashed: wasm trap.*boom: the policy gave up/],
      ['a policy that returns garbage', async () => ['--policy', wasm('garbage'), '--request', review], /^portcullis run: policy "garbage" .* failed on request .*: returned output that is not JSON/],
      ['an --operation in lower case (the flag is named, not the file)', async () => {
        await writeFile(join(dir, 'pod.yaml'), 'apiVersion: v1\nkind: Pod\nmetadata: { name: p }\n');
        return ['--policy', wasm('numbers'), '--request', join(dir, 'pod.yaml'), '--operation', 'delete'];
      }, /^portcullis run: --operation must be CREATE, UPDATE, DELETE or CONNECT \(upper case\), not "delete"$/],
      ['an UPDATE without the object as it was', async () => {
        await writeFile(join(dir, 'pod.yaml'), 'apiVersion: v1\nkind: Pod\nmetadata: { name: p }\n');
        return ['--policy', wasm('numbers'), '--request', join(dir, 'pod.yaml'), '--operation', 'UPDATE'];
      }, /^portcullis run: --operation UPDATE needs --old-object FILE: the object as it was before the update$/],
      ['a YAML file of several documents', async () => {
        await writeFile(join(dir, 'two.yaml'), 'apiVersion: v1\nkind: Pod\nmetadata: { name: a }\n---\napiVersion: v1\nkind: Pod\nmetadata: { name: b }\n');
        return ['--policy', wasm('numbers'), '--request', join(dir, 'two.yaml')];
      }, /^portcullis run: .*two\.yaml: holds several YAML documents; give one object per file$/],
      ['a mode the policy lacks', async () => ['--policy', wasm('no-delete'), '--request', review, '--mode', 'mutate'], /^portcullis run: policy "no-delete" .* does not mutate; it supports: validate$/],
    ];
    it('stops reading standard input past 8 MiB (red team 5: `< /dev/zero` grew it until a string was too long)', async () => {
      const { code, stderr } = await cli(['run', '--policy', wasm('numbers'), '--request', '-'], { input: ' '.repeat(9 * 2 ** 20) });
      expect(code).toBe(1);
      expect(stderr).toBe(`portcullis run: cannot read the request -: more than ${8 * 2 ** 20} bytes arrived on standard input\n`);
    });

    it.each(cases)('%s', async (_, args, pattern) => {
      const { code, stderr } = await cli(['run', ...(await args())]);
      expect(code).not.toBe(0);
      const lines = stderr.trim().split('\n');
      expect(lines).toHaveLength(1);
      expect(lines[0]).toMatch(pattern);
    });

    it('usage errors exit 2', async () => {
      const { code, stderr } = await cli(['run', '--policy', wasm('numbers')]);
      expect(code).toBe(2);
      expect(stderr).toMatch(/^portcullis run: usage: portcullis run \(--policy FILE.wasm \| --config/);
    });
  });
});
