// Running a command to completion, and finding a free loopback port: shared by the CLI,
// integration and e2e tests.
import { spawn } from 'node:child_process';
import { createServer } from 'node:net';

export interface Run { code: number | null; stdout: string; stderr: string }

export function run(command: string, args: string[], options: { input?: string; env?: NodeJS.ProcessEnv; cwd?: string } = {}): Promise<Run> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { ...(options.cwd ? { cwd: options.cwd } : {}), env: { ...process.env, ...options.env } });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout, stderr }));
    // A command that exits without reading its stdin (kubectl failing fast) closes the pipe
    // first: EPIPE then says nothing the exit code and stderr do not.
    child.stdin.on('error', () => {});
    child.stdin.end(options.input ?? '');
  });
}

export function freePort(): Promise<number> {
  return new Promise((ok, fail) => {
    const server = createServer();
    server.once('error', fail);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as { port: number };
      server.close(() => ok(port));
    });
  });
}
