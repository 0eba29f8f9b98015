// Starts one real control plane (etcd + kube-apiserver 1.20 on loopback) for the whole e2e run,
// with ../shared/tools/local-apiserver.sh, and stops it afterwards. Ports are picked free so
// that two runs on one machine do not collide. KUBE_APISERVER (a binary) passes through.
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { freePort } from '../helpers/process.ts';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { TestProject } from 'vitest/node';

declare module 'vitest' {
  export interface ProvidedContext {
    kubeconfig: string;
    apiserverDir: string;
  }
}

const root = fileURLToPath(new URL('../..', import.meta.url));
const script = process.env.PORTCULLIS_LOCAL_APISERVER ?? resolve(root, '../shared/tools/local-apiserver.sh');

function run(args: string[], env: NodeJS.ProcessEnv): Promise<string> {
  return new Promise((ok, fail) => {
    execFile(script, args, { env, timeout: 15 * 60_000 }, (error, stdout, stderr) => {
      if (error) fail(new Error(`${script} ${args.join(' ')} failed: ${stderr || error.message}`));
      else ok(stdout);
    });
  });
}

function buildApiserver(): Promise<string> {
  return new Promise((ok, fail) => {
    execFile(resolve(root, 'scripts/kube-apiserver.sh'), { timeout: 30 * 60_000 }, (error, stdout, stderr) => {
      if (error) fail(new Error(`scripts/kube-apiserver.sh failed: ${stderr || error.message}`));
      else ok(stdout.trim());
    });
  });
}

export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  if (!existsSync(script)) throw new Error(`the e2e tests need ${script} (../shared/tools beside the repository)`);
  const dir = await mkdtemp(join(tmpdir(), 'portcullis-e2e-apiserver-'));
  // Our own build of the apiserver (scripts/kube-apiserver.sh): the shared tool's binary
  // crashes on mutating webhook patches. KUBE_APISERVER still wins when set.
  const apiserver = process.env.KUBE_APISERVER ?? (await buildApiserver());
  const env = { ...process.env, KUBE_APISERVER: apiserver, ETCD_PORT: String(await freePort()), APISERVER_PORT: String(await freePort()) };
  try {
    await run(['up', dir], env);
  } catch (error) {
    await run(['down', dir], env).catch(() => undefined);
    throw error;
  }
  project.provide('kubeconfig', join(dir, 'kubeconfig'));
  project.provide('apiserverDir', dir);
  return async () => {
    const log = await readFile(join(dir, 'apiserver.log'), 'utf8').catch(() => '');
    // A crashed apiserver makes every later test fail obscurely: say so once, plainly.
    if (/fatal error:|panic:/.test(log)) process.stderr.write(`\nkube-apiserver crashed during the e2e run; see ${join(dir, 'apiserver.log')} (kept)\n`);
    await run(['down', dir], env);
    if (!/fatal error:|panic:/.test(log)) await rm(dir, { recursive: true, force: true });
  };
}
