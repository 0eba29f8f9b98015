// Issue 14: a TypeScript guest gets the request's object and oldObject after the JSON and parses
// each only when the policy reads it (sdk/src/input.ts). What it reads must be what parsing the
// whole input gives, value and key order alike.
import { describe, expect, it } from 'vitest';
import { definePolicy, type EvaluationInput, type JsonObject } from '@portcullis/sdk';
import { readInput } from '../../sdk/src/input.ts';
import { DEFER_FROM_BYTES, rawEnvelope, sharedInput } from '../../host/src/evaluate/evaluate.ts';
import { MAX_MEMBERS, rawRequestSpan, scanReview } from '../../host/src/review/scan.ts';
import type { LoadedPolicy } from '../../host/src/policy/loaded.ts';
import { joinInput } from '../../host/src/sandbox/input.ts';

const apartPolicy = { settings: { labels: { team: 'x' } }, objectsApart: true, nestedApart: true } as unknown as LoadedPolicy;
/** A module built by an SDK that reads values apart but none inside another (before nested-apart). */
const flatPolicy = { settings: { labels: { team: 'x' } }, objectsApart: true } as unknown as LoadedPolicy;
const wholePolicy = { settings: { labels: { team: 'x' } } } as unknown as LoadedPolicy;

/** The guest's input text for `body` as the server builds it, apart or whole. */
function inputFor(body: string, policy: LoadedPolicy): string {
  const bytes = Buffer.from(body);
  const scan = scanReview(bytes);
  const review = JSON.parse(body) as { request: EvaluationInput['request'] };
  const input: EvaluationInput = { request: review.request, settings: null, headers: { 'user-agent': 'kube-apiserver' }, sslpeer: null, dryRun: false, webhook: '/validate' };
  const span = rawRequestSpan(bytes, scan);
  if (!span) throw new Error('no raw request span');
  rawEnvelope(input, bytes, span, scan);
  return joinInput(sharedInput(input, policy));
}

/** 'function' while a value apart is not read yet. */
const getter = (target: Record<string, unknown>, key: string) => typeof Object.getOwnPropertyDescriptor(target, key)?.get;

/** The paths of the values passed apart in `text`, outer before inner, each whole. */
function pathsApart(text: string, outer: string[] = []): string[][] {
  if (!text.startsWith('\u0000')) return [];
  const headerEnd = text.indexOf('\u0000', 1);
  const lengths = JSON.parse(text.slice(1, headerEnd)) as [number, ...(string[] | number)[]];
  const paths: string[][] = [];
  let at = headerEnd + 1 + lengths[0];
  for (let i = 1; i < lengths.length; i += 2) {
    const path = [...outer, ...(lengths[i] as string[])];
    const length = lengths[i + 1] as number;
    paths.push(path, ...pathsApart(text.slice(at, at + length), path));
    at += length;
  }
  return paths;
}

/** A string that makes the map or list holding it large enough to be passed apart. */
const big = (letter: string) => letter.repeat(DEFER_FROM_BYTES);
// metadata, its annotations, spec and its containers passed apart
const pod = (name: string, extra: JsonObject = {}): JsonObject => ({
  apiVersion: 'v1', kind: 'Pod', metadata: { name, labels: { app: 'wéb', 'a/b': 'x"y', 'c~d': '~1' }, annotations: { note: big('n') } },
  spec: { containers: [{ name: 'c', image: 'nginx', args: [big('a')] }] }, ...extra,
});

