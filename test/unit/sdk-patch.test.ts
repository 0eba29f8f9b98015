import { describe, expect, it } from 'vitest';
import { Patch, PatchError, type JsonObject } from '@portcullis/sdk';
import { applyOperation } from '../../sdk/src/patch.ts';

const original = () => ({ metadata: { name: 'x', labels: { a: '1' } }, spec: { list: [1, 2], replicas: 1 } });

describe('Patch (Kopf-style)', () => {
  it('adds, replaces, and skips unchanged values', () => {
    const patch = new Patch(original()).set('/spec/replicas', 3).set(['metadata', 'labels', 'b'], '2').set(['metadata', 'name'], 'x');
    expect(patch.operations).toEqual([
      { op: 'replace', path: '/spec/replicas', value: 3 },
      { op: 'add', path: '/metadata/labels/b', value: '2' },
    ]);
  });

  it('creates missing parents once, then writes inside them', () => {
    const patch = new Patch(original()).set(['metadata', 'annotations', 'x'], '1').set(['metadata', 'annotations', 'y'], '2');
    expect(patch.operations).toEqual([
      { op: 'add', path: '/metadata/annotations', value: { x: '1' } },
      { op: 'add', path: '/metadata/annotations/y', value: '2' },
    ]);
    expect(patch.result).toMatchObject({ metadata: { annotations: { x: '1', y: '2' } } });
  });

  it('deletes with null, and ignores deleting what is absent', () => {
    expect(new Patch(original()).set('/metadata/labels/a', null).remove('/metadata/labels/zz').remove('/nope/deeper').operations).toEqual([{ op: 'remove', path: '/metadata/labels/a' }]);
  });

  it('merges like RFC 7386', () => {
    const patch = new Patch(original()).merge({ metadata: { labels: { a: null, c: '3' } }, spec: { replicas: 2 } });
    expect(patch.result).toEqual({ metadata: { name: 'x', labels: { c: '3' } }, spec: { list: [1, 2], replicas: 2 } });
  });

  it('escapes JSON pointer segments', () => {
    expect(new Patch(original()).set(['metadata', 'labels', 'example.com/a~b'], 'v').operations[0]!.path).toBe('/metadata/labels/example.com~1a~0b');
  });

  it('accepts raw RFC 6902 operations and refuses ones that do not apply', () => {
    const patch = new Patch(original()).apply({ op: 'add', path: '/spec/list/-', value: 3 }, { op: 'move', from: '/spec/replicas', path: '/spec/count' });
    expect(patch.result).toEqual({ metadata: { name: 'x', labels: { a: '1' } }, spec: { list: [1, 2, 3], count: 1 } });
    expect(() => new Patch(original()).apply({ op: 'replace', path: '/spec/nope', value: 1 })).toThrow(PatchError);
    expect(() => new Patch(original()).apply({ op: 'test', path: '/spec/replicas', value: 2 })).toThrow('the value differs');
  });

  it('never changes the object it was given', () => {
    const object = original();
    new Patch(object).set('/spec/replicas', 9).remove('/metadata/labels/a');
    expect(object).toEqual(original());
  });

  it('never changes the object it was given, even deep inside lists, after moves, or when it is frozen', () => {
    const deepFreeze = <T>(value: T): T => {
      if (typeof value === 'object' && value !== null) for (const child of Object.values(Object.freeze(value))) deepFreeze(child);
      return value;
    };
    const given = (): JsonObject => ({ spec: { containers: [{ name: 'a', env: [{ name: 'X' }] }, { name: 'b' }], list: [1, 2] }, metadata: { labels: { a: '1' } } });
    for (const object of [given(), deepFreeze(given())]) {
      const patch = new Patch(object)
        .set('/spec/containers/0/env/0/value', 'v').set('/spec/containers/1/name', 'c')
        .apply({ op: 'move', from: '/spec/list/0', path: '/metadata/first' }, { op: 'copy', from: '/spec/containers/1', path: '/spec/containers/-' })
        .remove('/metadata/labels/a');
      expect(object).toEqual(given());
      expect(patch.result).toEqual({
        spec: { containers: [{ name: 'a', env: [{ name: 'X', value: 'v' }] }, { name: 'c' }, { name: 'c' }], list: [2] }, metadata: { labels: {}, first: 1 },
      });
      // What it reports is a copy: changing it changes neither the patch nor the object given.
      (patch.result as { spec: { list: number[] } }).spec.list.push(9);
      expect((patch.result as { spec: { list: number[] } }).spec.list).toEqual([2]);
    }
  });

  it('copies only what an operation goes through: the rest stays shared and unread', () => {
    let reads = 0;
    const containers = [{ name: 'a' }];
    const object = { metadata: { labels: {} }, spec: { nodeName: 'n' } };
    // A value apart not read yet (sdk/src/input.ts) is an accessor like this one.
    Object.defineProperty(object.spec, 'containers', { get: () => { reads++; return containers; }, enumerable: true, configurable: true });
    const patch = new Patch(object).set(['metadata', 'labels', 'team'], 'x').set('/spec/nodeName', 'm');
    expect(patch.operations).toEqual([{ op: 'add', path: '/metadata/labels/team', value: 'x' }, { op: 'replace', path: '/spec/nodeName', value: 'm' }]);
    expect(reads).toBe(0);
    expect(object.metadata.labels).toEqual({});
    expect(object.spec.nodeName).toBe('n');
  });

  it('takes a key named __proto__ as a key, never as the prototype', () => {
    const patch = new Patch({ metadata: { labels: {} } }).set(['metadata', 'labels', '__proto__'], 'x').set(['metadata', '__proto__'], { polluted: 'yes' });
    const labels = (patch.result as { metadata: { labels: Record<string, unknown> } }).metadata.labels;
    expect(Object.hasOwn(labels, '__proto__')).toBe(true);
    expect(Object.getPrototypeOf(labels)).toBe(Object.prototype);
    expect(({} as Record<string, unknown>).polluted).toBeUndefined();
  });

  it('refuses to patch when the request has no object', () => {
    expect(() => new Patch(null).set('/a', 1)).toThrow('this request has no object to patch');
  });

  it('moves within a list without writing into the object given (the add goes where its path points after the removal)', () => {
    const given = { spec: { list: [{ n: 0 }, { n: 1 }, { n: 2 }] } };
    const patch = new Patch(given).apply({ op: 'move', from: '/spec/list/0', path: '/spec/list/1/x' });
    expect(given).toEqual({ spec: { list: [{ n: 0 }, { n: 1 }, { n: 2 }] } });
    expect(patch.result).toEqual({ spec: { list: [{ n: 1 }, { n: 2, x: { n: 0 } }] } });
    expect(() => new Patch(given).apply({ op: 'move', from: '/spec/list/0', path: '/spec/list/0/x' })).toThrow('cannot move a value into itself');
  });

  it('changes nothing when an operation cannot apply: a move whose add fails keeps its value where it was', () => {
    const patch = new Patch({ spec: { a: { keep: 1 }, list: [1, 2] } });
    expect(() => patch.apply({ op: 'move', from: '/spec/a', path: '/spec/missing/b' })).toThrow(PatchError);
    expect(() => patch.apply({ op: 'move', from: '/spec/list/0', path: '/spec/list/5' })).toThrow('index out of range');
    patch.set('/spec/a/x', 1);
    expect(patch.operations).toEqual([{ op: 'add', path: '/spec/a/x', value: 1 }]);
    expect(patch.result).toEqual({ spec: { a: { keep: 1, x: 1 }, list: [1, 2] } });
  });

  it('records copies: changing a value or an operation after passing it does not change the patch', () => {
    const value = { a: '1' };
    const op = { op: 'add' as const, path: '/spec/y', value: [1] as number[] };
    const patch = new Patch({ spec: {} }).set('/spec/x', value).apply(op).merge({ spec: { z: value } });
    value.a = 'changed';
    op.path = '/spec/elsewhere';
    op.value.push(2);
    expect(patch.operations).toEqual([
      { op: 'add', path: '/spec/x', value: { a: '1' } }, { op: 'add', path: '/spec/y', value: [1] }, { op: 'add', path: '/spec/z', value: { a: '1' } },
    ]);
  });

  it('refuses what RFC 6902 refuses: removing an inherited name, an operation without its value', () => {
    expect(() => new Patch({ metadata: { labels: {} } }).apply({ op: 'remove', path: '/metadata/labels/constructor' })).toThrow('the path does not exist');
    expect(() => new Patch({ spec: {} }).apply({ op: 'test', path: '/spec' } as never)).toThrow('needs a "value"');
    expect(() => new Patch({ spec: {} }).apply({ op: 'copy', path: '/spec/x' } as never)).toThrow('needs a string "from"');
  });

  it('compares maps by their own keys: "__proto__": {} is not any other one-key map', () => {
    const given = JSON.parse('{"spec":{"cfg":{"__proto__":{}}}}') as JsonObject;
    expect(new Patch(given).set('/spec/cfg', { mode: 'strict' }).operations).toEqual([{ op: 'replace', path: '/spec/cfg', value: { mode: 'strict' } }]);
    expect(() => new Patch(given).apply({ op: 'test', path: '/spec/cfg', value: { mode: 'strict' } })).toThrow('the value differs');
  });

  it('merges a map into nothing without its null members (RFC 7386)', () => {
    const patch = new Patch({ metadata: { name: 'x' } }).merge({ metadata: { labels: { old: null, team: 'a', nested: { gone: null } } } });
    expect(patch.operations).toEqual([{ op: 'add', path: '/metadata/labels', value: { team: 'a', nested: {} } }]);
  });

  it('applyOperation handles array insertion and bounds', () => {
    expect(applyOperation([1, 3], { op: 'add', path: '/1', value: 2 })).toEqual([1, 2, 3]);
    expect(() => applyOperation([1], { op: 'add', path: '/5', value: 2 })).toThrow('index out of range');
  });
});

