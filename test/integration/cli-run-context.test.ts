// `portcullis run --context`: context-aware policies evaluated offline against objects from a file.
import { mkdtemp, readFile, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { cli } from '../helpers/cli.ts';
import { root } from '../helpers/policies.ts';

const policy = `${root}policies/unique-ingress-host/unique-ingress-host.wasm`;
const objects = `${root}policies/unique-ingress-host/examples/ingresses.yaml`;
const review = `${root}policies/unique-ingress-host/examples/review.json`;
let dir: string;
beforeAll(async () => { dir = await mkdtemp(join(tmpdir(), 'portcullis-cli-context-')); });

describe('portcullis run --context', () => {
  it('reads the objects of the file: a reused Ingress host is denied, naming the other Ingress', async () => {
    const { code, stdout, stderr } = await cli(['run', '--policy', policy, '--request', review, '--context', objects]);
    expect(stderr).toBe('');
    expect(code).toBe(0);
    expect(JSON.parse(stdout).response).toMatchObject({
      allowed: false, status: { code: 409, message: 'policy "unique-ingress-host": host "shop.example.com" is already used by Ingress shop/web' },
    });
  });

  it('without objects of a kind, that kind is empty: the host is free', async () => {
    await writeFile(join(dir, 'empty.yaml'), '[]\n');
    const { code, stdout } = await cli(['run', '--policy', policy, '--request', review, '--context', join(dir, 'empty.yaml'), '--grant', 'networking.k8s.io/v1/Ingress']);
    expect(code).toBe(0);
    expect(JSON.parse(stdout).response).toMatchObject({ allowed: true });
  });

  it('--grant limits the grants, so a missing grant can be tried offline', async () => {
    const { code, stderr } = await cli(['run', '--policy', policy, '--request', review, '--context', objects, '--grant', 'v1/Namespace']);
    expect(code).toBe(1);
    expect(stderr).toContain('may not read Ingress (networking.k8s.io/v1): its grants are { apiVersion: v1, kind: Namespace }');
    // The fix here is a flag, not the configuration the grant's message names.
    expect(stderr).toContain(`\nportcullis run: add --grant networking.k8s.io/v1/Ingress, or leave out --grant to grant every kind in ${objects}\n`);
  });

  it('with a --context file that holds none of the kind read, says so', async () => {
    await writeFile(join(dir, 'namespaces.yaml'), '- { apiVersion: v1, kind: Namespace, metadata: { name: shop } }\n');
    const { code, stderr } = await cli(['run', '--policy', policy, '--request', review, '--context', join(dir, 'namespaces.yaml')]);
    expect(code).toBe(1);
    expect(stderr).toContain(`\nportcullis run: ${join(dir, 'namespaces.yaml')} holds no Ingress (networking.k8s.io/v1), so that kind is not granted: ` +
      'add some, or --grant networking.k8s.io/v1/Ingress (with the kinds it holds) to grant it empty\n');
  });

  it('without --context, a policy that reads cluster objects is told where they come from here', async () => {
    const { code, stderr } = await cli(['run', '--policy', policy, '--request', review]);
    expect(code).toBe(1);
    expect(stderr).toContain('may not read Ingress (networking.k8s.io/v1): it has no context grants');
    expect(stderr).toContain('\nportcullis run: a policy reads cluster objects here from a file: add --context OBJECTS.yaml ' +
      '(every kind in it is granted; --grant networking.k8s.io/v1/Ingress grants that kind alone)\n');
  });

  it('refuses a bad context file or grant with a clear message', async () => {
    await writeFile(join(dir, 'bad.yaml'), '- { kind: Namespace, metadata: { name: a } }\n');
    const bad = await cli(['run', '--policy', policy, '--request', review, '--context', join(dir, 'bad.yaml')]);
    expect(bad.code).not.toBe(0);
    expect(bad.stderr).toContain(`${join(dir, 'bad.yaml')}: document 1, item 1 has no apiVersion`);
    const grant = await cli(['run', '--policy', policy, '--request', review, '--context', objects, '--grant', 'Ingress']);
    expect(grant.code).toBe(2);
    expect(grant.stderr).toContain('--grant takes apiVersion/Kind');
  });
});

describe('portcullis rbac', () => {
  it('prints the RBAC of a configuration\'s context caches: the shipped overlay is its output for policies/context.yaml', async () => {
    const { code, stdout, stderr } = await cli(['rbac', '--config', 'policies/context.yaml']); // the CLI runs in the checkout's root
    expect(stderr).toBe('');
    expect(code).toBe(0);
    expect(stdout).toBe(await readFile(`${root}deploy-overlays/context/rbac-context.yaml`, 'utf8'));
  });

  it('names the ServiceAccount it binds, and says what is missing without --config (exit 2)', async () => {
    const custom = await cli(['rbac', '-c', `${root}policies/context.yaml`, '--service-account', 'gate', '--namespace', 'admission', '--name', 'gate-context']);
    expect(custom.stdout).toContain('subjects:\n  - kind: ServiceAccount\n    name: gate\n    namespace: admission');
    expect(custom.stdout).toContain('kind: ClusterRole\nmetadata:\n  name: gate-context');
    // With managed webhooks: the host's namespace from the file, and what else the host needs, on stderr (red team).
    const { mkdtemp, writeFile } = await import('node:fs/promises');
    const { tmpdir } = await import('node:os');
    const dir = await mkdtemp(`${tmpdir()}/portcullis-rbac-`);
    await writeFile(`${dir}/managed.yaml`, 'webhooks: { managed: gate.example.com, namespace: ops, leaderElection: true, url: "https://gate.example.com/" }\npolicies: []\n');
    const managed = await cli(['rbac', '-c', `${dir}/managed.yaml`]);
    expect(managed.code).toBe(0);
    expect(managed.stdout).toContain('subjects:\n  - kind: ServiceAccount\n    name: portcullis\n    namespace: ops');
    expect(managed.stderr).toBe('portcullis rbac: this covers context reads only. webhooks.managed is set, so the host also needs the rights in deploy/10-rbac.yaml: ' +
      'create, and get/patch/delete on the validating and mutating webhook configurations named gate.example.com; create, and get/update on the Lease gate.example.com in namespace ops.\n');
    const missing = await cli(['rbac']);
    expect(missing.code).toBe(2);
    expect(missing.stderr).toMatch(/^portcullis rbac: --config is required/);
  });
});