const bodies: Record<string, string> = {
  create: JSON.stringify({ apiVersion: 'admission.k8s.io/v1', kind: 'AdmissionReview', request: { uid: '1', operation: 'CREATE', object: pod('a'), oldObject: null } }),
  update: JSON.stringify({ apiVersion: 'admission.k8s.io/v1', kind: 'AdmissionReview', request: { uid: '2', operation: 'UPDATE', object: pod('b', { status: { phase: '€' } }), oldObject: pod('b'), options: {} } }),
  // oldObject written before object, spaces and newlines around them, unicode and escapes inside
  reordered: `{"request" : { "uid":"3", "oldObject" :\n ${JSON.stringify(pod('c', { n: [1e21, -0.5, '\u2028', '\\'] }))} ,\n "operation":"UPDATE", "object": ${JSON.stringify(pod('c'), null, 2)} } ,"kind":"AdmissionReview"}`,
  delete: JSON.stringify({ kind: 'AdmissionReview', request: { uid: '4', operation: 'DELETE', object: null, oldObject: pod('d') } }),
  emptyObject: JSON.stringify({ kind: 'AdmissionReview', request: { uid: '5', operation: 'CREATE', object: {} } }),
  // keys with / and ~ (escaped in the pointer), a list as a member, a member named twice (the object then goes whole)
  oddKeys: JSON.stringify({ kind: 'AdmissionReview', request: { uid: '6', operation: 'CREATE', object: { 'a/b~c': { x: big('y') }, '~1': [big('z')], 'é': { q: 'ü'.repeat(DEFER_FROM_BYTES / 2) } } } }),
  twice: JSON.stringify({ kind: 'AdmissionReview', request: { uid: '7', operation: 'UPDATE', object: pod('t'), oldObject: pod('t') } })
    .replace('"spec":{', `"spec":${JSON.stringify({ first: big('x') })},"spec":{`),
};

