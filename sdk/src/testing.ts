// Test a built policy in a few lines, with the same sandbox the host uses:
//
//   const policy = await testPolicy('policies/numbers/numbers.wasm');
//   const result = await policy.validate(request({ object: { spec: { numbers: [500] } } }));
//   expect(result).toMatchObject({ allowed: false, code: 499 });
//   await policy.close();
import type * as HostModule from '@portcullis/host';
import type { AdmissionRequest, EvaluationInput, JsonObject, JsonValue, Mode, PatchOperation, PeerCertificate } from './contract.ts';
import { applyOperation } from './patch.ts';

export interface TestOptions {
  settings?: JsonValue;
  /**
   * Cluster objects the policy can read with get/list, as if from the host's cache (a parsed
   * YAML list). Without `grants`, every kind present here is granted.
   */
  context?: JsonObject[];
  /** The policy's context grants; give them to test what an ungranted read does. */
  grants?: { apiVersion: string; kind: string }[];
  timeoutMs?: number;
  memoryMiB?: number;
}

export interface CallOptions {
  headers?: Record<string, string>;
  sslpeer?: PeerCertificate | null;
  dryRun?: boolean;
}

export interface TestResult {
  allowed: boolean;
  status: 'allowed' | 'denied' | 'failed';
  code?: number;
  message?: string;
  /** For failures: permanent, temporary or crash. */
  failure?: string;
  warnings: string[];
  patch: PatchOperation[];
  /** request.object with the patch applied (mutate). */
  patched?: JsonValue;
  /** What the policy logged during the call (ctx.log, console), in order. */
  logs: { level: string; message: string }[];
}

export interface TestPolicy {
  modes: Mode[];
  validate(request: AdmissionRequest, options?: CallOptions): Promise<TestResult>;
  mutate(request: AdmissionRequest, options?: CallOptions): Promise<TestResult>;
  close(): Promise<void>;
}

type HostApi = typeof HostModule;

export async function testPolicy(path: string, options: TestOptions = {}): Promise<TestPolicy> {
  // An optional peer: installed alone, the SDK builds nothing that needs it but this (newcomer:
  // "Cannot find package '@portcullis/host'" said nothing of what to do).
  const host: HostApi = await import('@portcullis/host').catch((error: unknown) => {
    if ((error as { code?: unknown }).code !== 'ERR_MODULE_NOT_FOUND') throw error;
    throw new Error('testPolicy runs the policy in the host\'s sandbox: install @portcullis/host beside @portcullis/sdk (its tarball, as the tutorial does)', { cause: error });
  });
  const pool = new host.SandboxPool(1);
  const grants = options.grants ?? (options.context ? kindsOf(options.context) : []);
  if (options.context || options.grants) {
    const hub = new host.ContextHub();
    host.loadOffline(hub, options.context ?? [], grants);
    hub.attach(pool);
  }
  // As the host's policyNameOf: the file's name, or an oci:// repository's.
  const last = path.replace(/^.*[\\/]/, '');
  const name = path.startsWith('oci://') ? last.replace(/[@:].*$/, '') : last.replace(/\.wasm$/, '');
  const limits = {
    ...host.DEFAULT_LIMITS, ...(options.timeoutMs ? { timeoutMs: options.timeoutMs } : {}), ...(options.memoryMiB ? { memoryMiB: options.memoryMiB } : {}),
  };
  let policy;
  try {
    policy = await host.loadPolicy(pool, {
      name, module: path, settings: options.settings ?? {}, limits, failurePolicy: 'Fail', enforcement: 'enforce', isolation: 'reuse', context: grants,
    });
  } catch (error) {
    await pool.close();
    throw error;
  }
  const call = async (mode: Mode, request: AdmissionRequest, call: CallOptions = {}): Promise<TestResult> => {
    const input: EvaluationInput = {
      request, settings: options.settings ?? {}, headers: call.headers ?? {}, sslpeer: call.sslpeer ?? null,
      dryRun: call.dryRun ?? request.dryRun === true, webhook: `/${mode}/${name}`,
    };
    const outcome = await host.evaluatePolicy(pool, policy, mode, input);
    const logs = (outcome.logs ?? []).map(([level, message]) => ({ level, message }));
    const result: TestResult = { allowed: outcome.status === 'allowed', status: outcome.status, warnings: outcome.warnings, patch: [], logs };
    if (outcome.status === 'denied') Object.assign(result, { code: outcome.code, message: outcome.message });
    if (outcome.status === 'failed') Object.assign(result, { failure: outcome.failure, message: outcome.message });
    if (outcome.status === 'allowed') {
      result.patch = outcome.patch;
      let doc: JsonValue | undefined = request.object ? structuredClone(request.object) : undefined;
      for (const op of outcome.patch) doc = applyOperation(doc, op);
      if (doc !== undefined) result.patched = doc;
    }
    return result;
  };
  return {
    modes: policy.modes,
    validate: (request, o) => call('validate', request, o),
    mutate: (request, o) => call('mutate', request, o),
    close: () => pool.close(),
  };
}

function kindsOf(objects: JsonObject[]): { apiVersion: string; kind: string }[] {
  const kinds = new Map<string, { apiVersion: string; kind: string }>();
  for (const o of objects) {
    const grant = { apiVersion: typeof o.apiVersion === 'string' ? o.apiVersion : '', kind: typeof o.kind === 'string' ? o.kind : '' };
    kinds.set(`${grant.apiVersion} ${grant.kind}`, grant);
  }
  return [...kinds.values()];
}

/** An AdmissionRequest with sensible defaults (a Pod CREATE in "default"); override any field. */
export function request(overrides: Partial<AdmissionRequest> & { object?: JsonObject | null } = {}): AdmissionRequest {
  return {
    uid: 'test-0000-0000-0000-000000000001',
    kind: { group: '', version: 'v1', kind: 'Pod' },
    resource: { group: '', version: 'v1', resource: 'pods' },
    name: 'test',
    namespace: 'default',
    operation: 'CREATE',
    userInfo: { username: 'tester', groups: ['system:authenticated'] },
    object: null,
    oldObject: null,
    dryRun: false,
    ...overrides,
  };
}
