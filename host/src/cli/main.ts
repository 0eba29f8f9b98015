// `portcullis <command>`: run | build | serve | push | pull. Each command lives in its own
// module; this file only dispatches and turns errors into one line on stderr.
import { errorMessage } from '../errors.ts';
import { UsageError } from './usage.ts';

const USAGE = `usage: portcullis <command> [options]

commands:
  run    (--policy FILE.wasm | --config portcullis.yaml) --request REVIEW|REQUEST|MANIFEST [--settings JSON|FILE]
         [--mode validate|mutate] [--show response|patched] [--context OBJECTS.yaml [--grant apiVersion/Kind ...]]
         [--operation OP] [--old-object FILE] [--namespace NS] [--user NAME] [--groups a,b]   (for a plain manifest)
         evaluate one policy, or every matching policy of a configuration merged as the server does,
         against an AdmissionReview, a bare AdmissionRequest or a plain manifest (JSON or YAML);
         prints the response review (--show patched: the object after the patch)
  build  SOURCE.ts -o OUT.wasm [--lang typescript|assemblyscript]
         compile a policy (TypeScript -> component, AssemblyScript -> core module)
  test   [SUITE.yaml|DIR ...]
         run declarative test suites (*.test.yaml): each case's merged answer against what it expects;
         one line per case, then "N passed, N failed"; exit 1 on any failure
  bench  --policy FILE.wasm --request REVIEW|REQUEST|MANIFEST [--settings JSON|FILE] [--mode M] [--iterations N] [--json]
         time and size of one policy in the real sandbox: p50/p99 per evaluation, evaluations/s, memory
  serve  [--config portcullis.yaml] [--host H] [--port P] [--tls-self-signed | --cert F --key F | --insecure]
         run the admission webhook (without --config: the built-in example policies)
  push   POLICY.wasm oci://REGISTRY/REPO:TAG      publish a policy to an OCI registry
  pull   oci://REGISTRY/REPO:TAG -o FILE.wasm      fetch a policy from an OCI registry
`;

const commands: Record<string, () => Promise<{ default: (args: string[]) => Promise<number> }>> = {
  run: () => import('./run.ts'),
  build: () => import('./build.ts'),
  test: () => import('./test.ts'),
  bench: () => import('./bench.ts'),
  serve: () => import('./serve.ts'),
  push: () => import('./oci.ts').then((m) => ({ default: m.push })),
  pull: () => import('./oci.ts').then((m) => ({ default: m.pull })),
};

async function main(argv: string[]): Promise<number> {
  const [name, ...args] = argv;
  if (!name || name === '--help' || name === '-h' || name === 'help') {
    process.stdout.write(USAGE);
    return name ? 0 : 2;
  }
  const load = commands[name];
  if (!load) {
    process.stderr.write(`portcullis: unknown command "${name}"\n${USAGE}`);
    return 2;
  }
  try {
    const command = await load();
    return await command.default(args);
  } catch (error) {
    process.stderr.write(`portcullis ${name}: ${errorMessage(error)}\n`);
    return error instanceof UsageError ? 2 : 1;
  }
}

process.exitCode = await main(process.argv.slice(2));
