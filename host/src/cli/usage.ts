import { PolicySettingsError, PortcullisError } from '../errors.ts';

/** Wrong words on the command line: exit code 2 and the usage text. */
export class UsageError extends PortcullisError {
  constructor(message: string) {
    super('USAGE', message);
  }
}

/** A rejection handler: a settings refusal names `where` the settings came from, not the configuration. */
export function settingsFrom(where: string): (error: unknown) => never {
  return (error) => {
    throw error instanceof PolicySettingsError ? error.givenIn(where) : error;
  };
}
