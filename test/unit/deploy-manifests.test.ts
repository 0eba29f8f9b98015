// Static checks of deploy/ and deploy-overlays/ that an apiserver would not make: the
// configurations parse with the host's own loader, names in RBAC match the configuration, and
// the pod meets the Pod Security "restricted" level. The e2e test (deploy-in-cluster) applies them.
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { parseAllDocuments } from 'yaml';
import { parseConfig } from '../../host/src/config/load.ts';
import { root } from '../helpers/policies.ts';

type Obj = { apiVersion: string; kind: string; metadata: { name: string; namespace?: string; labels?: Record<string, string> }; [k: string]: unknown };

const deployDir = join(root, 'deploy');
const files = readdirSync(deployDir).filter((f) => f.endsWith('.yaml')).sort();
const objects: Obj[] = files.flatMap((f) => parseAllDocuments(readFileSync(join(deployDir, f), 'utf8')).map((d) => d.toJSON() as Obj).filter(Boolean));
const find = (kind: string, name?: string) => objects.find((o) => o.kind === kind && (!name || o.metadata.name === name));
const configText = (find('ConfigMap', 'portcullis-config') as unknown as { data: Record<string, string> }).data['portcullis.yaml']!;

describe('deploy/', () => {
  it('applies in name order with the Namespace first, and the Kustomization lists every file', () => {
    expect(files[0]).toBe('00-namespace.yaml');
    expect(objects[0]!.kind).toBe('Namespace');
    for (const o of objects.slice(1)) if (o.kind !== 'ClusterRole' && o.kind !== 'ClusterRoleBinding') expect(o.metadata.namespace, `${o.kind}/${o.metadata.name}`).toBe('portcullis');
    const kustomization = parseAllDocuments(readFileSync(join(deployDir, 'Kustomization'), 'utf8'))[0]!.toJSON() as { resources: string[] };
    expect(kustomization.resources).toEqual(files);
  });

  it('its configuration (and the overlays\') load with the host\'s own parser', () => {
    const config = parseConfig(configText, 'deploy/20-configmap.yaml');
    expect(config.server.tls).toMatchObject({ mode: 'secret', secretName: 'portcullis-tls' });
    expect(config.server.metricsPort).toBe(9090);
    expect(config.server.readyWhenAllPoliciesLoaded).toBe(true);
    expect(config.webhooks).toMatchObject({ managed: 'portcullis.dev', service: { name: 'portcullis', namespace: 'portcullis', port: 443 } });
    const cm = parseConfig(readFileSync(join(root, 'deploy-overlays/cert-manager/portcullis.yaml'), 'utf8'), 'cert-manager');
    expect(cm.server.tls).toMatchObject({ mode: 'files', caFile: '/etc/portcullis/tls/ca.crt' });
    const single = parseConfig(readFileSync(join(root, 'deploy-overlays/single-webhook/portcullis.yaml'), 'utf8'), 'single-webhook');
    expect(single.webhooks.singleWebhook).toBe(true);
    // The overlays are copies of the base configuration with one change each: keep them in step.
    expect({ ...cm, server: { ...cm.server, tls: config.server.tls }, source: config.source }).toEqual(config);
    expect({ ...single, webhooks: { ...single.webhooks, singleWebhook: false }, source: config.source }).toEqual(config);
  });

  it('no example policy fails closed, and no-delete is sent only the objects it protects', () => {
    // While no replica answers (both down, a rollout gone wrong), a Fail webhook refuses what it
    // covers in every namespace: Pods, and ConfigMaps including a new namespace's kube-root-ca.crt
    // (review helper). The examples are Ignore, in the base and in every overlay's copy.
    for (const [name, text] of [['deploy', configText], ['single-webhook', readFileSync(join(root, 'deploy-overlays/single-webhook/portcullis.yaml'), 'utf8')], ['cert-manager', readFileSync(join(root, 'deploy-overlays/cert-manager/portcullis.yaml'), 'utf8')]] as const) {
      const config = parseConfig(text, name);
      for (const policy of config.policies) expect(policy.failurePolicy, `${name}: ${policy.name}`).toBe('Ignore');
      const noDelete = config.policies.find((p) => p.name === 'no-delete');
      expect(noDelete?.objectSelector, name).toEqual({ matchLabels: { 'portcullis.dev/no-delete': 'true' } });
    }
  });

  it('RBAC names exactly the Secret, Lease and webhook configurations the configuration uses', () => {
    const config = parseConfig(configText, 'deploy/20-configmap.yaml');
    const role = find('Role', 'portcullis') as unknown as { rules: { resources: string[]; verbs: string[]; resourceNames?: string[] }[] };
    const secrets = role.rules.filter((r) => r.resources.includes('secrets'));
    expect(secrets).toEqual([{ apiGroups: [''], resources: ['secrets'], resourceNames: [config.server.tls.mode === 'secret' ? config.server.tls.secretName : ''], verbs: ['get', 'update'] }]);
    expect(role.rules.find((r) => r.resources.includes('leases') && r.resourceNames)?.resourceNames).toEqual([config.webhooks.managed]);
    const cluster = find('ClusterRole', 'portcullis-webhooks') as unknown as { rules: { verbs: string[]; resourceNames?: string[] }[] };
    expect(cluster.rules.find((r) => r.resourceNames)?.resourceNames).toEqual([config.webhooks.managed]);
    for (const r of [...role.rules, ...cluster.rules]) expect(r.verbs).not.toContain('list');
    expect(find('Secret', 'portcullis-tls')).toBeDefined();
  });

  it('the Deployment meets Pod Security "restricted" and has what an operator expects', () => {
    const deployment = find('Deployment', 'portcullis') as unknown as { spec: { replicas: number; strategy: unknown; template: { spec: Record<string, any> } } }; // eslint-disable-line @typescript-eslint/no-explicit-any
    const pod = deployment.spec.template.spec;
    const container = pod.containers[0];
    expect(deployment.spec.replicas).toBe(2);
    // The type written out: else kubectl apply sends $retainKeys and says "configured" on every re-apply (newcomer).
    expect(deployment.spec.strategy).toEqual({ type: 'RollingUpdate', rollingUpdate: { maxUnavailable: 0, maxSurge: 1 } });
    expect(pod.securityContext).toMatchObject({ runAsNonRoot: true, seccompProfile: { type: 'RuntimeDefault' } });
    expect(container.securityContext).toMatchObject({ allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: { drop: ['ALL'] } });
    expect(pod.hostNetwork ?? false).toBe(false);
    expect(pod.volumes.every((v: Record<string, unknown>) => v.configMap || v.emptyDir || v.secret)).toBe(true);
    expect(container.image).toMatch(/:\d+\.\d+\.\d+$/);
    expect(container.imagePullPolicy).toBe('IfNotPresent');
    for (const probe of ['startupProbe', 'readinessProbe', 'livenessProbe']) expect(container[probe]?.httpGet?.port, probe).toBe('metrics');
    expect(container.ports).toContainEqual({ name: 'metrics', containerPort: 9090 });
    expect(container.resources.requests).toBeDefined();
    expect(container.resources.limits.memory).toBeDefined();
    expect(pod.topologySpreadConstraints.map((c: { topologyKey: string }) => c.topologyKey)).toContain('kubernetes.io/hostname');
    expect(find('PodDisruptionBudget', 'portcullis')).toMatchObject({ spec: { minAvailable: 1 } });
    expect(find('Namespace', 'portcullis')!.metadata.labels).toMatchObject({ 'pod-security.kubernetes.io/enforce': 'restricted' });
  });
});
