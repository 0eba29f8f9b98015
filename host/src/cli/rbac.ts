// `portcullis rbac --config FILE`: the ClusterRole and binding that a configuration's context
// caches need (list and watch on each cached kind), as YAML to apply beside deploy/. A command,
// not a script in the repository, so operators who installed the package can run it too.
import { parseArgs } from 'node:util';
import { loadConfigFile } from '../config/load.ts';
import { kindsToCache } from '../context/needs.ts';
import { contextRbacYaml } from '../context/rbac.ts';
import { errorMessage } from '../errors.ts';
import { UsageError } from './usage.ts';

const USAGE = 'usage: portcullis rbac --config portcullis.yaml [--name portcullis-context] [--service-account portcullis] [--namespace portcullis]';

export default async function rbac(args: string[]): Promise<number> {
  let values;
  try {
    ({ values } = parseArgs({
      args,
      options: {
        config: { type: 'string', short: 'c' }, name: { type: 'string', default: 'portcullis-context' },
        'service-account': { type: 'string', default: 'portcullis' }, namespace: { type: 'string' },
      },
    }));
  } catch (error) {
    throw new UsageError(`${errorMessage(error)}\n${USAGE}`);
  }
  if (!values.config) throw new UsageError(`--config is required: the RBAC follows from its policies' context grants\n${USAGE}`);
  const config = await loadConfigFile(values.config);
  // The host's own namespace, where its ServiceAccount lives, unless told otherwise.
  const namespace = values.namespace ?? config.webhooks.namespace ?? 'portcullis';
  process.stdout.write(contextRbacYaml(kindsToCache(config), { name: values.name, serviceAccount: values['service-account'], namespace }, values.config));
  // This is where a newcomer looks for the RBAC the host needs (red team: managed webhooks, and
  // an empty role with nothing said). Said on stderr: stdout is the file to apply.
  const { managed } = config.webhooks;
  if (managed) {
    process.stderr.write('portcullis rbac: this covers context reads only. webhooks.managed is set, so the host also needs the rights in deploy/10-rbac.yaml: ' +
      `create, and get/patch/delete on the validating and mutating webhook configurations named ${managed}` +
      `${config.webhooks.leaderElection ? `; create, and get/update on the Lease ${managed} in namespace ${namespace}` : ''}` +
      `${config.server.tls.mode === 'secret' ? `; get/update on the certificate Secret in namespace ${namespace} (tls.mode secret)` : ''}.\n`);
  }
  return 0;
}
