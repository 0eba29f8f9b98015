import { describe, expect, it } from 'vitest';
import { ReviewError } from '../../host/src/errors.ts';
import { hasObject, hasValue, labelsIn, MAX_BODY_DEPTH, MAX_PARSED_OUTSIDE_OBJECTS, PARSED_WHOLE_BELOW, parsedCostOf, parseReviewText, parseScannedReview } from '../../host/src/review/parse.ts';
import { memberOf } from '../../host/src/util/json-bytes.ts';
import { scanReview } from '../../host/src/review/scan.ts';
import { reviewBody } from '../../bench/review.ts';

/** A small deterministic generator, so that a failure names a case that can be run again. */
function random(seed: number): () => number {
  return () => {
    seed = (seed * 1103515245 + 12345) & 0x7fffffff;
    return seed / 0x7fffffff;
  };
}

function parses(bytes: Buffer): boolean {
  try {
    JSON.parse(bytes.toString('utf8'));
    return true;
  } catch {
    return false;
  }
}

describe('scanReview: one walk over the body', () => {
  const seeds = [
    reviewBody(),
    '{"a":[1,-0.5e+3,true,false,null,"x\\u00e9\\n\\/"],"b":{}, "c" : [ ] }',
    '{"request":{"object":{"a":"é"},"oldObject":{"b":[1,2]},"uid":"x"}}',
    '[1e5,1E-5,0.0,-0,12,"\\ud800"]',
    ' "s" ',
  ];

  it('says a body is JSON exactly when JSON.parse does (mutated bodies, by characters and by bytes)', () => {
    const next = random(1);
    const alphabet = ['{', '}', '[', ']', ',', ':', '"', '\\', 'u', '0', '1', '-', '.', 'e', 'E', '+', ' ', '\n', '\t', '\r', 't', 'r', 'n', 'f', 'a', 'l', 's', '\x01', '\x7f', 'é', '\u2028', '/', 'b'];
    const disagree: string[] = [];
    for (let i = 0; i < 20_000; i++) {
      let text = seeds[Math.floor(next() * seeds.length)]!;
      for (let edits = 1 + Math.floor(next() * 3); edits > 0; edits--) {
        const at = Math.floor(next() * (text.length + 1));
        const char = alphabet[Math.floor(next() * alphabet.length)]!;
        const how = next();
        const rest = how < 0.33 ? text.slice(at) : text.slice(at + 1);
        text = text.slice(0, at) + (how < 0.33 || how >= 0.66 ? char : '') + rest;
      }
      const bytes = Buffer.from(text);
      if (scanReview(bytes).valid !== parses(bytes)) disagree.push(text);
      // Bytes that are not UTF-8, inside strings and out.
      const raw = [...bytes];
      raw.splice(Math.floor(next() * (raw.length + 1)), 0, 0x80 + Math.floor(next() * 128));
      const odd = Buffer.from(raw);
      if (scanReview(odd).valid !== parses(odd)) disagree.push(odd.toString('latin1'));
    }
    expect(disagree.slice(0, 5)).toEqual([]);
  });

  it('finds the request, its object and its oldObject, and counts what parsing costs', () => {
    for (const seed of seeds) {
      const bytes = Buffer.from(seed);
      const scan = scanReview(bytes);
      expect(scan.valid).toBe(true);
      expect(scan.parsedCost).toBe(parsedCostOf(bytes));
      const parsed = JSON.parse(seed) as { request?: Record<string, unknown> };
      if (!scan.request) continue;
      const text = (span: { start: number; end: number }) => JSON.parse(bytes.subarray(span.start, span.end).toString()) as unknown;
      expect(text(scan.request)).toEqual(parsed.request);
      expect(scan.object && text(scan.object)).toEqual(parsed.request!.object);
      if (parsed.request!.oldObject) expect(text(scan.oldObject!)).toEqual(parsed.request!.oldObject);
    }
  });

  it('lists a body\'s members after other bodies were walked (the walk keeps one set of notes)', () => {
    const bytes = Buffer.from(reviewBody());
    const scan = scanReview(bytes);
    const text = (span: { start: number; end: number }) => bytes.subarray(span.start, span.end).toString();
    const listed = () => scan.listMembers!('object')!.map(({ key, value, inner }) => [text(key), text(value), inner?.map((m) => text(m.key))]);
    const first = listed();
    const pod = JSON.parse(reviewBody()) as { request: { object: Record<string, Record<string, unknown>> } };
    expect(first.map(([key]) => key)).toEqual(Object.keys(pod.request.object));
    expect(first.find(([key]) => key === 'spec')![2]).toEqual(Object.keys(pod.request.object.spec!));
    scanReview(Buffer.from('{"request":{"object":{"other":{"x":1},"y":[2]},"oldObject":{"z":{}}}}'));
    expect(listed()).toEqual(first);
  });

  it('names no object where another reading could differ, or where it is not an object', () => {
    const spans = (text: string) => {
      const scan = scanReview(Buffer.from(text));
      return { request: scan.request !== undefined, object: scan.object !== undefined, oldObject: scan.oldObject !== undefined };
    };
    expect(spans('{"request":{"object":{},"oldObject":{}}}')).toEqual({ request: true, object: true, oldObject: true });
    expect(spans('{"request":{"object":{"a":1},"object":{"a":2}}}')).toEqual({ request: true, object: false, oldObject: false });
    expect(spans('{"request":{"object":{},"obj\\u0065ct":{}}}')).toEqual({ request: true, object: false, oldObject: false });
    expect(spans('{"request":{"object":{"metadata":{"l\\u0061bels":{}}}}}')).toEqual({ request: true, object: false, oldObject: false });
    expect(spans('{"request":{"object":null,"oldObject":[1]}}')).toEqual({ request: true, object: false, oldObject: false });
    expect(spans('{"request":{"x":{"object":{}}},"object":{}}')).toEqual({ request: true, object: false, oldObject: false });
    expect(spans('{"request":{"object":{}},"request":{"object":{}}}')).toEqual({ request: false, object: false, oldObject: false });
    expect(spans('{"r\\u0065quest":{"object":{}}}')).toEqual({ request: false, object: false, oldObject: false });
  });

  it('stops past MAX_BODY_DEPTH levels, counted outside strings', () => {
    const nested = (levels: number) => Buffer.from(`{"request":{"object":${'['.repeat(levels - 2)}${']'.repeat(levels - 2)}}}`);
    expect(scanReview(nested(MAX_BODY_DEPTH)).valid).toBe(true);
    expect(scanReview(nested(MAX_BODY_DEPTH + 1))).toMatchObject({ valid: false, tooDeep: true });
    expect(scanReview(Buffer.from(`{"a":"${'['.repeat(20_000)}"}`)).valid).toBe(true);
  });

  it('costs the same on the hundredth large body as on the first (a denial of service, not a speed target)', () => {
    // The walk reads bytes: over a string, a loop like it fell at random into ~6 µs a character
    // (red team, nestedDeeperThan). Each of these takes 10-70 ms here; the bound is 30 times that.
    const object = (fill: unknown) => Buffer.from(JSON.stringify({ kind: 'AdmissionReview', request: { uid: '1', object: fill } }));
    const bodies = [
      object({ metadata: { annotations: Object.fromEntries(Array.from({ length: 60_000 }, (_, i) => [`k${i}`, 'v'.repeat(30)])) } }),
      object({ spec: { x: Array.from({ length: 700_000 }, () => 1) } }),
      Buffer.from(`{"request":{"object":{"spec":{"x":[${'"",'.repeat(1_000_000)}""]}},"uid":"1"},"z":"\\\\"}`),
    ];
    let slowest = 0;
    for (let round = 0; round < 8; round++) {
      for (const bytes of bodies) {
        const started = performance.now();
        expect(scanReview(bytes).valid).toBe(true);
        slowest = Math.max(slowest, performance.now() - started);
      }
    }
    expect(slowest).toBeLessThan(2000);
  });
});

