// Which build of the host runs: its package version, and the git commit it was made from
// (PORTCULLIS_REVISION in the image; the packed package's gitHead, set by scripts/pack.ts).
import { readFileSync } from 'node:fs';

export interface BuildInfo {
  version: string;
  revision: string;
}

let cached: BuildInfo | undefined;

export function buildInfo(): BuildInfo {
  if (cached) return cached;
  let pkg: { version?: unknown; gitHead?: unknown } = {};
  try {
    pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as typeof pkg;
  } catch {
    // An unreadable package.json: say unknown rather than fail the command.
  }
  cached = {
    version: typeof pkg.version === 'string' ? pkg.version : 'unknown',
    revision: process.env.PORTCULLIS_REVISION || (typeof pkg.gitHead === 'string' ? pkg.gitHead : 'unknown'),
  };
  return cached;
}
