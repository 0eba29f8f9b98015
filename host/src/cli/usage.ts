import { PortcullisError } from '../errors.ts';

/** Wrong words on the command line: exit code 2 and the usage text. */
export class UsageError extends PortcullisError {
  constructor(message: string) {
    super('USAGE', message);
  }
}
