// Every command's help text in one place, so `portcullis <command> --help` answers without
// loading the command (serve alone pulls in the Kubernetes client).
export const NEW_HELP = `usage: portcullis new DIR [--lang ts|as] [--registry HOST[:PORT][/PREFIX]] [--port N]

Creates a policy project in DIR (which must not exist or be empty):
  package.json     scripts: build, test (builds, then runs the suites), typecheck, push, serve
  src/policy.ts    the policy (TypeScript), or assembly/index.ts (AssemblyScript)
  tests/*.test.yaml  an allowed and a denied case, run by portcullis test
  portcullis.yaml  serve it as the cluster's admission webhook, from the registry
  examples/        Pods to try with kubectl
  tsconfig.json, README.md

options:
  --lang ts|as           TypeScript (default) or AssemblyScript
  --registry HOST[:PORT][/PREFIX]
                         where "npm run push" publishes and portcullis.yaml pulls: the module is
                         HOST[:PORT]/PREFIX/DIR (default localhost:5000, prefix policies)
  --port N               where "npm run serve" listens and the apiserver calls it (default 8443)

The name of DIR is the policy's name: lowercase letters, digits and dashes.
`;

export const BUILD_HELP = `usage: portcullis build SOURCE.ts -o OUT.wasm [options]

Compiles a policy: TypeScript -> Wasm component (QuickJS), AssemblyScript -> core module
(a source under an assembly/ folder is AssemblyScript). Type-checks TypeScript first, embeds
the policy's metadata (custom section "portcullis.metadata"), loads the result once in the
sandbox, and writes it only if all of that passed.

options:
  -o, --out FILE        where to write the module (required)
  --lang ts|as          typescript or assemblyscript, when the folder does not say
  --timeout SECONDS     how long the policy's top-level code may run while building (default 60)
  --no-typecheck        build TypeScript even with type errors
  --no-check            do not load the result in the sandbox (faster; the host still checks at load)

metadata: from the nearest package.json above SOURCE: name (without @scope/), version,
description, and its "portcullis" field: { "rules": [...], "settingsSchema": {...} | "FILE.json" }.
Modes (validate, mutate) are read from the built module itself.
`;

export const INSPECT_HELP = `usage: portcullis inspect FILE.wasm|oci://REGISTRY/REPO:TAG [--json] [--insecure] [--docker-config PATH]

Shows a policy module without running it: kind and language, size, sha256 digest, imports and
exports, and the metadata portcullis build embedded (name, version, description, modes,
default rules, settings schema).

options:
  --json                 one JSON object instead of text
  --insecure             plain HTTP to the registry (oci:// only)
  --docker-config PATH   registry credentials (default: $DOCKER_CONFIG/config.json, ~/.docker/config.json)
`;

const ENVIRONMENT = `environment:
  PORTCULLIS_CACHE                where pulled modules, transpiled components and compile trials are cached (default ~/.cache/portcullis)
  PORTCULLIS_INSECURE_REGISTRIES  comma-separated HOST:PORT registries reached over plain HTTP
  PORTCULLIS_REGISTRY_CA          a PEM file of extra CAs trusted for registries
  DOCKER_CONFIG                   folder of the config.json with registry credentials (default ~/.docker)
  KUBECONFIG                      cluster credentials for serve (webhooks.managed, context) and the deploy tooling
`;

