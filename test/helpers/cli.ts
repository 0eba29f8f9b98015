import { root } from './policies.ts';
import { run, type Run } from './process.ts';

export type CliResult = Run;

/** Runs the real CLI (host/bin/portcullis.js) with the Node running the tests. */
export function cli(args: string[], options: { input?: string; env?: NodeJS.ProcessEnv } = {}): Promise<CliResult> {
  return run(process.execPath, [`${root}host/bin/portcullis.js`, ...args], { ...options, cwd: root });
}
