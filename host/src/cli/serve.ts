// `portcullis serve`: run the admission webhook until SIGTERM/SIGINT, then stop gracefully.
import { fileURLToPath } from 'node:url';
import { existsSync } from 'node:fs';
import module from 'node:module';
import { parseArgs } from 'node:util';
import { loadConfigFile } from '../config/load.ts';
import type { Config, TlsConfig } from '../config/types.ts';
import { ConfigError, errorMessage } from '../errors.ts';
import { abandonModuleFetches } from '../policy/source.ts';
import { checkStartable, PortcullisServer } from '../server/app.ts';
import { createLogger } from '../util/log.ts';
import { defaultKubeConfigFound } from '../util/kubeconfig.ts';
import { terminalHungUp } from '../util/terminal.ts';
import type { WebhookManager } from '../webhooks/manager.ts';
import { UsageError } from './usage.ts';

/** The example policies shipped in the repository (and the image). */
export const BUILTIN_CONFIG = fileURLToPath(new URL('../../../policies/portcullis.yaml', import.meta.url));
/** Without --config, a portcullis.yaml in the working folder comes first. */
const HERE_CONFIG = 'portcullis.yaml';

export default async function serve(args: string[]): Promise<number> {
  const values = parseCli(args);
  // Outsider: in a project `portcullis new` made, `serve` alone asked for --config beside its portcullis.yaml.
  const here = !values.config && existsSync(HERE_CONFIG) ? HERE_CONFIG : undefined;
  if (!values.config && !here && !existsSync(BUILTIN_CONFIG)) {
    // Installed from the package: the example policies live only in the repository and image.
    throw new UsageError('give --config FILE, or run it where a portcullis.yaml is: the installed package has no built-in example policies (portcullis new DIR writes a portcullis.yaml)');
  }
  if (here) process.stderr.write(`portcullis serve: using ./${HERE_CONFIG} (no --config given)\n`);
  const configFile = values.config ?? here ?? BUILTIN_CONFIG;
  const config = applyFlags(await loadConfigFile(configFile), values);
  // Said before anything starts, naming the setting: found after "ready", the missing cluster
  // read as a crash of a host that had just said it was serving (newcomer, `npm run serve` in a
  // generated project, whose portcullis.yaml manages its webhooks).
  if (config.webhooks.managed && !defaultKubeConfigFound()) {
    throw new ConfigError(`webhooks.managed is set in ${configFile}, so the host registers its webhooks in a cluster, and no cluster is configured: ` +
      'set KUBECONFIG, or run in a Pod with a ServiceAccount; to try the policies without a cluster, remove webhooks.managed');
  }
  const log = createLogger(config.logLevel);
  // SIGHUP's default ends the process: one sent while the policies load (an operator nudging a
  // slow start from a registry) killed the host silently (red team). Until the server is up it
  // is noted, and acted on once it is.
  let earlyHangup = false;
  const hangupWhileStarting = () => {
    if (!earlyHangup) log.info('SIGHUP while starting: acted on once the policies have loaded');
    earlyHangup = true;
  };
  process.on('SIGHUP', hangupWhileStarting);
  // Checked before the certificate below, which may write the cluster's Secret (start checks again).
  await checkStartable(config);
  // tls.mode "secret": the certificate comes from the cluster, before the server can listen.
  const certificate = config.server.tls.mode === 'secret'
    ? await (await import('../certs/in-cluster.ts')).openInClusterCertificate(config, log)
    : undefined;
  const server = await PortcullisServer.start({
    config, log, ...(certificate ? { tls: certificate.material, certificateSource: certificate.source } : {}),
    // The flags win over the file at every reload too.
    adjust: (reloaded) => applyFlags(reloaded, values),
  });
  // Signals are taken from here on, before anything else is awaited: the server says "ready"
  // from start(), and a SIGTERM in the second it took to load the Kubernetes client got Node's
  // default, an exit with no cleanup (seen as a flaky test on a loaded machine).
  let manager: WebhookManager | undefined;
  let stopping = false;
  let stoppingSince = 0;
  let stopped!: () => void;
  const done = new Promise<void>((resolve) => { stopped = resolve; });
  const shutdown = (signal: string) => {
    // Handlers stay installed for the whole shutdown: a second signal (Ctrl-C on `npm run
    // serve` sends two, the terminal's and npm's) otherwise got Node's default, an immediate
    // exit before the webhooks were removed, leaving a Fail webhook on a dead port (red team).
    if (stopping) {
      // The same Ctrl-C delivered twice (the terminal's and npm's or npx's) is no news: said
      // quietly. A later one is someone waiting: they are told what the wait is for.
      const level = performance.now() - stoppingSince < 1000 ? 'debug' : 'warn';
      return void server.log[level]('already shutting down (the webhook configurations go first; bounded to about 15 s); ignoring', { signal });
    }
    stopping = true;
    stoppingSince = performance.now();
    // SIGTERM is the kubelet's: go on answering for server.shutdownDelayMs while the apiserver
    // and kube-proxy stop sending here (app.ts, drain). SIGINT is someone at a terminal.
    const delayMs = signal === 'SIGTERM' ? server.config.server.shutdownDelayMs : 0;
    server.log.info('shutting down', { signal, ...(delayMs > 0 ? { drainMs: delayMs } : {}) });
    // A load or reload waiting on a stalled registry would never be used now, and its socket
    // kept the process alive after "stopped" (red team).
    abandonModuleFetches();
    const drained = server.drain(delayMs);
    // Webhooks go first, while the server still answers: the apiserver keeps calling a
    // webhook until its removal lands, and with Fail an unanswered call denies the request.
    // The Lease is released last, so a replica taking over finds the cleanup done.
    (certificate ? certificate.stop() : Promise.resolve())
      .then(() => manager?.stop())
      .catch((error: unknown) => server.log.error('webhook management did not stop cleanly', { message: errorMessage(error) }))
      .then(() => drained)
      .then(() => server.stop())
      .then(stopped, stopped);
  };
  process.on('SIGTERM', () => shutdown('SIGTERM'));
  process.on('SIGINT', () => shutdown('SIGINT'));
  // The terminal it was started from closed (SIGHUP otherwise reloads: app.ts). What is left of
  // the log has nowhere to go: a write to the hung-up terminal fails, and must not end the
  // process before the webhooks are removed.
  process.on('SIGHUP', () => {
    if (!terminalHungUp()) return;
    for (const stream of [process.stdout, process.stderr]) stream.on('error', () => {});
    shutdown('SIGHUP');
  });
  // Under npm (npx, or a script without `exec`) a shell sits between npm and this process: a
  // SIGTERM to npx ended npm and the shell, and the host served on, orphaned, holding its port,
  // its Lease and its Fail webhooks (red team). Its parent changing is the only sign it gets.
  if (process.env.npm_command !== undefined) {
    const parent = process.ppid;
    const orphaned = setInterval(() => {
      if (process.ppid === parent) return;
      clearInterval(orphaned);
      shutdown('parent process exited (npm or npx)');
    }, 500);
    orphaned.unref();
  }
  process.off('SIGHUP', hangupWhileStarting);
  if (earlyHangup) {
    if (terminalHungUp()) shutdown('SIGHUP');
    else void server.reload();
  }
  if (configFile === BUILTIN_CONFIG) server.log.info('serving the built-in example policies', { config: BUILTIN_CONFIG });
  // Node writes its compile cache (bin/portcullis.js) at exit, which a killed Pod never reaches.
  module.flushCompileCache?.(); // Node 22.10+
  if (config.webhooks.managed) {
    try {
      // Imported only when management is on: the Kubernetes client costs ~1 s and ~80 MiB.
      const { startWebhookManager } = await import('../webhooks/attach.ts');
      // A signal while it loaded: the shutdown is under way, and nothing is to be registered.
      if (!stopping) {
        manager = startWebhookManager(server);
        const leading = manager;
        server.metrics.watchLeader(() => leading.isLeader, () => leading.syncFailing);
        certificate?.follow(server, manager);
      }
    } catch (error) {
      if (!stopping) await server.stop();
      throw error;
    }
  }
  await done;
  server.log.info('stopped');
  return 0;
}

