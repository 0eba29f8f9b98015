// Prints the ClusterRole (and binding) that the context caches of a configuration need:
//   npx node scripts/context-rbac.ts --config portcullis.yaml [--name portcullis-context]
//     [--service-account portcullis] [--namespace portcullis] > deploy-overlays/context/rbac-context.yaml
import { parseArgs } from 'node:util';
import { loadConfigFile } from '../host/src/config/load.ts';
import { kindsToCache } from '../host/src/context/needs.ts';
import { contextRbacYaml } from '../host/src/context/rbac.ts';

const { values } = parseArgs({
  options: {
    config: { type: 'string' }, name: { type: 'string', default: 'portcullis-context' },
    'service-account': { type: 'string', default: 'portcullis' }, namespace: { type: 'string', default: 'portcullis' },
  },
});
if (!values.config) {
  process.stderr.write('usage: node scripts/context-rbac.ts --config FILE [--name N] [--service-account SA] [--namespace NS]\n');
  process.exit(2);
}
const config = await loadConfigFile(values.config);
process.stdout.write(contextRbacYaml(kindsToCache(config), { name: values.name, serviceAccount: values['service-account'], namespace: values.namespace }, values.config));
