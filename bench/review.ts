// The review every benchmark sends: a CREATE of a Deployment-made Pod as the apiserver would
// post it (AdmissionReview v1, ~5 KB of JSON). Two containers with limits (so the oversell
// policy patches requests), a `team` label (so require-labels allows), no `spec.numbers`.
import type { JsonObject } from '@portcullis/sdk';

export const TARGET_BYTES = 5 * 1024;

export function podReview(uid = '705ab4f5-6393-11e8-b7cc-42010a800002'): JsonObject {
  const labels = { app: 'checkout', team: 'payments', tier: 'backend', 'pod-template-hash': '7d9f8c6b5d', 'app.kubernetes.io/version': '2.14.1' };
  const container = (name: string, image: string, cpu: string, memory: string, port: number) => ({
    name, image, imagePullPolicy: 'IfNotPresent',
    args: ['--listen=:' + port, '--log-format=json', '--metrics-addr=:9090', '--shutdown-grace=20s'],
    ports: [{ name: 'http', containerPort: port, protocol: 'TCP' }, { name: 'metrics', containerPort: 9090, protocol: 'TCP' }],
    env: [
      { name: 'POD_NAME', valueFrom: { fieldRef: { apiVersion: 'v1', fieldPath: 'metadata.name' } } },
      { name: 'POD_NAMESPACE', valueFrom: { fieldRef: { apiVersion: 'v1', fieldPath: 'metadata.namespace' } } },
      { name: 'DATABASE_URL', valueFrom: { secretKeyRef: { name: 'checkout-db', key: 'url' } } },
    ],
    resources: { limits: { cpu, memory }, requests: {} },
    readinessProbe: { httpGet: { path: '/readyz', port, scheme: 'HTTP' }, periodSeconds: 5, timeoutSeconds: 1, successThreshold: 1, failureThreshold: 3 },
    volumeMounts: [
      { name: 'config', mountPath: '/etc/checkout', readOnly: true },
      { name: 'kube-api-access-x7k2p', mountPath: '/var/run/secrets/kubernetes.io/serviceaccount', readOnly: true },
    ],
    securityContext: { allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, runAsNonRoot: true, capabilities: { drop: ['ALL'] } },
  });
  const pod = {
    apiVersion: 'v1', kind: 'Pod',
    metadata: {
      generateName: 'checkout-7d9f8c6b5d-', namespace: 'shop', creationTimestamp: null, labels,
      annotations: { 'kubectl.kubernetes.io/restartedAt': '2026-11-20T09:12:44Z', 'prometheus.io/scrape': 'true', 'prometheus.io/port': '9090' },
      ownerReferences: [{ apiVersion: 'apps/v1', kind: 'ReplicaSet', name: 'checkout-7d9f8c6b5d', uid: '0f5c9a36-1c1e-4b8e-9a55-3f8d0f0f6c11', controller: true, blockOwnerDeletion: true }],
      managedFields: [{ manager: 'kube-controller-manager', operation: 'Update', apiVersion: 'v1', time: '2026-11-20T09:12:45Z', fieldsType: 'FieldsV1', fieldsV1: { 'f:metadata': { 'f:generateName': {}, 'f:labels': { '.': {}, 'f:app': {}, 'f:team': {}, 'f:tier': {} }, 'f:ownerReferences': { '.': {} } }, 'f:spec': { 'f:containers': {}, 'f:volumes': {} } } }],
    },
    spec: {
      containers: [container('checkout', 'registry.example.com/shop/checkout:2.14.1', '1', '1Gi', 8080), container('envoy', 'envoyproxy/envoy:v1.31.2', '500m', '256Mi', 15001)],
      volumes: [
        { name: 'config', configMap: { name: 'checkout-config', defaultMode: 420 } },
        { name: 'kube-api-access-x7k2p', projected: { defaultMode: 420, sources: [{ serviceAccountToken: { expirationSeconds: 3607, path: 'token' } }, { configMap: { name: 'kube-root-ca.crt', items: [{ key: 'ca.crt', path: 'ca.crt' }] } }] } },
      ],
      restartPolicy: 'Always', terminationGracePeriodSeconds: 30, dnsPolicy: 'ClusterFirst', serviceAccountName: 'checkout',
      securityContext: { runAsUser: 10001, fsGroup: 10001, seccompProfile: { type: 'RuntimeDefault' } },
      affinity: { podAntiAffinity: { preferredDuringSchedulingIgnoredDuringExecution: [{ weight: 100, podAffinityTerm: { topologyKey: 'kubernetes.io/hostname', labelSelector: { matchLabels: { app: 'checkout' } } } }] } },
      tolerations: [
        { key: 'node.kubernetes.io/not-ready', operator: 'Exists', effect: 'NoExecute', tolerationSeconds: 300 },
        { key: 'node.kubernetes.io/unreachable', operator: 'Exists', effect: 'NoExecute', tolerationSeconds: 300 },
      ],
      priority: 0, enableServiceLinks: true, preemptionPolicy: 'PreemptLowerPriority',
    },
    status: {},
  };
  const review = {
    kind: 'AdmissionReview', apiVersion: 'admission.k8s.io/v1',
    request: {
      uid,
      kind: { group: '', version: 'v1', kind: 'Pod' },
      resource: { group: '', version: 'v1', resource: 'pods' },
      requestKind: { group: '', version: 'v1', kind: 'Pod' },
      requestResource: { group: '', version: 'v1', resource: 'pods' },
      namespace: 'shop', operation: 'CREATE',
      userInfo: { username: 'system:serviceaccount:kube-system:replicaset-controller', uid: '6f1d2c8e-0d7e-4b0c-a1f2-9c3b5e7a1d20', groups: ['system:serviceaccounts', 'system:serviceaccounts:kube-system', 'system:authenticated'] },
      object: pod, oldObject: null, dryRun: false,
      options: { kind: 'CreateOptions', apiVersion: 'meta.k8s.io/v1' },
    },
  };
  // Pad with an annotation so the body lands on TARGET_BYTES whatever the fields above add up to.
  const size = JSON.stringify(review).length;
  const pad = TARGET_BYTES - size - '"example.com/notes":"",'.length;
  if (pad > 0) (pod.metadata.annotations as Record<string, string>)['example.com/notes'] = 'x'.repeat(pad);
  return review as unknown as JsonObject;
}

/** The request body, as sent. */
export function reviewBody(): string {
  return JSON.stringify(podReview());
}

if (import.meta.main) process.stdout.write(`${JSON.stringify(podReview(), null, 2)}\n`);
