// `portcullis <command>`. Each command lives in its own module; this file dispatches, answers
// --help and --version without loading any command, and turns errors into one line on stderr.
import { errorMessage } from '../errors.ts';
import { commandHelp, mainHelp } from './help.ts';
import { UsageError } from './usage.ts';
import { cliVersion, versionLine } from './version.ts';
import { threadsLeft } from '../sandbox/unstopped.ts';

const commands: Record<string, () => Promise<{ default: (args: string[]) => Promise<number> }>> = {
  new: () => import('./new.ts'),
  build: () => import('./build.ts'),
  test: () => import('./test.ts'),
  run: () => import('./run.ts'),
  bench: () => import('./bench.ts'),
  inspect: () => import('./inspect.ts'),
  serve: () => import('./serve.ts'),
  rbac: () => import('./rbac.ts'),
  push: () => import('./oci.ts').then((m) => ({ default: m.push })),
  pull: () => import('./oci.ts').then((m) => ({ default: m.pull })),
};

async function main(argv: string[]): Promise<number> {
  const [name, ...args] = argv;
  if (name === '--version' || name === '-V' || name === 'version') {
    process.stdout.write(versionLine());
    return 0;
  }
  if (!name || name === '--help' || name === '-h' || name === 'help') {
    const topic = name === 'help' ? args[0] : undefined;
    process.stdout.write(topic && commands[topic] ? commandHelp(topic) : mainHelp(cliVersion()));
    return name ? 0 : 2;
  }
  const load = commands[name];
  if (!load) {
    process.stderr.write(`portcullis: unknown command "${name}"; run portcullis --help for the list\n`);
    return 2;
  }
  // Before "--", a help flag anywhere means help: nothing else on the line is acted on.
  const options = args.includes('--') ? args.slice(0, args.indexOf('--')) : args;
  if (options.includes('--help') || options.includes('-h')) {
    process.stdout.write(commandHelp(name));
    return 0;
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
// Node ends a process only once every worker thread has, and a sandbox thread that V8 could not
// stop never does (SandboxPool #stop): `run` printed its answer and then hung, and `serve` said
// "stopped" and stayed (red team). Only a signal ends it. stdout and stderr are synchronous here
// (Linux pipes, files and terminals), so what was written is out.
const stuck = await threadsLeft();
if (stuck > 0) {
  process.stderr.write(`portcullis: ${stuck} sandbox worker thread${stuck === 1 ? '' : 's'} could not be stopped; ending the process with SIGKILL `
    + `(its exit status would have been ${Number(process.exitCode ?? 0)})\n`);
  process.kill(process.pid, 'SIGKILL');
  // As PID 1 of a container (the image's ENTRYPOINT) the kernel ignores a SIGKILL sent from
  // inside (review helper); abort() ends in a fault that it does not ignore.
  process.abort();
}