export const COMMANDS: Record<string, { summary: string; help: string }> = {
  new: { summary: 'create a policy project that builds and tests as generated', help: NEW_HELP },
  build: { summary: 'compile a policy (TypeScript -> component, AssemblyScript -> core module)', help: BUILD_HELP },
  test: {
    summary: 'run declarative test suites (*.test.yaml) against built policies',
    help: `usage: portcullis test [SUITE.yaml|DIR ...]

Runs declarative suites: each case's merged answer (allowed, code, message, warnings, patched
object) against what it expects, in the real sandbox. Without arguments, the current folder;
a folder is searched for *.test.yaml and portcullis-test.yaml. Prints one line per case, then
"N passed, N failed"; exits 1 on any failure or unusable suite file or case. A policy that
fails (crash, deadline, memory cap) fails its case, even one expecting the denial that
failurePolicy Fail makes of it, unless the case expects failed: true.

suite file:
  policy: ../my-policy.wasm          # or policies: [{ name, module, settings, rules, context }]
  settings: { ... }
  context: objects.yaml              # cluster objects the policies may read: a file, or a list of objects
  cases:
    - name: ...
      object: { ... }                # or request: a whole AdmissionRequest
      operation: CREATE              # oldObject, namespace, user, groups, dryRun, mode
      expect: { allowed: false, code: 403, message: substring, warnings: [...], patched: { ... } }
                                     # failed: true  when a policy failing is what the case tests
`,
  },
  run: {
    summary: 'evaluate one policy, or a whole configuration, against one request',
    help: `usage: portcullis run (--policy FILE.wasm|oci://... | --config portcullis.yaml) --request FILE [options]

Evaluates one policy, or every matching policy of a configuration merged as the server does,
against an AdmissionReview, a bare AdmissionRequest or a plain manifest (JSON or YAML), and
prints the response review. Exits 1 when a policy fails (not when it denies).

options:
  --policy FILE|oci://REF     the module (with --settings, --mode, --timeout-ms, --memory-mib)
  --config FILE               a serve configuration: every matching policy, mutate then validate
  --request FILE              AdmissionReview, AdmissionRequest or a manifest ("-" for stdin)
  --settings JSON|FILE        the policy's settings (default {}): inline JSON, or a JSON or YAML file
  --mode validate|mutate      default: validate if the policy can
  --show response|patched     patched: print the object after the merged patch
  --timeout-ms N, --memory-mib N   sandbox limits for --policy
  --context OBJECTS.yaml      cluster objects the policies may read (with --config, within each one's context: grants)
  --grant apiVersion/Kind     with --policy: grant only these kinds (default: every kind in OBJECTS.yaml)
  --insecure                  plain HTTP to the registry of oci:// modules
  --docker-config PATH        registry credentials
for a plain manifest:
  --operation CREATE|UPDATE|DELETE|CONNECT  --old-object FILE  --namespace NS  --user NAME  --groups a,b
`,
  },
  bench: {
    summary: 'time one policy in the real sandbox: p50/p99, evaluations/s, memory',
    help: `usage: portcullis bench --policy FILE.wasm --request FILE [options]

Evaluates one policy repeatedly in the real sandbox and reports p50/p99 per evaluation,
evaluations per second and memory, as kwctl bench does.

options:
  --settings JSON|FILE   --mode validate|mutate   --iterations N (default 1000)   --warmup N (default 100)
  --json                 one JSON object
  --operation, --old-object, --namespace, --user, --groups   as for run, with a plain manifest
`,
  },
  inspect: { summary: 'show a module: kind, digest, imports, exports, embedded metadata', help: INSPECT_HELP },
  serve: {
    summary: 'run the admission webhook',
    help: `usage: portcullis serve [--config portcullis.yaml] [options]

Runs the admission webhook: POST /validate, /mutate (all matching policies) and
/validate/NAME, /mutate/NAME; GET /healthz, /readyz, /metrics. The configuration is
watched and reloaded. Without --config: ./portcullis.yaml if there is one, else (in the
repository checkout) the example policies.

options:
  -c, --config FILE        the configuration (docs/configuration.md)
  --host H, --port P       listen address (default 0.0.0.0:8443)
  --tls-self-signed        a self-signed certificate (default), --cadump FILE writes it (the caBundle)
  --cert FILE --key FILE   serve this certificate (re-read on change)
  --client-ca FILE         require and verify client certificates
  --insecure               plain HTTP (testing only)
  --log-level L            debug | info | warn | error
  --workers N              sandbox worker threads (default: one per core, at least 2)
`,
  },
  rbac: {
    summary: 'print the RBAC that the context caches of a configuration need',
    help: `usage: portcullis rbac --config portcullis.yaml [--name N] [--service-account SA] [--namespace NS]

Prints a ClusterRole with list and watch on every kind the configuration caches for
context-aware policies (their grants, and Namespaces for single-webhook namespaceSelectors),
and its ClusterRoleBinding to the host's ServiceAccount (default portcullis in webhooks.namespace,
else in portcullis). Apply it beside deploy/, and again whenever a policy's context grants
change. With webhooks.managed it also says, on stderr, the rights deploy/10-rbac.yaml gives for
the webhook configurations, the Lease and the certificate Secret.
`,
  },
  push: {
    summary: 'publish a policy module to an OCI registry',
    help: `usage: portcullis push POLICY.wasm oci://REGISTRY/REPO:TAG [--insecure] [--docker-config PATH]

Pushes the module as an OCI artifact and prints the reference pinned by digest (what to put
in a configuration). --insecure: plain HTTP to this registry.
`,
  },
  pull: {
    summary: 'fetch a policy module from an OCI registry',
    help: `usage: portcullis pull oci://REGISTRY/REPO[:TAG|@sha256:DIGEST] -o FILE.wasm [--insecure] [--docker-config PATH] [--max-module-mib N]

Fetches the module (verified against its digest) and prints the reference pinned by digest.
--max-module-mib: the largest module accepted (default 32, as limits.maxModuleMiB).
`,
  },
};

export function commandHelp(name: string): string {
  const entry = COMMANDS[name];
  return entry ? `${entry.help}\n${ENVIRONMENT}` : '';
}

export function mainHelp(version: string): string {
  const width = Math.max(...Object.keys(COMMANDS).map((n) => n.length));
  const lines = Object.entries(COMMANDS).map(([name, { summary }]) => `  ${name.padEnd(width)}  ${summary}`);
  return `portcullis ${version}: sandboxed WebAssembly admission policies for Kubernetes

usage: portcullis <command> [options]
       portcullis <command> --help     every option of a command
       portcullis --version

commands:
${lines.join('\n')}

${ENVIRONMENT}`;
}
