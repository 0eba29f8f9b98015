// The merged patch sent to the apiserver: it must take the original to the merged object, and
// its size must follow what changed, not the size of the lists that changed.
import type { JsonValue, PatchOperation } from '@portcullis/sdk';
import { describe, expect, it } from 'vitest';
import { diff } from '../../host/src/merge/diff.ts';
import { merge } from '../../host/src/merge/merge.ts';
import { combinePatches, patchedObject } from '../../host/src/merge/patches.ts';
import { equal, patched } from '../../host/src/merge/json-patch.ts';

/** A small seeded generator, so a failure names a case that can be run again. */
function random(seed: number): () => number {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function value(rnd: () => number, depth: number): JsonValue {
  const kind = Math.floor(rnd() * (depth > 2 ? 3 : 5));
  if (kind === 0) return Math.floor(rnd() * 4);
  if (kind === 1) return ['a', 'b', 'c'][Math.floor(rnd() * 3)]!;
  if (kind === 2) return rnd() < 0.5 ? null : true;
  if (kind === 3) return Array.from({ length: Math.floor(rnd() * 5) }, () => value(rnd, depth + 1));
  return Object.fromEntries(Array.from({ length: Math.floor(rnd() * 4) }, (_, i) => [`k${i}`, value(rnd, depth + 1)]));
}

/** A changed copy: elements inserted, removed and replaced in lists, keys added, removed and changed. */
function mutate(rnd: () => number, v: JsonValue): JsonValue {
  if (Array.isArray(v)) {
    const out = v.map((x) => (rnd() < 0.3 ? mutate(rnd, x) : x));
    if (rnd() < 0.3) out.splice(Math.floor(rnd() * (out.length + 1)), 0, value(rnd, 2));
    if (rnd() < 0.3 && out.length > 0) out.splice(Math.floor(rnd() * out.length), 1 + Math.floor(rnd() * 2));
    return out;
  }
  if (v !== null && typeof v === 'object') {
    const out: Record<string, JsonValue> = {};
    for (const [k, x] of Object.entries(v)) if (rnd() > 0.15) out[k] = rnd() < 0.4 ? mutate(rnd, x) : x;
    if (rnd() < 0.3) out[`n${Math.floor(rnd() * 3)}`] = value(rnd, 2);
    return out;
  }
  return rnd() < 0.3 ? value(rnd, 2) : v;
}

describe('the merged patch', () => {
  it('takes the original to the merged object, for 5,000 random pairs', () => {
    for (let seed = 1; seed <= 5000; seed++) {
      const rnd = random(seed);
      const before = { spec: value(rnd, 0) };
      const after = mutate(rnd, before);
      const result = patched(before, diff(before, after));
      if (!equal(result, after)) expect.fail(`seed ${seed}: ${JSON.stringify(before)} -> ${JSON.stringify(after)} by ${JSON.stringify(diff(before, after))}`);
    }
  });

  it('is as small as the change: removing the first of 680,000 elements is one operation', () => {
    const before = { spec: { add: Array.from({ length: 680_000 }, (_, i) => `C${i}`) } };
    const after = { spec: { add: before.spec.add.slice(1) } };
    expect(diff(before, after)).toEqual([{ op: 'remove', path: '/spec/add/0' }]);
    const inserted = { spec: { add: [...before.spec.add.slice(0, 1000), 'X', 'Y', ...before.spec.add.slice(1000)] } };
    expect(diff(before, inserted)).toEqual([{ op: 'add', path: '/spec/add/1000', value: 'X' }, { op: 'add', path: '/spec/add/1001', value: 'Y' }]);
    // Changes in two places of one list are one replace of it: never more operations than elements.
    const twice = diff(before, { spec: { add: ['X', ...before.spec.add.slice(0, 1000), 'Y', ...before.spec.add.slice(1000)] } });
    expect(twice.map(({ op, path }) => `${op} ${path}`)).toEqual(['replace /spec/add']);
  });

  it('stays small and linear where elements moved, many were removed, or lists nest (red team, round 6)', () => {
    const n = 400_000;
    const list = Array.from({ length: n }, (_, i) => i);
    // A rotation keeps the length: element by element it was one replace per element.
    const rotated = diff({ l: list }, { l: [...list.slice(1), list[0]!] });
    expect(rotated).toEqual([{ op: 'replace', path: '/l', value: [...list.slice(1), list[0]!] }]);
    // Most of a list removed: one replace, not thousands of removes the check would replay.
    expect(diff({ l: list }, { l: [list[0]!, list[n - 1]!] }).map((o) => o.op)).toEqual(['replace']);
    // Lists nested 500 deep around a long list: each element is compared once, not once per level.
    let before: JsonValue = Array.from({ length: 200_000 }, (_, i) => i);
    let after: JsonValue = [...(before as number[]).slice(0, -1), -1];
    for (let i = 0; i < 500; i++) [before, after] = [[before], [after]];
    const started = performance.now();
    expect(diff({ spec: before }, { spec: after })).toHaveLength(1);
    expect(performance.now() - started).toBeLessThan(1000);
    // Many changed keys under one map: one replace of the map, whatever its depth.
    const keys = (v: string) => Object.fromEntries(Array.from({ length: 1000 }, (_, i) => [`k${i}`, v]));
    let deepBefore: JsonValue = keys('a');
    let deepAfter: JsonValue = keys('b');
    for (let i = 0; i < 2000; i++) [deepBefore, deepAfter] = [{ m: deepBefore }, { m: deepAfter }];
    const ops = diff({ spec: deepBefore }, { spec: deepAfter });
    expect(ops).toHaveLength(1);
    expect(ops[0]!.op).toBe('replace');
  });

  it('repeats a long key at most a bounded number of times (red team, round 7: 64 changes under a 1.4 MB key, an 89.6 MB patch)', () => {
    const key = 'k'.repeat(1_400_000);
    const leaves = (v: string) => Object.fromEntries(Array.from({ length: 64 }, (_, i) => [`f${i}`, v]));
    const before = { spec: { [key]: leaves('a') } };
    const after = { spec: { [key]: leaves('b') } };
    const ops = diff(before, after);
    expect(JSON.stringify(ops).length).toBeLessThan(2 * JSON.stringify(after).length);
    expect(equal(patched(before, ops), after)).toBe(true);
  });

  it('walks an object nested deeper than the call stack allows (red team, round 7: overflow at 3,711 levels)', () => {
    let before: JsonValue = { a: 1 };
    let after: JsonValue = { a: 2 };
    // Alternating maps and lists, 20,000 deep: a recursive walk overflows long before.
    for (let i = 0; i < 20_000; i++) [before, after] = i % 2 ? [{ m: before }, { m: after }] : [[before], [after]];
    const ops = diff({ spec: before }, { spec: after });
    expect(ops).toHaveLength(1);
    expect(ops[0]).toMatchObject({ op: 'replace', value: 2 });
    expect(ops[0]!.path.endsWith('/a')).toBe(true);
    expect(ops[0]!.path.split('/')).toHaveLength(20_003);
  });

  it('does not replace a map or list that holds a value nested too deep to serialize: it walks it (red team)', () => {
    // A custom resource with a field 5,000 deep in the first of 70 items; one policy marks every
    // item, another adds a label. The 70 changes under the list used to make it one replace,
    // whose deep value the final check could not copy: every patching policy failed.
    let deep: JsonValue = 1;
    for (let i = 0; i < 5000; i++) deep = { d: deep };
    const items = Array.from({ length: 70 }, (_, i): JsonValue => (i === 0 ? { name: 'i0', config: deep } : { name: `i${i}` }));
    const original = { apiVersion: 'example.com/v1', kind: 'Widget', metadata: { name: 'w', labels: {} }, spec: { items } };
    const harden = { policy: 'harden', status: 'allowed' as const, warnings: [], patch: items.map((_, i) => ({ op: 'add' as const, path: `/spec/items/${i}/secure`, value: true })) };
    const label = { policy: 'label', status: 'allowed' as const, warnings: [], patch: [{ op: 'add' as const, path: '/metadata/labels/team', value: 'x' }] };
    const policy = (name: string) => ({ name, failurePolicy: 'Fail' as const, enforcement: 'enforce' as const });
    const { decision } = merge([{ policy: policy('harden'), outcome: harden }, { policy: policy('label'), outcome: label }], 'CREATE', original);
    expect(decision.status?.message).toBeUndefined();
    expect(decision.patch).toHaveLength(71);
    expect(JSON.stringify(decision.patch).length).toBeLessThan(8000);
    // A shallow list with as many changes is still one replace.
    const shallow = diff({ list: items.map((_, i) => ({ i })) }, { list: items.map((_, i) => ({ i, secure: true })) });
    expect(shallow).toEqual([{ op: 'replace', path: '/list', value: items.map((_, i) => ({ i, secure: true })) }]);
    // A resized list holding it: element by element, not one replace.
    const before = [deep, ...Array.from({ length: 20 }, (_, i) => i)];
    const after = [deep, ...Array.from({ length: 20 }, (_, i) => -i), 99];
    const ops = diff({ list: before }, { list: after });
    expect(ops.some((op) => op.op === 'replace')).toBe(false);
    expect(equal(patched({ list: before }, ops), { list: after })).toBe(true);
  });

  it('two policies beside a user-sized list answer a patch of their own size (red team: an 88 MB response, 3 s of main thread)', () => {
    const caps = Array.from({ length: 300_000 }, (_, i) => (i === 0 ? 'NET_ADMIN' : `CAP_${i}`));
    const pod = { apiVersion: 'v1', kind: 'Pod', metadata: { name: 'p', labels: {} }, spec: { containers: [{ name: 'c', securityContext: { capabilities: { add: caps } } }] } };
    const outcomes = [
      { policy: 'no-net-admin', status: 'allowed' as const, warnings: [], patch: [{ op: 'remove' as const, path: '/spec/containers/0/securityContext/capabilities/add/0' }] },
      { policy: 'team', status: 'allowed' as const, warnings: [], patch: [{ op: 'add' as const, path: '/metadata/labels/team', value: 'x' }] },
    ];
    const started = performance.now();
    const { decision } = merge(outcomes.map((outcome) => ({ policy: { name: outcome.policy, failurePolicy: 'Fail', enforcement: 'enforce' }, outcome })), 'CREATE', pod);
    expect(decision.patch).toHaveLength(2);
    expect(JSON.stringify(decision.patch).length).toBeLessThan(200);
    expect((patchedObject(pod, decision.patch) as typeof pod).spec.containers[0]!.securityContext.capabilities.add).toEqual(caps.slice(1));
    expect(performance.now() - started).toBeLessThan(3000);
  });
});

/** Every pointer into `v` (and one past each list's end, `-`, and a new key per map), for random operations. */
function pointers(v: JsonValue, prefix: string, out: string[]): string[] {
  if (prefix !== '') out.push(prefix);
  if (Array.isArray(v)) {
    v.forEach((x, i) => pointers(x, `${prefix}/${i}`, out));
    out.push(`${prefix}/-`, `${prefix}/${v.length}`);
  } else if (v !== null && typeof v === 'object') {
    for (const [k, x] of Object.entries(v)) pointers(x, `${prefix}/${k}`, out);
    out.push(`${prefix}/n0`, `${prefix}/__proto__`);
  }
  return out;
}

function operation(rnd: () => number, original: JsonValue): PatchOperation {
  const all = pointers(original, '', []);
  const at = () => all[Math.floor(rnd() * all.length)]!;
  switch (Math.floor(rnd() * 6)) {
    case 0: case 1: return { op: 'add', path: at(), value: value(rnd, 2) };
    case 2: return { op: 'replace', path: at(), value: value(rnd, 2) };
    case 3: return { op: 'remove', path: at() };
    case 4: return { op: 'move', from: at(), path: at() };
    default: return { op: 'copy', from: at(), path: at() };
  }
}

function deepFreeze<T>(v: T): T {
  if (v !== null && typeof v === 'object') for (const x of Object.values(v)) deepFreeze(x);
  return Object.freeze(v);
}

describe('combinePatches on random patches of two and three policies', () => {
  it('never changes the original, never throws, and returns a patch that applies to it (3,000 cases)', () => {
    for (let seed = 1; seed <= 3000; seed++) {
      const rnd = random(seed);
      const original = deepFreeze({ metadata: { name: 'n', labels: value(rnd, 2) }, spec: value(rnd, 0) }) as JsonValue;
      const patches = Array.from({ length: 2 + Math.floor(rnd() * 2) }, (_, i) => ({
        policy: `p${i}`, operations: Array.from({ length: 1 + Math.floor(rnd() * 3) }, () => operation(rnd, original)),
      }));
      const name = () => `seed ${seed}: ${JSON.stringify(original)} with ${JSON.stringify(patches)}`;
      let combined: ReturnType<typeof combinePatches>;
      try {
        // Frozen: a write into the original (or a subtree shared with it) throws here.
        combined = combinePatches(original, patches);
      } catch (error) {
        expect.fail(`${name()}: threw ${String(error)}`);
      }
      try {
        patched(original, combined.patch);
      } catch (error) {
        expect.fail(`${name()}: its patch ${JSON.stringify(combined.patch)} does not apply: ${String(error)}`);
      }
      const rejected = new Set(combined.rejected.map((r) => r.policy));
      if (patches.every((p) => rejected.has(p.policy)) && combined.patch.length > 0) expect.fail(`${name()}: every policy rejected, yet a patch`);
    }
  });
});

describe('numbers the host cannot write back exactly (red team)', () => {
  // The original as the host reads it: JSON.parse rounds 9223372036854775807 (int64's largest).
  const containers = (n: number): JsonValue => JSON.parse(`{"spec":{"containers":[${Array.from({ length: n }, (_, i) => `{"name":"c${i}","seed":9223372036854775807}`).join(',')}]}}`) as JsonValue;
  const touched = (ops: PatchOperation[]) => JSON.stringify(ops).includes('9223372036854776000');

  it('walks a map or list holding one instead of replacing it whole, however much changed under it', () => {
    const original = containers(70);
    const merged = JSON.parse(JSON.stringify(original)) as { spec: { containers: Record<string, JsonValue>[] } };
    for (const container of merged.spec.containers) container.resources = { limits: { cpu: '1' } };
    const ops = diff(original, merged);
    expect(touched(ops)).toBe(false);
    expect(ops).toHaveLength(70);
    expect(ops.every((op) => op.op === 'add' && /^\/spec\/containers\/\d+\/resources$/.test(op.path))).toBe(true);
    expect(equal(patched(original, ops), merged as unknown as JsonValue)).toBe(true);
    // Without such a number, the list is replaced whole as before.
    const plain = JSON.parse(JSON.stringify(original).replaceAll('9223372036854776000', '7')) as JsonValue;
    const plainMerged = JSON.parse(JSON.stringify(merged).replaceAll('9223372036854776000', '7')) as JsonValue;
    expect(diff(plain, plainMerged)).toEqual([{ op: 'replace', path: '/spec/containers', value: (plainMerged as { spec: { containers: JsonValue } }).spec.containers }]);
  });

  it('edits a resized list holding one by removes and adds, when what it inserts holds none', () => {
    const original = containers(3);
    const merged = JSON.parse(JSON.stringify(original)) as { spec: { containers: JsonValue[] } };
    // The first element replaced by two new ones: neither a pure insert nor a pure removal.
    merged.spec.containers.splice(0, 1, { name: 'new-a' }, { name: 'new-b' });
    const ops = diff(original, merged);
    expect(touched(ops)).toBe(false);
    expect(ops.map((op) => `${op.op} ${op.path}`)).toEqual(['remove /spec/containers/0', 'add /spec/containers/0', 'add /spec/containers/1']);
    expect(equal(patched(original, ops), merged as unknown as JsonValue)).toBe(true);
  });
});