describe('parseScannedReview: the object parsed when first read', () => {
  const body = Buffer.from(reviewBody());

  it('gives what the whole parse gives, reading the object only when asked', () => {
    const lazy = parseScannedReview(body, scanReview(body));
    const eager = parseReviewText(body);
    expect(typeof Object.getOwnPropertyDescriptor(lazy.request, 'object')?.get).toBe('function');
    expect(Object.keys(lazy.request)).toEqual(Object.keys(eager.request));
    expect(lazy.request.uid).toBe(eager.request.uid);
    expect(lazy.request.oldObject).toBeNull();
    const object = lazy.request.object;
    expect(object).toEqual(eager.request.object);
    // Read once: the same value after, now a plain property.
    expect(lazy.request.object).toBe(object);
    expect(Object.getOwnPropertyDescriptor(lazy.request, 'object')?.value).toBe(object);
    expect(JSON.stringify(lazy)).toBe(JSON.stringify(eager));
  });

  it('reads each request\'s own object from its own body (the accessors are shared by all requests)', () => {
    const other = Buffer.from(reviewBody().replace('"restartPolicy":"Always"', '"restartPolicy":"Never"'));
    const first = parseScannedReview(body, scanReview(body));
    const second = parseScannedReview(other, scanReview(other));
    const getter = (request: object): unknown => (Object.getOwnPropertyDescriptor(request, 'object') as { get?: unknown } | undefined)?.get;
    expect(getter(first.request)).toBe(getter(second.request));
    expect(second.request.object).toEqual(parseReviewText(other).request.object);
    expect(first.request.object).toEqual(parseReviewText(body).request.object);
    expect(JSON.stringify(second.request.object)).toContain('"restartPolicy":"Never"');
    // Where the unread object lies is no field of the request: not listed, not serialized.
    expect(Object.keys(first.request)).toEqual(Object.keys(parseReviewText(body).request));
    expect(JSON.stringify(second)).toBe(JSON.stringify(parseReviewText(other)));
  });

  it('reads both objects of an UPDATE, and takes an assignment before the first read', () => {
    const text = JSON.stringify({
      kind: 'AdmissionReview', apiVersion: 'admission.k8s.io/v1',
      request: { uid: 'u', kind: { group: '', version: 'v1', kind: 'ConfigMap' }, resource: { group: '', version: 'v1', resource: 'configmaps' }, operation: 'UPDATE', userInfo: {}, oldObject: { data: { a: 'ü' } }, object: { data: { a: '€' } } },
    });
    const bytes = Buffer.from(text);
    const review = parseScannedReview(bytes, scanReview(bytes));
    expect({ ...review.request }).toEqual(parseReviewText(text).request);
    const again = parseScannedReview(bytes, scanReview(bytes));
    again.request.object = { data: { b: '1' } };
    expect(again.request.object).toEqual({ data: { b: '1' } });
    expect(again.request.oldObject).toEqual({ data: { a: 'ü' } });
  });

  it('refuses a body broken inside the object at once, in JSON.parse\'s words, and one nested too deep', () => {
    const broken = Buffer.from(reviewBody().replace('"restartPolicy":"Always"', '"restartPolicy":Always'));
    expect(() => parseScannedReview(broken, scanReview(broken))).toThrow(/^the body is not JSON: Unexpected token/);
    const controls = Buffer.from(reviewBody().replace('"restartPolicy":"Always"', '"restartPolicy":"Al\tways"'));
    expect(() => parseScannedReview(controls, scanReview(controls))).toThrow(ReviewError);
    const deep = Buffer.from(`{"kind":"AdmissionReview","request":{"object":{"a":${'['.repeat(MAX_BODY_DEPTH)}${']'.repeat(MAX_BODY_DEPTH)}}}}`);
    expect(() => parseScannedReview(deep, scanReview(deep))).toThrow(`the body nests objects or arrays more than ${MAX_BODY_DEPTH} levels deep; the API server sends nothing that deep`);
  });

  it('refuses a large body the scan found broken with where it stopped, without parsing it (red team)', () => {
    const pad = 'x'.repeat(70_000);
    const broken = Buffer.from(reviewBody().replace('"restartPolicy":"Always"', `"pad":"${pad}","restartPolicy":Always`));
    expect(broken.length).toBeGreaterThanOrEqual(PARSED_WHOLE_BELOW);
    const at = broken.indexOf(':Always') + 1;
    expect(() => parseScannedReview(broken, scanReview(broken))).toThrow(`the body is not JSON: what starts at byte ${at} is not valid there ("Always,\\"termination`);
    const whole = Buffer.from(reviewBody().replace('"restartPolicy":"Always"', `"pad":"${pad}","restartPolicy":"Always"`));
    expect(parseScannedReview(whole, scanReview(whole)).request.uid).toBeTruthy();
    const cut = whole.subarray(0, whole.length - 3);
    expect(() => parseScannedReview(cut, scanReview(cut))).toThrow(`the body is not JSON: it ends at byte ${cut.length} before its value does`);
  });

  it('says whether the request has an object without reading it', () => {
    const lazy = parseScannedReview(body, scanReview(body));
    expect(hasObject(lazy.request)).toBe(true);
    expect(typeof Object.getOwnPropertyDescriptor(lazy.request, 'object')?.get).toBe('function');
    lazy.request.object = null;
    expect(hasObject(lazy.request)).toBe(false);
    const deleting = Buffer.from(reviewBody().replace('"operation":"CREATE"', '"operation":"DELETE"').replace('"object":{', '"object":null,"x":{').replace('"oldObject":null', '"oldObject":{}'));
    expect(hasObject(parseScannedReview(deleting, scanReview(deleting)).request)).toBe(false);
  });

  it('refuses a request holding more values outside its object and oldObject than MAX_PARSED_OUTSIDE_OBJECTS, before parsing them (red team)', () => {
    // Tiny maps with keys of their own cost JSON.parse the most: 1-2 MiB held the main thread 100-430 ms.
    const junk = (maps: number) => Array.from({ length: maps }, (_, i) => `{"k${i}":0}`).join(',');
    const over = Math.ceil(MAX_PARSED_OUTSIDE_OBJECTS / 112) + 1;
    const under = Math.floor(MAX_PARSED_OUTSIDE_OBJECTS / 112) - 100;
    const withJunk = (maps: number, text = reviewBody()) => Buffer.from(text.replace('"operation":"CREATE"', `"operation":"CREATE","junk":[${junk(maps)}]`));
    const refused = /^the request holds too many JSON values outside its object and oldObject \(about 1\.\d MiB once parsed, over the 1 MiB this host takes\)/;
    const heavy = withJunk(over);
    expect(() => parseScannedReview(heavy, scanReview(heavy))).toThrow(refused);
    const light = withJunk(under);
    expect(parseScannedReview(light, scanReview(light)).request.uid).toBeTruthy();
    // Without an object to leave out (a CONNECT's null), the whole body is counted.
    const noObject = withJunk(over, reviewBody().replace('"object":{', '"object":null,"x":{'));
    expect(scanReview(noObject).object).toBeUndefined();
    expect(() => parseScannedReview(noObject, scanReview(noObject))).toThrow(refused);
    // Values inside the object are not counted: it is parsed only when read.
    const inObject = Buffer.from(reviewBody().replace('"restartPolicy":"Always"', `"restartPolicy":"Always","junk":[${junk(over)}]`));
    expect(parseScannedReview(inObject, scanReview(inObject)).request.uid).toBeTruthy();
  });

  it('reads an unread object\'s labels from its bytes, without parsing the object, as the parsed object gives them (red team)', () => {
    const review = (object: string, old = 'null') => Buffer.from(reviewBody().replace(/"object":\{.*\},"oldObject":null/s, `"object":${object},"oldObject":${old}`));
    const cases = [
      '{"metadata":{"name":"a","labels":{"app":"web","t":"x"}},"spec":{}}',
      '{ "spec" : { "metadata": {"labels": {"no": "1"}} } , "metadata" : { "labels" : { "app" : "w,e}b\\"" } , "x": [1, {"labels": 2}] } }',
      // Named twice: the last one, as JSON.parse keeps.
      '{"metadata":{"labels":{"a":"1"}},"metadata":{"labels":{"b":"2"},"labels":{"c":"3"}}}',
      '{"metadata":{"name":"no labels"}}',
      '{"metadata":{"labels":null}}',
      '{"metadata":{"labels":["a"]}}',
      '{"metadata":"not a map"}',
      '{"kind":"PodExecOptions","command":["sh"]}',
      '{}',
      `{"metadata":{"labels":{${Array.from({ length: 100 }, (_, i) => `"k${i}":"v${i}"`).join(',')}}},${Array.from({ length: 100 }, (_, i) => `"m${i}":{"labels":{"x":"y"}}`).join(',')}}`,
    ];
    for (const object of cases) {
      const body = review(object, object);
      const scanned = parseScannedReview(body, scanReview(body));
      expect(typeof Object.getOwnPropertyDescriptor(scanned.request, 'object')?.get, object).toBe('function');
      const lazy = [labelsIn(scanned.request, 'object'), labelsIn(scanned.request, 'oldObject')];
      // Not parsed for it: still the getter.
      expect(typeof Object.getOwnPropertyDescriptor(scanned.request, 'object')?.get, object).toBe('function');
      const parsed = parseReviewText(body);
      expect(lazy, object).toEqual([labelsIn(parsed.request, 'object'), labelsIn(parsed.request, 'oldObject')]);
      expect(hasValue(scanned.request, 'object')).toBe(true);
    }
    const deleting = parseScannedReview(review('null', cases[0]), scanReview(review('null', cases[0])));
    expect([hasValue(deleting.request, 'object'), hasValue(deleting.request, 'oldObject')]).toEqual([false, true]);
    expect(labelsIn(deleting.request, 'oldObject')).toEqual({ metadata: true, labels: { app: 'web', t: 'x' } });
  });

  it('finds a map\'s own member in its bytes as JSON.parse would, whatever its members hold', () => {
    const random = (seed: number) => () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648);
    const next = random(7);
    const pick = <T>(list: T[]) => list[Math.floor(next() * list.length)]!;
    const value = (depth: number): string => {
      const kind = depth === 0 ? 2 : depth > 2 ? 0 : Math.floor(next() * 4);
      if (kind === 0) return pick(['1', '"s"', '"a,b}{]["', '"q\\"x"', 'null', 'true', '-0.5e3', '"\\\\"']);
      if (kind === 1) return `[${Array.from({ length: Math.floor(next() * 3) }, () => value(depth + 1)).join(pick([',', ' , ']))}]`;
      return `{${Array.from({ length: Math.floor(next() * 4) }, () => `${pick(['"k"', '"labels"', '"metadata"', '"x"'])}${pick([':', ' : '])}${value(depth + 1)}`).join(pick([',', ', ']))}}`;
    };
    for (let i = 0; i < 2000; i++) {
      const text = ` ${value(0)} `;
      const bytes = Buffer.from(text);
      const start = text.indexOf('{');
      for (const key of ['k', 'labels', 'metadata', 'absent']) {
        const parsed = (JSON.parse(text) as Record<string, unknown>);
        const found = memberOf(bytes, { start, end: text.lastIndexOf('}') + 1 }, key);
        expect(found === undefined ? undefined : JSON.parse(text.slice(found.start, found.end)), `${text} ${key}`).toEqual(Object.hasOwn(parsed, key) ? parsed[key] : undefined);
      }
    }
  });

  it('checks the request\'s own fields as the whole parse does', () => {
    const text = reviewBody().replace('"operation":"CREATE"', '"operation":"PATCH"');
    const bytes = Buffer.from(text);
    expect(() => parseScannedReview(bytes, scanReview(bytes))).toThrow(/request.operation must be CREATE, UPDATE, DELETE or CONNECT/);
  });
});
