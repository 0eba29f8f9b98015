// Builds an AdmissionRequest the way the apiserver would send it, from a plain manifest and a
// few facts (operation, old object, namespace, user), so authors can test with the YAML they
// already have. Shared by `portcullis run` and `portcullis test`; errors are plain sentences
// that the caller prefixes with where the input came from.
import type { AdmissionRequest, JsonObject, Operation } from '@portcullis/sdk';
import { parseReview } from '../review/parse.ts';
import { errorMessage, PortcullisError } from '../errors.ts';

const OPERATIONS = new Set(['CREATE', 'UPDATE', 'DELETE', 'CONNECT']);

export class RequestInputError extends PortcullisError {
  constructor(message: string) {
    super('BAD_REQUEST_INPUT', message);
  }
}

export interface RequestFacts {
  object?: unknown;
  oldObject?: unknown;
  /** Default: CREATE; UPDATE when both objects are given; DELETE when only the old one is. */
  operation?: unknown;
  namespace?: unknown;
  user?: unknown;
  groups?: unknown;
  dryRun?: unknown;
}

/** A whole AdmissionRequest, or an AdmissionReview around one, checked as the server checks it. */
export function wholeRequest(value: unknown): AdmissionRequest {
  const review = isObject(value) && value.kind === 'AdmissionReview' ? value : { apiVersion: 'admission.k8s.io/v1', kind: 'AdmissionReview', request: value };
  try {
    return parseReview(review).request;
  } catch (error) {
    throw new RequestInputError(errorMessage(error));
  }
}

/** True when the value looks like an AdmissionRequest rather than a manifest. */
export function isAdmissionRequest(value: unknown): boolean {
  return isObject(value) && typeof value.uid === 'string' && typeof value.operation === 'string' && isObject(value.kind);
}

export function requestFor(facts: RequestFacts, uid: string): AdmissionRequest {
  let object = optionalObject(facts.object, 'the object');
  let oldObject = optionalObject(facts.oldObject, 'the old object');
  const operation = facts.operation ?? (object === undefined && oldObject !== undefined ? 'DELETE' : oldObject ? 'UPDATE' : 'CREATE');
  if (typeof operation !== 'string' || !OPERATIONS.has(operation)) throw new RequestInputError('operation must be CREATE, UPDATE, DELETE or CONNECT');
  // Only the shapes the apiserver sends (outside author: a suite's DELETE kept `object` and
  // passed a denial that the real request, with `object: null`, never gets).
  if (operation === 'DELETE' && object !== undefined) {
    if (oldObject !== undefined) throw new RequestInputError('a DELETE has no object, only the old object: give one of them (the object being deleted)');
    [object, oldObject] = [undefined, object];
  }
  if (operation === 'UPDATE' && oldObject === undefined) throw new RequestInputError('an UPDATE needs oldObject: the object as it was before the update');
  const subject = object ?? oldObject;
  if (!subject) throw new RequestInputError('give an object (a manifest), an old object (for DELETE) or a whole AdmissionRequest');
  if (typeof subject.apiVersion !== 'string' || typeof subject.kind !== 'string') throw new RequestInputError('the object needs apiVersion and kind');
  const [group, version] = subject.apiVersion.includes('/') ? (subject.apiVersion.split('/', 2) as [string, string]) : ['', subject.apiVersion];
  const metadata = isObject(subject.metadata) ? subject.metadata : {};
  const namespace = typeof facts.namespace === 'string' ? facts.namespace : typeof metadata.namespace === 'string' ? metadata.namespace : undefined;
  const groups = facts.groups ?? ['system:authenticated'];
  if (!Array.isArray(groups) || !groups.every((g) => typeof g === 'string')) throw new RequestInputError('groups must be a list of strings');
  return {
    uid,
    kind: { group, version, kind: subject.kind },
    resource: { group, version, resource: plural(subject.kind) },
    name: typeof metadata.name === 'string' ? metadata.name : '',
    ...(namespace !== undefined ? { namespace } : {}),
    operation: operation as Operation,
    userInfo: { username: typeof facts.user === 'string' ? facts.user : 'portcullis-test', groups: groups },
    object: object ?? null,
    oldObject: oldObject ?? null,
    dryRun: facts.dryRun === true,
  };
}

function optionalObject(value: unknown, what: string): JsonObject | undefined {
  if (value === undefined || value === null) return undefined;
  if (!isObject(value)) throw new RequestInputError(`${what} must be a mapping (a Kubernetes manifest)`);
  return value as JsonObject;
}

/** The resource name the apiserver uses for the common kinds; a whole request can say it exactly. */
function plural(kind: string): string {
  const lower = kind.toLowerCase();
  if (/(s|x|z|ch|sh)$/.test(lower)) return `${lower}es`;
  if (/[^aeiou]y$/.test(lower)) return `${lower.slice(0, -1)}ies`;
  return `${lower}s`;
}

export function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}
