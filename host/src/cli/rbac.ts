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
        'service-account': { type: 'string', default: 'portcullis' }, namespace: { type: 'string', default: 'portcullis' },
      },
    }));
  } catch (error) {
    throw new UsageError(`${errorMessage(error)}\n${USAGE}`);
  }
  if (!values.config) throw new UsageError(`--config is required: the RBAC follows from its policies' context grants\n${USAGE}`);
  const config = await loadConfigFile(values.config);
  process.stdout.write(contextRbacYaml(kindsToCache(config), { name: values.name, serviceAccount: values['service-account'], namespace: values.namespace }, values.config));
  return 0;
}
