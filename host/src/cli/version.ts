// The CLI's version: the host package's own version, the same in the checkout and installed.
import { buildInfo } from '../util/build-info.ts';

export function cliVersion(): string {
  return buildInfo().version;
}

/** `portcullis --version`: with the commit when the build knows it, so a stale package shows. */
export function versionLine(): string {
  const { version, revision } = buildInfo();
  return `portcullis ${version}${revision === 'unknown' ? '' : ` (${revision})`} (node ${process.versions.node})\n`;
}
