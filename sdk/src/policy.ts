import type {
  AdmissionRequest, EvaluationOutput, JsonObject, JsonValue, Mode, Operation,
  PeerCertificate, PolicyMetadata, SettingsVerdict,
} from './contract.ts';
import { readInput } from './input.ts';
import { AdmissionError, PermanentError, TemporaryError } from './errors.ts';
import { Patch } from './patch.ts';

export type LogLevel = 'debug' | 'info' | 'warn' | 'error';
type LogSink = (level: LogLevel, message: string) => void;

let logSink: LogSink = () => {};

/** Called by the generated component entry to connect `ctx.log` to the host. Not for policies. */
export function bindHostLog(sink: LogSink): void {
  logSink = sink;
}

/** The host log, whichever sink is bound when it is called (the sandbox's `console` writes here). */
export function hostLog(level: LogLevel, message: string): void {
  logSink(level, message);
}

export interface Context<S = JsonValue> {
  request: AdmissionRequest;
  operation: Operation;
  /** `request.object`, or null (DELETE and CONNECT). */
  object: JsonObject | null;
  /** `request.oldObject`, or null (CREATE and CONNECT). */
  oldObject: JsonObject | null;
  settings: S;
  headers: Readonly<Record<string, string>>;
  sslpeer: PeerCertificate | null;
  dryRun: boolean;
  webhook: string;
  /** Push messages here; the user sees them as `Warning:` lines, also when the request is denied. */
  warnings: string[];
  /** To the host's log, naming the policy and the request (as `console.*` does). A property, so it can be destructured. */
  log: (level: LogLevel, message: string) => void;
}

export interface MutationContext<S = JsonValue> extends Context<S> {
  patch: Patch;
}

export interface PolicyDefinition<S = JsonValue> {
  /**
   * Check the policy's settings once, when the host loads it. Return (or throw) a message to
   * refuse them; the host then refuses to load this policy and says why.
   */
  validateSettings?(settings: S): string | void | undefined;
  /**
   * Return nothing to allow; throw AdmissionError to deny. Synchronous: an `async` handler (or
   * one that returns anything, such as `false`) fails the evaluation, since a denial thrown
   * after it returned would be lost.
   */
  validate?(ctx: Context<S>): undefined;
  /** Record changes on ctx.patch; throw AdmissionError to deny. Synchronous, like validate. */
  mutate?(ctx: MutationContext<S>): undefined;
}

/** The functions a policy component exports (portcullis:policy/policy in wit/policy.wit). */
export interface PolicyExports {
  metadata(): string;
  validateSettings(input: string): string;
  validate(input: string): string;
  mutate(input: string): string;
}

/** Turns your handlers into the exports of a policy component. `export default definePolicy({...})`. */
export function definePolicy<S = JsonValue>(definition: PolicyDefinition<S>): PolicyExports {
  const metadata: PolicyMetadata = {
    modes: (['validate', 'mutate'] as const).filter((m) => typeof definition[m] === 'function'),
    settings: typeof definition.validateSettings === 'function',
    input: ['objects-apart', 'nested-apart'],
  };
  return {
    metadata: () => JSON.stringify(metadata),
    validateSettings: (input) => JSON.stringify(checkSettings(definition, input)),
    validate: (input) => JSON.stringify(evaluate(definition, 'validate', input)),
    mutate: (input) => JSON.stringify(evaluate(definition, 'mutate', input)),
  };
}

function checkSettings<S>(definition: PolicyDefinition<S>, input: string): SettingsVerdict {
  if (!definition.validateSettings) return { valid: true };
  try {
    const { settings } = JSON.parse(input) as { settings: S };
    const message = definition.validateSettings(settings);
    return typeof message === 'string' ? { valid: false, message } : { valid: true };
  } catch (error) {
    return { valid: false, message: describe(error) };
  }
}

