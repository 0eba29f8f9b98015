import { PolicySettingsError, PortcullisError } from '../errors.ts';

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

/** A rejection handler: a settings refusal names `where` the settings came from, not the configuration. */
export function settingsFrom(where: string): (error: unknown) => never {
  return (error) => {
    throw error instanceof PolicySettingsError ? error.givenIn(where) : error;
  };
}
