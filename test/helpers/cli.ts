import { spawn } from 'node:child_process';
import { root } from './policies.ts';

export interface CliResult { code: number | null; stdout: string; stderr: string }

/** Runs the real CLI (host/bin/portcullis.js) with the Node running the tests. */
export function cli(args: string[], options: { input?: string; env?: NodeJS.ProcessEnv } = {}): Promise<CliResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [`${root}host/bin/portcullis.js`, ...args], { cwd: root, env: { ...process.env, ...options.env } });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout, stderr }));
    child.stdin.end(options.input ?? '');
  });
}