type Flags = ReturnType<typeof parseCli>;

function parseCli(args: string[]) {
  try {
    return parseArgs({
      args,
      options: {
        config: { type: 'string', short: 'c' }, host: { type: 'string' }, port: { type: 'string' },
        'tls-self-signed': { type: 'boolean' }, cert: { type: 'string' }, key: { type: 'string' }, insecure: { type: 'boolean' },
        cadump: { type: 'string' }, 'client-ca': { type: 'string' }, 'log-level': { type: 'string' }, workers: { type: 'string' },
      },
    }).values;
  } catch (error) {
    throw new UsageError((error as Error).message);
  }
}

export function applyFlags(config: Config, flags: Flags): Config {
  const server = { ...config.server };
  if (flags.host) server.host = flags.host;
  if (flags.port !== undefined) {
    const port = Number(flags.port);
    if (!Number.isInteger(port) || port < 0 || port > 65535) throw new UsageError(`--port must be 0..65535, not "${flags.port}"`);
    server.port = port;
  }
  const chosen = [flags['tls-self-signed'], flags.cert || flags.key, flags.insecure].filter(Boolean).length;
  if (chosen > 1) throw new UsageError('choose one of --tls-self-signed, --cert/--key and --insecure');
  const client = flags['client-ca'] ? { clientCA: flags['client-ca'], requireClientCert: true } : undefined;
  const current = server.tls;
  const keep = current.mode === 'insecure' ? { requireClientCert: false } : { ...(current.clientCA ? { clientCA: current.clientCA } : {}), requireClientCert: current.requireClientCert };
  let tls: TlsConfig = current;
  if (flags.insecure) tls = { mode: 'insecure' };
  else if (flags.cert || flags.key) {
    if (!flags.cert || !flags.key) throw new UsageError('--cert and --key go together');
    tls = { mode: 'files', certFile: flags.cert, keyFile: flags.key, ...keep, ...client };
  } else if (flags['tls-self-signed']) {
    tls = { mode: 'self-signed', hostnames: current.mode === 'self-signed' ? current.hostnames : ['localhost', '127.0.0.1'], ...keep, ...client };
  } else if (client && tls.mode !== 'insecure') tls = { ...tls, ...client };
  if (flags.cadump) {
    if (tls.mode !== 'self-signed') throw new UsageError('--cadump writes the self-signed certificate (the caBundle); it goes with --tls-self-signed');
    tls = { ...tls, cadump: flags.cadump };
  }
  server.tls = tls;
  const logLevel = flags['log-level'] ?? config.logLevel;
  if (!['debug', 'info', 'warn', 'error'].includes(logLevel)) throw new UsageError('--log-level must be debug, info, warn or error');
  const workers = flags.workers === undefined ? config.workers : Number(flags.workers);
  if (!Number.isInteger(workers) || workers < 0) throw new UsageError('--workers must be a whole number');
  return { ...config, server, logLevel: logLevel as Config['logLevel'], workers };
}
