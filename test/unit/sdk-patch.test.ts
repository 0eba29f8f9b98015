import { describe, expect, it } from 'vitest';
import { Patch, PatchError } from '@portcullis/sdk';
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

  it('refuses to patch when the request has no object', () => {
    expect(() => new Patch(null).set('/a', 1)).toThrow('this request has no object to patch');
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
    expect(patch.operations).toEqual([
      { op: 'add', path: '/spec/containers/0/env', value: [{ name: 'A', value: 'ü' }] },
      { op: 'add', path: '/spec/tolerations', value: [{ key: 'k', operator: 'Exists' }] },
    ]);
    // Once it exists, "-" appends to it.
    expect(patch.set(['spec', 'tolerations', '-'], { key: 'j' }).operations.at(-1)).toEqual({ op: 'add', path: '/spec/tolerations/-', value: { key: 'j' } });
  });

  it('creates a list for the number 0 in a segment array, refuses any other number, and keeps numeric strings as map keys', () => {
    expect(new Patch({ spec: {} }).set(['spec', 'tolerations', 0, 'key'], 'k').operations).toEqual([{ op: 'add', path: '/spec/tolerations', value: [{ key: 'k' }] }]);
    expect(() => new Patch({ spec: {} }).set(['spec', 'tolerations', 2, 'key'], 'k')).toThrow(PatchError);
    expect(() => new Patch({ spec: {} }).set(['spec', 'tolerations', 2, 'key'], 'k')).toThrow(/no list at \/spec\/tolerations to hold element 2/);
    expect(new Patch({ metadata: {} }).set('/metadata/labels/0', 'x').operations).toEqual([{ op: 'add', path: '/metadata/labels', value: { 0: 'x' } }]);
  });
});
