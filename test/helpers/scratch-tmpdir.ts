// Vitest global setup: every test file (and every process it starts) makes its temporary files
// under one directory of this run, removed when the run ends. Tests clean up after themselves
// where they can, but a failed or timed-out test cannot, and each run used to leave dozens of
// portcullis-* directories in /tmp.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export default function setup(): () => void {
  const dir = mkdtempSync(join(tmpdir(), 'portcullis-tests-'));
  process.env.TMPDIR = dir;
  return () => rmSync(dir, { recursive: true, force: true });
}
