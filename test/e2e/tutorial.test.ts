// docs/tutorial.md, run as a newcomer would: both packages packed with `npm pack` (scripts/pack.ts),
// installed in a folder outside the checkout, then exactly the tutorial's command blocks, with
// only the registry address and the port swapped for this run's. The last command must be
// denied by the real kube-apiserver calling the webhook the tutorial's `serve` registered.
import { spawn, type ChildProcess } from 'node:child_process';
import { readFile, readdir, rm, stat } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startRegistry, type TestRegistry } from '../helpers/registry.ts';
import { run, type Run } from '../helpers/process.ts';
import { freePort, kubeconfig, kubectl, prepareNamespaces, removeWebhookConfigurations, root, tempDir, waitFor } from './helpers.ts';

let registry: TestRegistry;
let home: string;
let tarballs: string[];
const servers = new Set<ChildProcess>();

/** A command line of the tutorial, in a login-like shell with this run's cluster. */
function sh(line: string, cwd: string): Promise<Run> {
  return run('bash', ['-c', line], { cwd, env: { KUBECONFIG: kubeconfig(), npm_config_update_notifier: 'false' } });
}

function block(markdown: string, tag: string): string[] {
  const found = new RegExp('```sh ' + tag + '\\n([\\s\\S]*?)```').exec(markdown);
  if (!found) throw new Error(`docs/tutorial.md has no \`\`\`sh ${tag} block`);
  return found[1]!.trim().split('\n');
}