describe('objects apart', () => {
  for (const [name, body] of Object.entries(bodies)) {
    it(`reads the same request as the whole input: ${name}`, () => {
      const whole = inputFor(body, wholePolicy);
      expect(whole).not.toContain('\u0000');
      for (const policy of [apartPolicy, flatPolicy]) {
        const apart = inputFor(body, policy);
        if (name !== 'emptyObject') expect(apart).toContain('\u0000');
        expect(JSON.stringify(readInput(apart))).toBe(JSON.stringify(JSON.parse(whole)));
        expect(readInput(apart)).toEqual(JSON.parse(whole));
      }
    });
  }

  it('leaves a policy that names no input form the whole JSON', () => {
    expect(JSON.parse(inputFor(bodies.update!, wholePolicy)).request.oldObject.metadata.name).toBe('b');
  });

  it('parses a large member only when it is read, and lets it be replaced', () => {
    const input = readInput(inputFor(bodies.update!, apartPolicy));
    const request = input.request as unknown as Record<string, unknown>;
    expect(Object.keys(request)).toEqual(['uid', 'operation', 'object', 'oldObject', 'options']);
    const object = input.request.object as Record<string, unknown>;
    expect(Object.keys(object)).toEqual(['apiVersion', 'kind', 'metadata', 'spec', 'status']);
    expect(['metadata', 'spec', 'status', 'kind'].map((key) => getter(object, key))).toEqual(['function', 'function', 'undefined', 'undefined']);
    const metadata = object.metadata;
    expect(object.metadata).toBe(metadata); // parsed once, then a plain value
    expect(Object.getOwnPropertyDescriptor(object, 'metadata')).toMatchObject({ value: metadata, writable: true });
    expect(getter(object, 'spec')).toBe('function');
    // The containers, inside the spec, are put in place when the spec is read.
    const spec = object.spec as Record<string, unknown>;
    expect(getter(spec, 'containers')).toBe('function');
    spec.containers = null;
    expect(spec.containers).toBeNull();
    expect(object.spec).toEqual({ containers: null });
    object.spec = null;
    expect(object.spec).toBeNull();
    // The whole object when a member is named twice
    const twice = readInput(inputFor(bodies.twice!, apartPolicy)).request as unknown as Record<string, unknown>;
    expect(getter(twice, 'object')).toBe('function');
    expect((twice.object as { spec: unknown }).spec).toEqual(pod('t').spec);
  });

  it('behaves as plain values for a policy that freezes, seals or copies what it reads (red team)', () => {
    const read = () => readInput(inputFor(bodies.update!, apartPolicy)).request.object as Record<string, unknown>;
    // Deep freeze, parent first, as defensive code does: the getters still answer.
    const deepFreeze = (value: unknown): void => {
      if (typeof value !== 'object' || value === null) return;
      Object.freeze(value);
      for (const key of Object.keys(value)) deepFreeze((value as Record<string, unknown>)[key]);
    };
    const frozen = read();
    deepFreeze(frozen);
    expect(frozen.spec).toEqual(pod('b').spec);
    expect(frozen.spec).toBe(frozen.spec);
    expect(Object.isFrozen(frozen.spec)).toBe(true);
    expect(() => { frozen.spec = 1; }).toThrow(TypeError);
    // Sealed: readable, and still assignable.
    const sealed = Object.seal(read());
    expect(sealed.metadata).toEqual(pod('b').metadata);
    sealed.spec = 'replaced';
    expect(sealed.spec).toBe('replaced');
    // A copy made from its descriptors shares the parsed value, as a copy of a plain value would.
    const original = read();
    const copy = Object.create(Object.getPrototypeOf(original) as object, Object.getOwnPropertyDescriptors(original)) as Record<string, unknown>;
    (copy.spec as Record<string, unknown>).marker = 1;
    expect((copy.spec as Record<string, unknown>).marker).toBe(1);
    expect(copy.spec).toBe(original.spec);
    // A write to a sealed copy, or to an object that inherits the value, leaves the original as
    // it was (red team: both replaced the original's value), here on a value nested in the spec.
    const spec = read().spec as Record<string, unknown>;
    expect(getter(spec, 'containers')).toBe('function');
    // (with a plain member too: sealed, an object of accessors alone is also frozen, and a write to it throws)
    const base: Record<string, unknown> = { other: 1 };
    const sealedCopy = Object.seal(Object.defineProperties(base, Object.getOwnPropertyDescriptors(spec)));
    sealedCopy.containers = [];
    expect(sealedCopy.containers).toEqual([]);
    const heir = Object.create(spec) as Record<string, unknown>;
    heir.containers = 'mine';
    expect([heir.containers, Object.hasOwn(heir, 'containers')]).toEqual(['mine', true]);
    expect(spec.containers).toEqual((pod('b').spec as JsonObject).containers);
    const sealedSpec = read().spec as Record<string, unknown>;
    sealedSpec.other = 1;
    Object.seal(sealedSpec);
    const sealedHeir = Object.create(Object.freeze(read().spec as object)) as Record<string, unknown>;
    sealedSpec.containers = 1;
    expect(sealedSpec.containers).toBe(1);
    expect(() => { sealedHeir.containers = 1; }).toThrow(TypeError);
  });

  it('takes an object of many members apart whole: the scan notes a bounded number of members (red team)', () => {
    const many = (n: number) => Object.fromEntries(Array.from({ length: n }, (_, i) => [`k${i}`, { v: 'x'.repeat(130) }]));
    for (const [n, members] of [[MAX_MEMBERS, true], [MAX_MEMBERS + 1, false], [20_000, false]] as const) {
      const text = JSON.stringify({ kind: 'AdmissionReview', request: { uid: 'm', operation: 'UPDATE', object: many(n), oldObject: { spec: many(2) } } });
      const scan = scanReview(Buffer.from(text));
      expect(scan.object).toBeDefined();
      expect(scan.listMembers?.('object') !== undefined).toBe(members);
      expect(scan.listMembers?.('oldObject')).toHaveLength(1);
      if (n < 1000) expect(JSON.stringify(readInput(inputFor(text, apartPolicy)))).toBe(JSON.stringify(JSON.parse(inputFor(text, wholePolicy))));
    }
  });

  it('takes the large values of a large member apart one level further, unless its keys are too many or named twice', () => {
    const spec = {
      // brackets and quotes inside strings
      nodeName: 'n1}]', containers: [{ name: 'c"}]\\', image: big('i') }], volumes: [{ name: 'v', emptyDir: {} }],
      affinity: { nodeAffinity: { required: big('r') } }, small: { a: 1 },
    };
    const objectWith = (memberText: string) => JSON.stringify({ kind: 'AdmissionReview', request: { uid: 'd', operation: 'UPDATE', object: { kind: 'Pod', spec: 0 }, oldObject: null } })
      .replace('"spec":0', `"spec":${memberText}`);
    const members = (n: number) => `{${Array.from({ length: n }, (_, i) => `"k${i}":${JSON.stringify({ v: big('x') })}`).join(',')}}`;
    const nested = [['request', 'object', 'spec'], ['request', 'object', 'spec', 'containers'], ['request', 'object', 'spec', 'affinity']];
    const cases: [string, string, string[][]][] = [
      ['nested', JSON.stringify(spec), nested],
      // spaces and newlines everywhere, numbers and literals last in a map
      ['spaced', JSON.stringify({ ...spec, n: -1.5e3, t: true }, null, 3), nested],
      ['named twice', JSON.stringify(spec).replace('"nodeName":', `"affinity":${JSON.stringify({ x: big('y') })},"nodeName":`), [['request', 'object', 'spec']]],
      ['many', members(MAX_MEMBERS + 1), [['request', 'object', 'spec']]],
      ['as many as noted', members(MAX_MEMBERS), [['request', 'object', 'spec'], ...Array.from({ length: MAX_MEMBERS }, (_, i) => ['request', 'object', 'spec', `k${i}`])]],
      // large, with nothing large inside
      ['large', JSON.stringify({ a: { b: 'c'.repeat(DEFER_FROM_BYTES - 20) }, d: [1] }), [['request', 'object', 'spec']]],
      ['small', JSON.stringify({ a: { b: 'c'.repeat(DEFER_FROM_BYTES - 40) } }), []],
    ];
    for (const [name, member, paths] of cases) {
      const text = objectWith(member);
      const apart = inputFor(text, apartPolicy);
      expect(pathsApart(apart), name).toEqual(paths);
      expect(JSON.stringify(readInput(apart)), name).toBe(JSON.stringify(JSON.parse(inputFor(text, wholePolicy))));
      // An SDK without nested-apart gets the outer values alone
      const flat = inputFor(text, flatPolicy);
      expect(pathsApart(flat), name).toEqual(paths.filter((path) => path.length <= 3));
      expect(JSON.stringify(readInput(flat)), name).toBe(JSON.stringify(JSON.parse(inputFor(text, wholePolicy))));
    }
  });

  it('takes plain JSON as before (the CLI and tests pass it)', () => {
    expect(readInput('{"request":{"uid":"1","object":{"a":1}}}').request.object).toEqual({ a: 1 });
  });

  it('gives handlers object and oldObject as before, and never parses what they do not read', () => {
    const seen: unknown[] = [];
    const policy = definePolicy({
      validate(ctx) {
        seen.push(ctx.operation, ctx.object?.metadata, ctx.oldObject?.status ?? null);
        // as before: a handler may assign its context's fields
        ctx.object = null;
        seen.push(ctx.object);
        if (ctx.request.uid === 'never') ctx.warnings.push('x');
      },
      mutate({ object, patch }) {
        patch.set(['metadata', 'labels', 'seen'], (object?.metadata as { name: string }).name);
      },
    });
    expect(JSON.parse(policy.validate(inputFor(bodies.update!, apartPolicy)))).toEqual({ outcome: 'allow' });
    expect(seen).toEqual(['UPDATE', pod('b').metadata, null, null]);
    expect(JSON.parse(policy.mutate(inputFor(bodies.update!, apartPolicy)))).toEqual({
      outcome: 'allow', patch: [{ op: 'add', path: '/metadata/labels/seen', value: 'b' }],
    });
    // A broken object text (a host bug) is read as an exception of the handler that reads it, not before.
    const whole = inputFor(bodies.create!, { settings: null } as unknown as LoadedPolicy);
    const skeleton = whole.replace(/"metadata":\{[^}]*\}(,"annotations":\{[^}]*\})?\}/, '"metadata":null');
    const broken = `\u0000${JSON.stringify([skeleton.length, ['request', 'object', 'metadata'], 8])}\u0000${skeleton}{"name":`;
    expect(JSON.parse(skeleton).request.object.metadata).toBeNull();
    const quiet = definePolicy({ validate() {} });
    expect(JSON.parse(quiet.validate(broken))).toEqual({ outcome: 'allow' });
    const reader = definePolicy({ validate({ object, warnings }) { warnings.push(JSON.stringify(object?.metadata)); } });
    expect(JSON.parse(reader.validate(broken))).toMatchObject({ outcome: 'error', kind: 'exception', message: expect.stringMatching(/JSON/) });
  });

  it('declares the form in its metadata', () => {
    expect(JSON.parse(definePolicy({ validate() {} }).metadata())).toMatchObject({ input: ['objects-apart', 'nested-apart'] });
  });
});
