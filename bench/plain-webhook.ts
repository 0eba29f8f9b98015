// What a user writes without Portcullis: the checks of the example policies as plain code in
// a Node HTTPS handler. /validate runs the same ten checks as the MIXED_10 set (bench/
// policies.ts), /mutate the same five mutations as MUTATE_5, so answers match Portcullis's.
import { serve } from './bare-server.ts';

type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
type Obj = { [key: string]: Json };
interface Request {
  uid: string;
  operation: string;
  name?: string;
  object?: Obj | null;
  oldObject?: Obj | null;
}
interface PatchOp { op: 'add' | 'replace'; path: string; value: Json }
class Deny extends Error {
  readonly code: number;
  constructor(message: string, code = 403) {
    super(message);
    this.code = code;
  }
}

const isObj = (v: Json | undefined): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);
const labelsOf = (o: Obj | null | undefined): Obj => (isObj(o?.metadata) && isObj(o.metadata.labels) ? o.metadata.labels : {});
const escape = (key: string) => key.replace(/~/g, '~0').replace(/\//g, '~1');

function asNumber(value: Json): number | undefined {
  if (typeof value === 'number') return Number.isFinite(value) ? value : undefined;
  if (typeof value === 'string' && value.trim() !== '') {
    const n = Number(value);
    return Number.isFinite(n) ? n : undefined;
  }
  return undefined;
}

// --- validation: no-delete, numbers, require-labels, show-auth ---

function noDelete(req: Request): void {
  if (req.operation !== 'DELETE') return;
  if (labelsOf(req.oldObject)['portcullis.dev/no-delete'] === 'true') throw new Deny(`${req.name ?? ''} is protected by the label portcullis.dev/no-delete="true"`);
}

function numbers(req: Request, warnings: Set<string>): void {
  const spec = req.object?.spec;
  if (!isObj(spec) || spec.numbers === undefined) return;
  if (!Array.isArray(spec.numbers)) throw new Deny('spec.numbers must be a list.', 499);
  spec.numbers.forEach((value, index) => {
    const n = asNumber(value);
    if (n === undefined) throw new Deny(`spec.numbers[${index}] is not a number: ${JSON.stringify(value)}.`, 499);
    if (typeof value === 'string') warnings.add(`spec.numbers[${index}] is a string (${JSON.stringify(value)}); it should be a number.`);
    if (n < 0 || n > 100) throw new Deny('Numbers must be within 0..100.', 499);
  });
}

function requireLabels(req: Request, required: Record<string, string>): string[] {
  if (!req.object) return [];
  const present = labelsOf(req.object);
  return Object.keys(required).filter((name) => typeof present[name] !== 'string');
}

function showAuth(headers: Record<string, string | string[] | undefined>, warnings: Set<string>): void {
  warnings.add('TLS peer: none (no verified client certificate)');
  warnings.add(`Authorization header: ${'authorization' in headers ? 'present' : 'absent'}`);
}

const TEAM = { team: 'unowned' };
const VALIDATE_CHECKS: ((req: Request, warnings: Set<string>) => void)[] = [
  noDelete, numbers, (r) => deny(requireLabels(r, TEAM)), (_r, w) => showAuth({}, w), noDelete, numbers,
  noDelete, (r) => deny(requireLabels(r, TEAM)), (_r, w) => showAuth({}, w), noDelete,
];

function deny(missing: string[]): void {
  if (missing.length > 0) throw new Deny(`missing required label${missing.length > 1 ? 's' : ''}: ${missing.join(', ')}`);
}

// --- mutation: added-by, resources-oversell, require-labels (x2), numbers ---

const BINARY: Record<string, number> = { Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40 };
const DECIMAL: Record<string, number> = { m: 1e-3, '': 1, k: 1e3, M: 1e6, G: 1e9, T: 1e12 };

function scale(quantity: string | number, factor: number): string {
  const match = /^([0-9.]+)(Ki|Mi|Gi|Ti|m|k|M|G|T)?$/.exec(String(quantity).trim());
  if (!match) throw new Error(`"${quantity}" is not a quantity`);
  const suffix = match[2] ?? '';
  if (suffix in BINARY) {
    const bytes = Math.round(Number(match[1]) * BINARY[suffix]! * factor);
    for (const s of ['Ti', 'Gi', 'Mi', 'Ki']) if (bytes >= BINARY[s]! && bytes % BINARY[s]! === 0) return `${bytes / BINARY[s]!}${s}`;
    return String(bytes);
  }
  const millis = Math.round(Number(match[1]) * DECIMAL[suffix]! * factor * 1000);
  return millis % 1000 === 0 ? String(millis / 1000) : `${millis}m`;
}

function mutate(req: Request): PatchOp[] {
  const object = req.object;
  if (!object) return [];
  const ops: PatchOp[] = [];
  const metadata = isObj(object.metadata) ? object.metadata : {};
  // added-by
  ops.push(isObj(metadata.annotations)
    ? { op: 'add', path: '/metadata/annotations/portcullis.dev~1added-by', value: 'portcullis' }
    : { op: 'add', path: '/metadata/annotations', value: { 'portcullis.dev/added-by': 'portcullis' } });
  // resources-oversell
  const spec = object.spec;
  if (isObj(spec)) {
    for (const list of ['initContainers', 'containers']) {
      const containers = spec[list];
      if (!Array.isArray(containers)) continue;
      containers.forEach((container, index) => {
        if (!isObj(container) || !isObj(container.resources) || !isObj(container.resources.limits)) return;
        const { limits, requests } = container.resources;
        const base = `/spec/${list}/${index}/resources/requests`;
        const wanted: Obj = {};
        for (const [resource, factor] of [['cpu', 0.5], ['memory', 0.5]] as const) {
          const limit = limits[resource];
          if (typeof limit === 'string' || typeof limit === 'number') wanted[resource] = scale(limit, factor);
        }
        if (!isObj(requests)) ops.push({ op: 'add', path: base, value: wanted });
        else for (const [resource, value] of Object.entries(wanted)) ops.push({ op: requests[resource] === undefined ? 'add' : 'replace', path: `${base}/${resource}`, value });
      });
    }
  }
  // require-labels (team: unowned), require-env-label (env: production)
  const labels = labelsOf(object);
  for (const [name, value] of Object.entries({ ...TEAM, env: 'production' })) {
    if (typeof labels[name] !== 'string') ops.push({ op: 'add', path: `/metadata/labels/${escape(name)}`, value });
  }
  // numbers
  if (isObj(spec)) {
    if (spec.numbers === undefined) ops.push({ op: 'add', path: '/spec/numbers', value: [1, 2, 3] });
    else if (Array.isArray(spec.numbers)) {
      spec.numbers.forEach((value, index) => {
        const n = asNumber(value);
        if (typeof value === 'string' && n !== undefined) ops.push({ op: 'replace', path: `/spec/numbers/${index}`, value: n });
      });
    }
  }
  return ops;
}

await serve((path, body) => {
  const review = JSON.parse(body) as { apiVersion: string; request: Request };
  const req = review.request;
  const response: Obj = { uid: req.uid, allowed: true };
  if (path.startsWith('/mutate')) {
    const ops = mutate(req);
    if (ops.length > 0) Object.assign(response, { patchType: 'JSONPatch', patch: Buffer.from(JSON.stringify(ops)).toString('base64') });
  } else {
    const warnings = new Set<string>();
    try {
      for (const check of VALIDATE_CHECKS) check(req, warnings);
    } catch (error) {
      if (!(error instanceof Deny)) throw error;
      Object.assign(response, { allowed: false, status: { code: error.code, message: error.message } });
    }
    if (warnings.size > 0) response.warnings = [...warnings];
  }
  return { apiVersion: review.apiVersion, kind: 'AdmissionReview', response };
});