beforeAll(async () => {
  await removeWebhookConfigurations();
  await prepareNamespaces();
  registry = await startRegistry();
  // Outside the checkout: no node_modules above it but its own.
  home = await tempDir('portcullis-tutorial-');
  const packed = await run(process.execPath, [join(root, 'scripts/pack.ts')], { cwd: root });
  expect(packed.code, packed.stderr).toBe(0);
  tarballs = packed.stdout.trim().split('\n');
  expect(tarballs.map((t) => t.replace(/^.*\//, '')).sort()).toEqual(['portcullis-host-0.1.0.tgz', 'portcullis-sdk-0.1.0.tgz']);
  // The tutorial's install block, with the tarballs where it says they are.
  const install = (await readFile(join(root, 'docs/tutorial.md'), 'utf8')).match(/```sh\n(npm init -y\nnpm install[^\n]*)\n```/);
  expect(install, 'docs/tutorial.md install block').not.toBeNull();
  for (const line of install![1]!.split('\n')) {
    const result = await sh(line.replace(/\.\/(portcullis-\w+-0\.1\.0\.tgz)/g, (_, file: string) => tarballs.find((t) => t.endsWith(file))!) + ' --prefer-offline --no-audit --no-fund', home);
    expect(result.code, `${line}\n${result.stderr}`).toBe(0);
  }
}, 300_000);

afterAll(async () => {
  for (const server of servers) {
    try {
      process.kill(-server.pid!, 'SIGTERM');
    } catch { /* already gone */ }
  }
  await new Promise((resolve) => setTimeout(resolve, 1000));
  for (const server of servers) {
    try {
      process.kill(-server.pid!, 'SIGKILL');
    } catch { /* already gone */ }
  }
  await kubectl(['delete', 'pods', '--all', '-n', 'default', '--wait=false']);
  await removeWebhookConfigurations();
  await registry?.stop();
});

describe.each([['tutorial-ts', 'my-policy'], ['tutorial-as', 'my-as-policy']])('docs/tutorial.md %s', (tag, name) => {
  it('goes from an empty folder to a Pod denied by the kube-apiserver, with the packed packages only', async () => {
    const port = await freePort();
    const lines = block(await readFile(join(root, 'docs/tutorial.md'), 'utf8'), tag)
      .map((line) => line.replaceAll('localhost:5000', registry.host).replaceAll('8443', String(port)));
    expect(lines).toHaveLength(7);
    let cwd = home;
    const outputs: string[] = [];
    for (const line of lines) {
      let command = line;
      const cd = /^cd (\S+) && (.*)$/.exec(line);
      if (cd) {
        cwd = join(cwd, cd[1]!);
        command = cd[2]!;
      }
      if (command.endsWith('&')) {
        // serve: started in its own process group so the test can stop npm and the host together.
        const server = spawn('bash', ['-c', command.slice(0, -1)], { cwd, detached: true, env: { ...process.env, KUBECONFIG: kubeconfig() }, stdio: ['ignore', 'pipe', 'pipe'] });
        servers.add(server);
        let log = '';
        server.stdout.on('data', (d) => (log += d));
        server.stderr.on('data', (d) => (log += d));
        await waitFor(`the tutorial's serve to register ${name}.portcullis.dev (log: ${log.slice(-2000)})`, async () => {
          const got = await kubectl(['get', 'validatingwebhookconfiguration', `${name}.portcullis.dev`, '-o', 'json']);
          return got.code === 0 && (JSON.parse(got.stdout) as { webhooks?: { clientConfig?: { caBundle?: string } }[] }).webhooks?.[0]?.clientConfig?.caBundle;
        }, 60_000);
        continue;
      }
      if (command.startsWith('kubectl ')) break; // the last step is asserted below
      const result = await sh(command, cwd);
      outputs.push(result.stdout + result.stderr);
      expect(result.code, `${line}\n${result.stdout}\n${result.stderr}`).toBe(0);
    }
    // new, test, build, push: what each says it did.
    expect(outputs[0]).toMatch(new RegExp(`created ${name}`));
    expect(outputs[1]).toMatch(/2 passed, 0 failed/);
    expect(outputs[3]).toMatch(new RegExp(`oci://${registry.host}/policies/${name}@sha256:[0-9a-f]{64}`));
    expect((await readdir(cwd)).sort()).toEqual(expect.arrayContaining(['package.json', 'portcullis.yaml', `${name}.wasm`, 'tests', 'examples', 'README.md', '.npmrc']));
    // The project depends on the very tarballs the folder installed, never on a registry name.
    const project = JSON.parse(await readFile(join(cwd, 'package.json'), 'utf8')) as { devDependencies: Record<string, string> };
    expect(Object.keys(project.devDependencies).sort()).toEqual(['@portcullis/host', '@portcullis/sdk']);
    for (const [pkg, spec] of Object.entries(project.devDependencies)) {
      expect(spec).toMatch(/^file:.*\.tgz$/);
      expect(resolve(cwd, spec.slice('file:'.length)), pkg).toBe(tarballs.find((t) => t.includes(pkg.replace('@portcullis/', 'portcullis-'))));
    }
    // Without --config, and no portcullis.yaml where it runs (the folder the packages went into),
    // the installed CLI says what to do (the examples live in the repository).
    const bare = await sh('npx --no -- portcullis serve', dirname(cwd));
    expect(bare.code).toBe(2);
    expect(bare.stderr).toMatch(/portcullis serve: give --config FILE, or run it where a portcullis\.yaml is: the installed package has no built-in example policies/);
    // The docs and manifests the help texts name are in the package.
    const installed = join(dirname(cwd), 'node_modules/@portcullis/host');
    for (const file of ['docs/configuration.md', 'docs/tutorial.md', 'deploy/10-rbac.yaml', 'deploy-overlays/kubernetes-1.20/kustomization.yaml']) {
      await expect(readFile(join(installed, file), 'utf8')).resolves.toMatch(/\S/);
    }
    // And every relative link of those docs leads to a file of the package (newcomer: four did not).
    for (const doc of (await readdir(join(installed, 'docs'))).filter((f) => f.endsWith('.md'))) {
      const text = await readFile(join(installed, 'docs', doc), 'utf8');
      for (const [, target] of text.matchAll(/\]\((?!https?:|#|mailto:)([^)#\s]+)/g)) {
        await expect(stat(join(installed, 'docs', target!)).then(() => target), `docs/${doc} links to ${target}`).resolves.toBe(target);
      }
    }
    // The packed CLI says which commit it was made from, so a stale tarball shows.
    const version = await sh('npx --no -- portcullis --version', cwd);
    expect(version.stdout).toMatch(/^portcullis \d+\.\d+\.\d+ \([0-9a-f]{40}(-dirty)?\) \(node \d+/);
    // The generated project passes its own type check.
    const typecheck = await sh('npm run typecheck', cwd);
    expect(typecheck.code, typecheck.stdout + typecheck.stderr).toBe(0);

    // The seventh command: denied by the apiserver through the webhook. The configuration may be
    // registered a moment before the apiserver uses it, so an admitted Pod is removed and retried.
    const denied = await waitFor('the apiserver to call the webhook', async () => {
      const result = await sh(lines[6]!, cwd);
      if (result.code === 0) {
        await kubectl(['delete', 'pod', 'unlabelled', '-n', 'default', '--wait=false']);
        return undefined;
      }
      return result.stderr;
    }, 30_000, 1000);
    // Word for word what the tutorial shows (its TypeScript policy's name replaced by this one's).
    const shown = /```\n(Error from server: [^`]*)```/.exec(await readFile(join(root, 'docs/tutorial.md'), 'utf8'))![1]!;
    const words = (text: string) => text.replace(/\s+/g, ' ').trim();
    expect(words(denied)).toContain(words(shown).replaceAll('my-policy', name));
    const admitted = await sh('kubectl create -f examples/pod-with-label.yaml', cwd);
    expect(admitted.code, admitted.stderr).toBe(0);
    await kubectl(['delete', 'pod', 'labelled', '-n', 'default']);

    // Stopped as the tutorial says (SIGTERM, to npm alone as a script or a supervisor would send
    // it, not to its whole process group), the host removes the configuration it registered.
    for (const server of servers) {
      const exited = new Promise((resolve) => server.once('exit', resolve));
      process.kill(server.pid!, 'SIGTERM');
      await exited;
      servers.delete(server);
    }
    await waitFor('the tutorial\'s configuration to be removed', async () =>
      (await kubectl(['get', 'validatingwebhookconfiguration', `${name}.portcullis.dev`])).code !== 0);
  });
});

it('a project made outside the folder the packages are installed in is told to install them first, and that works (newcomer)', async () => {
  // Told only `npm test`, it failed with `portcullis: not found`: no node_modules above it.
  const outside = join(await tempDir('portcullis-elsewhere-'), 'elsewhere');
  const made = await sh(`npx --no -- portcullis new ${outside}`, home);
  expect(made.code, made.stderr).toBe(0);
  expect(made.stdout).toContain(`next: cd ${outside} && npm install && npm test\n`);
  const first = await sh('npm install --prefer-offline --no-audit --no-fund && npm test', outside);
  expect(first.code, first.stdout + first.stderr).toBe(0);
  expect(first.stdout).toMatch(/2 passed, 0 failed/);
}, 300_000);

afterAll(async () => {
  await rm(home, { recursive: true, force: true }).catch(() => undefined);
});