export function evaluate<S>(definition: PolicyDefinition<S>, mode: Mode, input: string): EvaluationOutput {
  const warnings: string[] = [];
  try {
    const envelope = readInput(input);
    const request = envelope.request;
    // object and oldObject stay getters here too: a handler that never reads them never has
    // them parsed (see readInput).
    const fields: Omit<Context<S>, keyof Objects> = {
      request,
      operation: request.operation,
      settings: (envelope.settings ?? {}) as S,
      headers: envelope.headers ?? {},
      sslpeer: envelope.sslpeer ?? null,
      dryRun: envelope.dryRun === true,
      webhook: envelope.webhook ?? '',
      warnings,
      log: (level, message) => logSink(level, message),
    };
    const ctx: Context<S> = withObjects(request, fields);
    if (mode === 'validate') {
      if (!definition.validate) throw new PermanentError('this policy does not validate (it has no validate handler)');
      returnsNothing('validate', definition.validate(ctx));
      return withWarnings({ outcome: 'allow' }, warnings);
    }
    if (!definition.mutate) throw new PermanentError('this policy does not mutate (it has no mutate handler)');
    const patch = new Patch(ctx.object);
    // Not a spread of ctx, which would read (and parse) oldObject for every mutation.
    returnsNothing('mutate', definition.mutate(withObjects(request, { ...fields, patch })));
    const result: EvaluationOutput = { outcome: 'allow' };
    if (!patch.isEmpty) result.patch = patch.operations;
    return withWarnings(result, warnings);
  } catch (error) {
    return withWarnings(classify(error), warnings);
  }
}

type Objects = Pick<Context, 'object' | 'oldObject'>;

/**
 * A copy of `fields` with `object` and `oldObject` read from `request` when first read (so never
 * parsed unread). `fields` itself is left without them: spreading it reads neither.
 */
function withObjects<T extends object>(request: AdmissionRequest, fields: T): T & Objects {
  const ctx = { ...fields };
  // A handler may still assign them, as it could when they were plain fields.
  const settable = (key: keyof Objects, read: () => JsonObject | null): PropertyDescriptor => ({
    get: read,
    set: (value: unknown) => Object.defineProperty(ctx, key, { value, writable: true, enumerable: true, configurable: true }),
    enumerable: true, configurable: true,
  });
  return Object.defineProperties(ctx, {
    object: settable('object', () => request.object ?? null),
    oldObject: settable('oldObject', () => request.oldObject ?? null),
  }) as T & Objects;
}

/**
 * The type says `undefined`, but JavaScript (and `any`) let anything through. Red team: an
 * `async validate` that threw AdmissionError allowed the request, the rejection unobserved.
 */
function returnsNothing(handler: Mode, value: unknown): void {
  if (value === undefined) return;
  if (value instanceof Promise) {
    value.then(undefined, () => undefined);
    throw new PermanentError(`${handler} returned a Promise: handlers must be synchronous (no async, no await); return nothing to allow, throw AdmissionError to deny`);
  }
  throw new PermanentError(`${handler} returned ${JSON.stringify(value) ?? typeof value}: return nothing to allow, throw AdmissionError to deny`);
}

function classify(error: unknown): EvaluationOutput {
  if (error instanceof AdmissionError) return { outcome: 'deny', code: error.code, message: error.message };
  if (error instanceof PermanentError) return { outcome: 'error', kind: 'permanent', message: error.message };
  if (error instanceof TemporaryError) return { outcome: 'error', kind: 'temporary', message: error.message };
  return { outcome: 'error', kind: 'exception', message: describe(error) };
}

function describe(error: unknown): string {
  if (!(error instanceof Error)) return String(error);
  const text = error.name && error.name !== 'Error' ? `${error.name}: ${error.message}` : error.message;
  const where = located(error.stack);
  return where ? `${text} (at ${where})` : text;
}

/** Set by the statement `portcullis build` appends to the bundle (sdk/build/source-lines.ts). */
interface SourceLines { files: string[]; lines: string }

/**
 * The first frame of a stack that is in the author's own source, as "fn, policy.ts:4": QuickJS
 * names lines of the bundle, which the build's table maps back. Undefined when unknown.
 */
function located(stack: string | undefined): string | undefined {
  const table = (globalThis as { __portcullisSourceLines?: SourceLines }).__portcullisSourceLines;
  if (typeof stack !== 'string' || !table) return undefined;
  const lines = table.lines.split(';');
  for (const frame of stack.split('\n')) {
    const found = /^\s*at (.+?) \(.*:(\d+):\d+\)$/.exec(frame);
    if (!found) continue;
    const [file, line] = (lines[Number(found[2]) - 1] ?? '').split(':');
    if (file === undefined || line === undefined) continue;
    const fn = found[1] === '<anonymous>' ? '' : `${found[1]}, `;
    return `${fn}${table.files[Number(file)] ?? '?'}:${line}`;
  }
  return undefined;
}

function withWarnings(output: EvaluationOutput, warnings: string[]): EvaluationOutput {
  if (warnings.length > 0) output.warnings = warnings.map(String);
  return output;
}
