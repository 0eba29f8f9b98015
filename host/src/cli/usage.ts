import { PolicyLoadError, PolicySettingsError, PortcullisError } from '../errors.ts';

/** Wrong words on the command line: exit code 2 and the usage text. */
export class UsageError extends PortcullisError {
  constructor(message: string) {
    super('USAGE', plainArgs(message));
  }
}

/**
 * node:util parseArgs's words, in ours (outsider: "Unknown option '--bogus'. To specify a
 * positional argument starting with a '-', place it at the end of the command after '--'…").
 */
function plainArgs(message: string): string {
  return message
    .replace(/^Unknown option '([^']+)'\. To specify a positional argument starting with a '-'[^\n]*/, 'unknown option $1')
    .replace(/^Unknown option '([^']+)'/, 'unknown option $1')
    .replace(/^Option '(?:-\w, )?(--[\w-]+) <value>' argument missing/, '$1 needs a value')
    .replace(/^Option '(?:-\w, )?(--[\w-]+)' does not take an argument/, '$1 takes no value');
}

/**
 * A rejection handler: a module that is not there or is a source file says to build it.
 * Outsider: `portcullis test` before the first build said only "policy.wasm does not exist";
 * newcomer: `run --policy src/policy.ts` said only "(bad header)".
 */
export function notBuiltYet(module: string): (error: unknown) => never {
  return (error) => {
    const source = /\.[cm]?[jt]s$/.test(module) && error instanceof PolicyLoadError && error.reason.endsWith('(bad header)');
    if (error instanceof PolicyLoadError && (source || /\.wasm does not exist$/.test(error.message))) {
      const what = source ? `${module} is a source file, not a built module` : error.reason;
      throw new PolicyLoadError(error.policy, `${what}: build it first (\`npm run build\` in a project \`portcullis new\` made, or \`portcullis build SOURCE -o FILE.wasm\`)`, { cause: error });
    }
    throw error;
  };
}

/** A rejection handler: a settings refusal names `where` the settings came from, not the configuration. */
export function settingsFrom(where: string): (error: unknown) => never {
  return (error) => {
    throw error instanceof PolicySettingsError ? error.givenIn(where) : error;
  };
}
