// `portcullis new DIR [--lang ts|as]`: a policy project that builds, tests and type-checks as
// generated, so an author starts from green and changes one thing at a time. The example
// policy is the smallest useful one: Pods must carry a label named in the settings.
import { mkdir, readdir, readFile, writeFile } from 'node:fs/promises';
import { basename, dirname, isAbsolute, join, relative, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { errorMessage } from '../errors.ts';
import { NEW_HELP } from './help.ts';
import { UsageError } from './usage.ts';

type Lang = 'ts' | 'as';

export default async function newProject(args: string[]): Promise<number> {
  let parsed;
  try {
    parsed = parseArgs({ args, allowPositionals: true, options: { lang: { type: 'string' }, registry: { type: 'string' }, port: { type: 'string' } } });
  } catch (error) {
    throw new UsageError(`${errorMessage(error)}\n${NEW_HELP}`);
  }
  const { values, positionals } = parsed;
  const [target, ...extra] = positionals;
  if (!target || extra.length > 0) throw new UsageError(NEW_HELP);
  const lang = values.lang ?? 'ts';
  if (lang !== 'ts' && lang !== 'as') throw new UsageError(`--lang must be ts or as, not "${lang}"`);
  // A repository prefix of one's own (ghcr.io/my-org): newcomer, only a host was taken.
  const given = values.registry ?? 'localhost:5000';
  const parts = /^([a-z0-9.-]+(?::\d+)?)((?:\/[a-z0-9]+(?:[._-][a-z0-9]+)*)*)\/?$/i.exec(given);
  if (!parts) throw new UsageError(`--registry must be HOST, HOST:PORT or either with a repository prefix (ghcr.io/my-org), not "${given}"`);
  const registry = { host: parts[1]!, prefix: parts[2] ? parts[2].slice(1).toLowerCase() : 'policies' };
  const port = Number(values.port ?? 8443);
  if (!Number.isInteger(port) || port < 1 || port > 65535) throw new UsageError(`--port must be 1..65535, not "${values.port}"`);
  const dir = resolve(target);
  const name = basename(dir);
  if (!/^[a-z0-9]([a-z0-9-]*[a-z0-9])?$/.test(name) || name.length > 63) {
    throw new UsageError(`"${name}" cannot be a policy name: use lowercase letters, digits and dashes (it becomes the webhook path /validate/${name})`);
  }
  const existing = await readdir(dir).catch((error: NodeJS.ErrnoException) => (error.code === 'ENOENT' ? [] : Promise.reject(error)));
  if (existing.length > 0) throw new Error(`${dir} is not empty; give a new folder (nothing was written)`);
  const { installer, tarballs } = await installedFrom(dir);
  const files = projectFiles(name, lang, registry, port, tarballs);
  for (const [path, content] of Object.entries(files)) {
    await mkdir(join(dir, path, '..'), { recursive: true });
    await writeFile(join(dir, path), content);
  }
  process.stdout.write(`created ${target} (${lang === 'ts' ? 'TypeScript' : 'AssemblyScript'} policy "${name}")\n` +
    `next: ${[dir === process.cwd() ? '' : `cd ${target}`, ...firstSteps(dir, installer, tarballs), 'npm test'].filter(Boolean).join(' && ')}\n`);
  return 0;
}

/**
 * What the project needs before its first `npm test`: nothing inside the folder the packages are
 * installed in (its scripts find the CLI in a node_modules above); elsewhere, an install of them
 * (newcomer: a project made in another folder was told `npm test`, which said `portcullis: not found`).
 */
function firstSteps(dir: string, installer: string | undefined, tarballs: Record<string, string>): string[] {
  if (installer === undefined || dir === installer || dir.startsWith(installer + sep)) return [];
  if (Object.keys(tarballs).length === 2) return ['npm install'];
  return ['npm install --save-dev <the @portcullis/host and @portcullis/sdk tarballs>'];
}

/**
 * The packages are not on the public registry: a project that named them by version made a plain
 * `npm install` (a CI clone) ask registry.npmjs.org for them, and install whatever a stranger
 * published under the name (newcomer F6). The project depends on the tarballs this CLI was
 * installed from, when the folder that installed it says so (`file:` specs), else on nothing:
 * its scripts find the CLI in a node_modules above.
 */
async function installedFrom(projectDir: string): Promise<{ installer?: string; tarballs: Record<string, string> }> {
  // This file is <package>/src/cli/new.(ts|js); the package sits in <folder>/node_modules/@portcullis/host.
  const pkgDir = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
  const installer = dirname(dirname(dirname(pkgDir)));
  if (basename(dirname(dirname(pkgDir))) !== 'node_modules') return { tarballs: {} };
  let manifest: { dependencies?: Record<string, string>; devDependencies?: Record<string, string> };
  try {
    manifest = JSON.parse(await readFile(join(installer, 'package.json'), 'utf8')) as typeof manifest;
  } catch {
    return { installer, tarballs: {} };
  }
  const specs = { ...manifest.dependencies, ...manifest.devDependencies };
  const found: Record<string, string> = {};
  for (const name of ['@portcullis/host', '@portcullis/sdk']) {
    const spec = specs[name];
    if (!spec?.startsWith('file:') || !/\.t(ar\.)?gz$/.test(spec)) continue;
    const tarball = spec.slice('file:'.length);
    found[name] = `file:${relative(projectDir, isAbsolute(tarball) ? tarball : join(installer, tarball)).split('\\').join('/')}`;
  }
  return { installer, tarballs: found };
}

/** Where the project's module is published: `oci://<host>/<prefix>/<name>`. */
interface Publish { host: string; prefix: string }

function projectFiles(name: string, lang: Lang, { host: registry, prefix }: Publish, port: number, tarballs: Record<string, string>): Record<string, string> {
  const source = lang === 'ts' ? 'src/policy.ts' : 'assembly/index.ts';
  const image = `oci://${registry}/${prefix}/${name}:v0.1.0`;
  const loopback = /^(localhost|127\.|\[::1\])/.test(registry);
  const pkg = {
    name, version: '0.1.0', private: true, type: 'module',
    description: 'Pods must carry the label named in the settings (a Portcullis policy)',
    scripts: {
      build: `portcullis build ${source} -o ${name}.wasm`,
      test: `portcullis build ${source} -o ${name}.wasm && portcullis test tests`,
      // tsc cannot check AssemblyScript (its own std and libraries are not TypeScript); asc is
      // its type checker, and it runs in build.
      // Its module goes aside: type-checking must not replace the one `build` wrote and checked.
      typecheck: lang === 'ts' ? 'tsc --noEmit' : `portcullis build ${source} -o node_modules/.cache/typecheck.wasm --no-check`,
      push: `portcullis push ${name}.wasm ${image}${loopback ? ' --insecure' : ''}`,
      // exec: npm passes SIGTERM to the shell that runs a script, and a shell that outlives its
      // command would leave the server running, its webhook configuration still registered.
      serve: 'exec portcullis serve --config portcullis.yaml',
    },
    // Embedded in the module by portcullis build: the host uses them as defaults.
    portcullis: {
      rules: [{ operations: ['CREATE', 'UPDATE'], apiGroups: [''], apiVersions: ['v1'], resources: ['pods'] }],
      settingsSchema: {
        type: 'object', required: ['label'], additionalProperties: false,
        properties: { label: { type: 'string', minLength: 1, description: 'the label every Pod must carry' } },
      },
    },
    ...(Object.keys(tarballs).length > 0 ? { devDependencies: tarballs } : {}),
  };
  const files: Record<string, string> = {
    'package.json': `${JSON.stringify(pkg, null, 2)}\n`,
    'tsconfig.json': `${JSON.stringify(lang === 'ts' ? TS_CONFIG : AS_CONFIG, null, 2)}\n`,
    [source]: lang === 'ts' ? TS_POLICY(name) : AS_POLICY(name),
    [`tests/${name}.test.yaml`]: SUITE(name),
    'examples/pod-with-label.yaml': POD('labelled', true),
    'examples/pod-without-label.yaml': POD('unlabelled', false),
    'portcullis.yaml': SERVE_CONFIG(name, image, loopback ? registry : undefined, port),
    'README.md': README(name, lang, source, image),
    '.gitignore': '*.wasm\nnode_modules/\nca.pem\n',
    // Should someone add them by name later, npm asks a registry that does not exist, not the public one.
    '.npmrc': '@portcullis:registry=https://portcullis-packages-are-not-on-a-registry.invalid/\n',
  };
  return files;
}

const TS_CONFIG = {
  compilerOptions: {
    target: 'es2022', module: 'nodenext', moduleResolution: 'nodenext', strict: true, noEmit: true, skipLibCheck: true, types: [],
  },
  include: ['src'],
};

// For editors: AssemblyScript's declarations (i32, decorators). The type checker is asc.
const AS_CONFIG = {
  extends: 'assemblyscript/std/assembly.json',
  include: ['assembly/**/*.ts'],
};

const TS_POLICY = (name: string) => `// ${name}: every Pod must carry the label named in settings.label.
// validate() runs for each matching request; throwing AdmissionError denies it with a message.
import { AdmissionError, definePolicy, type JsonObject } from '@portcullis/sdk';

interface Settings {
  label: string;
}

function labelsOf(object: JsonObject): JsonObject {
  const metadata = object.metadata;
  if (typeof metadata !== 'object' || metadata === null || Array.isArray(metadata)) return {};
  const labels = metadata.labels;
  return typeof labels === 'object' && labels !== null && !Array.isArray(labels) ? labels : {};
}

export default definePolicy<Settings>({
  validate({ object, settings }) {
    if (!object) return; // DELETE has no object
    if (typeof labelsOf(object)[settings.label] !== 'string') {
      throw new AdmissionError(\`missing required label \${settings.label}\`);
    }
  },
});
`;

const AS_POLICY = (name: string) => `// ${name}: every Pod must carry the label named in settings.label.
// validate() runs for each matching request; Result.deny() denies it with a message.
import { Context, Result, handleValidate, stringAt } from '@portcullis/sdk/assembly';

function check(ctx: Context): Result {
  if (ctx.object == null) return Result.allow(); // DELETE has no object
  const setting = stringAt(ctx.settings, 'label');
  const label = setting != null ? setting : 'team';
  if (ctx.label(label) == null) return Result.deny('missing required label ' + label);
  return Result.allow();
}

export function validate(): i32 {
  return handleValidate(check);
}
`;

const SUITE = (name: string) => `# Run with: npm test (it builds first). Each case is one admission request and what the
# policy must answer; add a case for every rule you add.
policy: ../${name}.wasm
settings: { label: team }
cases:
  - name: a Pod with the label is allowed
    object: { apiVersion: v1, kind: Pod, metadata: { name: web, labels: { team: payments } } }
    expect: { allowed: true }
  - name: a Pod without the label is denied
    object: { apiVersion: v1, kind: Pod, metadata: { name: web } }
    expect: { allowed: false, code: 403, message: missing required label team }
`;

const POD = (name: string, labelled: boolean) => `apiVersion: v1
kind: Pod
metadata:
  name: ${name}${labelled ? '\n  labels:\n    team: payments' : ''}
spec:
  containers:
    - name: app
      image: registry.example/app:1.0
`;

const SERVE_CONFIG = (name: string, image: string, insecure: string | undefined, port: number) => `# npm run serve: the admission webhook for the cluster in $KUBECONFIG, on this machine.
# It registers its own ValidatingWebhookConfiguration (webhooks.managed) with its self-signed
# certificate as the caBundle, and removes it again when stopped. Rules and the settings schema come from the module.
# Stopped without a chance to remove it (kill -9, a crash, a laptop asleep), the configuration
# stays: kubectl delete validatingwebhookconfiguration ${name}.portcullis.dev removes it (so
# does npm run serve again, stopped once it has run for 15 s, when the old lease has expired).
server:
  host: 127.0.0.1
  port: ${port}
  tls: { mode: self-signed, hostnames: [127.0.0.1, localhost] }
webhooks:
  managed: ${name}.portcullis.dev
  url: https://127.0.0.1:${port}
  # Where the host's Lease lives; its webhooks leave out this namespace, kube-system and
  # kube-node-lease by their kubernetes.io/metadata.name label, which Kubernetes 1.21+ sets. On
  # 1.20, label them yourself (kubectl label namespace kube-node-lease kubernetes.io/metadata.name=kube-node-lease).
  namespace: kube-system
${insecure ? `registries:\n  insecure: [${insecure}]\n` : ''}policies:
  - name: ${name}
    module: ${image}   # or, without a registry: ${name}.wasm (from npm run build)
    settings: { label: team }
    # A denial still refuses. With Ignore, the API server admits what it cannot have reviewed
    # (this process gone), so a development webhook left behind does not stop the cluster. Fail
    # (the default) is for the webhook in the cluster, whose Deployment keeps it running.
    failurePolicy: Ignore
`;

const README = (name: string, lang: Lang, source: string, image: string) => `# ${name}

A Portcullis admission policy (${lang === 'ts' ? 'TypeScript' : 'AssemblyScript'}): every Pod must carry the label named
in its settings.

| command | what it does |
|---|---|
| \`npm test\` | build, then run \`tests/*.test.yaml\` in the real sandbox |
| \`npm run typecheck\` | ${lang === 'ts' ? '\`tsc --noEmit\`' : 'the AssemblyScript compiler\'s checks (asc; tsc cannot check AssemblyScript)'} |
| \`npm run build\` | \`${source}\` -> \`${name}.wasm\` (metadata from package.json's \`portcullis\` field) |
| \`npm run push\` | publish the module as \`${image}\` (the reference is in package.json's \`push\` script; \`portcullis.yaml\` serves the same one) |
| \`npm run serve\` | serve it as the admission webhook of the cluster in \`$KUBECONFIG\` |

Then \`kubectl create -f examples/pod-without-label.yaml\` is denied and
\`examples/pod-with-label.yaml\` is admitted.

The scripts use \`@portcullis/host\` and \`@portcullis/sdk\`: from the tarballs named in
package.json's \`devDependencies\` (\`file:\` paths to where \`portcullis new\` was installed from;
keep them reachable, or change the paths, for \`npm install\` and CI), or else from a
\`node_modules\` in a folder above this one. They are not on the public npm registry: install them
from their tarballs (\`npm install --save-dev path/to/portcullis-*.tgz\`), never by name, or npm
would fetch whatever a stranger published under that name; \`.npmrc\` points the \`@portcullis\`
scope at a registry that does not exist, so a name alone fails instead.
`;
