// Connects the webhook manager to a running server: the server's reloads and certificate
// rotations trigger syncs, and policies the apiserver no longer calls are retired.
import type { WebhooksConfig } from '../config/types.ts';
import type { Logger } from '../util/log.ts';
import type { ManagedPolicy } from './build.ts';
import { createKubeClients, type KubeClients } from './kube.ts';
import { checkManagedName } from './build.ts';
import { WebhookManager } from './manager.ts';

export const RETIRE_MARGIN_MS = 3_000;

export interface AttachOptions {
  clients?: KubeClients;
  kubeconfig?: string;
  identity?: string;
  env?: NodeJS.ProcessEnv;
  resyncMs?: number;
}

/**
 * What the manager needs of the server it manages webhooks for. server/app.ts's
 * PortcullisServer is one; declared here so this layer does not import the server.
 */
export interface ManagedServer {
  readonly config: { webhooks: WebhooksConfig };
  readonly log: Logger;
  readonly registry: { readonly current: { readonly entries: readonly ManagedPolicy[] } };
  readonly tls: { caBundle: string } | undefined;
  retireRemovedPolicies(syncStarted: number, marginMs: number): void;
  webhookReadiness(): { ready: boolean; why?: string };
  onReload(listener: () => void): void;
  onCertificate(listener: (tls: { caBundle: string }) => void | Promise<void>): void;
}

/**
 * Starts managing webhooks for a running server: follows its reloads and certificate
 * rotations. Throws only for a configuration that can never work (bad name, no credentials).
 */
export function startWebhookManager(server: ManagedServer, options: AttachOptions = {}): WebhookManager {
  // A name the apiserver would refuse is the more basic mistake: report it before credentials.
  if (server.config.webhooks.managed) checkManagedName(server.config.webhooks.managed);
  const clients = options.clients ?? createKubeClients(options.kubeconfig);
  const manager = new WebhookManager({
    clients,
    log: server.log,
    webhooks: () => server.config.webhooks,
    policies: () => server.registry.current.entries,
    ...(server.tls ? { caBundle: server.tls.caBundle } : {}),
    ...(options.identity ? { identity: options.identity } : {}),
    ...(options.env ? { env: options.env } : {}),
    ...(options.resyncMs ? { resyncMs: options.resyncMs } : {}),
    // Removed policies stop being answered once the apiserver has had time to see their webhooks go.
    onSynced: (started) => server.retireRemovedPolicies(started, RETIRE_MARGIN_MS),
    ready: () => server.webhookReadiness(),
  });
  server.onReload(() => manager.requestSync('configuration reloaded'));
  server.onCertificate(async (tls) => void await manager.publishCa(tls.caBundle));
  manager.start();
  return manager;
}
