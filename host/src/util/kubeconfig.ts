// Where Kubernetes credentials come from when no --kubeconfig is given, as client-node looks.
import { existsSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';

const SERVICE_ACCOUNT_TOKEN = '/var/run/secrets/kubernetes.io/serviceaccount/token';

/**
 * Whether KubeConfig.loadFromDefault() would find a real configuration: KUBECONFIG,
 * ~/.kube/config, or a Pod's ServiceAccount. Without one it does not fail: it makes up
 * http://localhost:8080, and the host then retried that forever with a message about TLS
 * (outside author), instead of saying that no cluster is configured.
 */
export function defaultKubeConfigFound(env: NodeJS.ProcessEnv = process.env): boolean {
  if (env.KUBECONFIG) return true;
  const home = env.HOME || homedir();
  return (home !== '' && existsSync(join(home, '.kube', 'config'))) || existsSync(SERVICE_ACCOUNT_TOKEN);
}