describe('Patch: lists it has to create', () => {
  it('appends with "-" under a missing list by creating the list, as a pointer or as segments', () => {
    const pod = { spec: { containers: [{ name: 'a' }] } };
    const patch = new Patch(pod).set('/spec/containers/0/env/-', { name: 'A', value: 'ü' }).set(['spec', 'tolerations', '-'], { key: 'k', operator: 'Exists' });
    // The empty list first, then the append: another policy appending there composes with it.
    expect(patch.operations).toEqual([
      { op: 'add', path: '/spec/containers/0/env', value: [] },
      { op: 'add', path: '/spec/containers/0/env/-', value: { name: 'A', value: 'ü' } },
      { op: 'add', path: '/spec/tolerations', value: [] },
      { op: 'add', path: '/spec/tolerations/-', value: { key: 'k', operator: 'Exists' } },
    ]);
    expect(patch.result).toEqual({ spec: { containers: [{ name: 'a', env: [{ name: 'A', value: 'ü' }] }], tolerations: [{ key: 'k', operator: 'Exists' }] } });
    // The maps missing above it come with it; what follows the "-" is the appended element.
    expect(new Patch({ spec: {} }).set('/spec/template/volumes/-/name', 'v').operations).toEqual([
      { op: 'add', path: '/spec/template', value: { volumes: [] } },
      { op: 'add', path: '/spec/template/volumes/-', value: { name: 'v' } },
    ]);
    // Once it exists, "-" appends to it.
    expect(patch.set(['spec', 'tolerations', '-'], { key: 'j' }).operations.at(-1)).toEqual({ op: 'add', path: '/spec/tolerations/-', value: { key: 'j' } });
  });

  it('creates a list for the number 0 in a segment array, refuses any other number, and keeps numeric strings as map keys', () => {
    expect(new Patch({ spec: {} }).set(['spec', 'tolerations', 0, 'key'], 'k').operations).toEqual([{ op: 'add', path: '/spec/tolerations', value: [{ key: 'k' }] }]);
    expect(() => new Patch({ spec: {} }).set(['spec', 'tolerations', 2, 'key'], 'k')).toThrow(PatchError);
    expect(() => new Patch({ spec: {} }).set(['spec', 'tolerations', 2, 'key'], 'k')).toThrow(/no list at \/spec\/tolerations to hold element 2/);
    expect(new Patch({ metadata: {} }).set('/metadata/labels/0', 'x').operations).toEqual([{ op: 'add', path: '/metadata/labels', value: { 0: 'x' } }]);
    // The same with a "-" further on: the list for 0, the refusal for any other (red team).
    expect(new Patch({ spec: {} }).set(['spec', 'initContainers', 0, 'env', '-'], { name: 'A' }).operations).toEqual([
      { op: 'add', path: '/spec/initContainers', value: [{ env: [] }] },
      { op: 'add', path: '/spec/initContainers/0/env/-', value: { name: 'A' } },
    ]);
    expect(() => new Patch({ spec: {} }).set(['spec', 'a', 3, '-'], 1)).toThrow(/no list at \/spec\/a to hold element 3/);
  });
});
