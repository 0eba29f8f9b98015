// A long answer is read by the worker that ran the guest (sandbox/outcome.ts compactOutput):
// the main thread parses only the contract's members, and what it gets decodes to the very
// outcome the answer as it came would have. Red team 10: 1 MB of tiny maps in a member the host
// never reads took the main thread 130-240 ms a review.
import { describe, expect, it } from 'vitest';
import { WarningList } from '../../host/src/merge/warnings.ts';
import { COMPACT_FROM_CHARS, compactOutput, decodeOutput, MAX_PATCH_MEMBERS, MAX_PATCH_OPERATIONS, PATCH_FROM_VALIDATE, PATCH_TEXT_FROM, PATCH_TEXT_FROM_PATH_WORK } from '../../host/src/sandbox/outcome.ts';
import { operationsOf } from '../../host/src/util/patch-text.ts';

/** `answer` with a member the host never reads, long enough to be compacted. */
const padded = (answer: Record<string, unknown>) => JSON.stringify({ ...answer, x: Array.from({ length: COMPACT_FROM_CHARS / 8 }, (_, i) => ({ [i]: 0 })) });

/** What the review's answer takes of warnings (merge/warnings.ts): the worker cuts them as it would. */
function listed(warnings: string[]): string[] {
  const list = new WarningList();
  for (const warning of warnings) list.add('a-policy-name', warning);
  return list.list;
}

/**
 * The outcome decoded from the answer as it came, and from what the main thread gets (warnings
 * as the review's answer takes them), or each failure's message.
 */
function both(text: string, fn: 'validate' | 'mutate' = 'mutate'): [unknown, unknown] {
  const read = (t: string, compacted = false) => {
    try {
      const outcome = decodeOutput('p', t, compacted);
      return { ...outcome, warnings: listed(outcome.warnings), ...(outcome.status === 'allowed' ? { patch: operationsOf(outcome.patch) } : {}) };
    } catch (error) {
      return (error as Error).message;
    }
  };
  const compact = compactOutput(text, fn);
  return [read(text), read(compact.output, compact.compact)];
}

describe('compactOutput', () => {
  it('hands the main thread an answer shorter than COMPACT_FROM_CHARS as it came', () => {
    const text = JSON.stringify({ outcome: 'allow', extra: [1, 2, 3] });
    expect(compactOutput(text, 'mutate')).toEqual({ output: text, compact: false });
  });

  it('drops what the host never reads, and the outcome is the same', () => {
    const long = padded({ outcome: 'allow', warnings: ['w'], patch: [
      { op: 'add', path: '/metadata/labels/a', value: { b: [1, 'c'] }, junk: 1 }, { op: 'copy', from: '/a', path: '/b', value: 1 }, { op: 'remove', path: '/c' },
    ] });
    expect(long.length).toBeGreaterThan(COMPACT_FROM_CHARS);
    expect(compactOutput(long, 'mutate')).toEqual({
      output: '{"outcome":"allow","patch":[{"op":"add","path":"/metadata/labels/a","value":{"b":[1,"c"]}},{"op":"copy","from":"/a","path":"/b"},{"op":"remove","path":"/c"}],"warnings":["w"]}',
      compact: true,
    });
    const [before, after] = both(long);
    expect(after).toEqual(before);
  });

  it('gives the same outcome for denials, each kind of error answer, and a message past the cut', () => {
    const message = 'm'.repeat(5000);
    for (const answer of [
      { outcome: 'deny', code: 418, message, warnings: ['a', 'b'] },
      { outcome: 'deny' },
      { outcome: 'error', kind: 'permanent', message: 'p' },
      { outcome: 'error', kind: 'temporary', message },
      { outcome: 'error', kind: { a: [1, 2, 3] }, message: 'crash by an unknown kind' },
      { outcome: 'allow', warnings: Array.from({ length: 600 }, (_, i) => `w${i}`) },
    ]) {
      const [before, after] = both(padded(answer));
      expect(after).toEqual(before);
      expect(compactOutput(padded(answer), 'mutate').output.length).toBeLessThan(12_000);
    }
  });

  it('turns an answer the contract refuses into an error answer that fails the same way, and short', () => {
    const broken = [
      `${padded({ outcome: 'allow' })}garbage`,
      JSON.stringify(Array.from({ length: COMPACT_FROM_CHARS }, () => 0)),
      padded({ outcome: 'maybe' }),
      padded({ outcome: 'deny', code: 99 }),
      padded({ outcome: 'allow', patch: [{ op: 'add', path: 'no-slash', value: 1 }] }),
      padded({ outcome: 'allow', patch: [{ op: 'add', path: '/a', value: JSON.parse('{"__proto__":1}') as unknown }] }),
    ];
    for (const text of broken) {
      const [before, after] = both(text);
      expect(typeof before).toBe('string');
      // Failing outcomes: the message decodeOutput threw is the error answer's message.
      expect(after).toMatchObject({ status: 'failed', failure: 'crash', message: before });
      expect(compactOutput(text, 'mutate').output.length).toBeLessThan(1000);
    }
  });
  it('cuts a megabyte of message and of warnings in the worker, and the review\'s answer takes the same of them', () => {
    const huge = '\u0001a'.repeat(500_000);
    for (const answer of [
      { outcome: 'deny', message: huge, warnings: [huge, huge, `${'b'.repeat(300)}\u0085`, ' \t'.repeat(200), '😀'.repeat(200)] },
      { outcome: 'error', kind: 'temporary', message: huge, warnings: Array.from({ length: 512 }, () => huge.slice(0, 2000)) },
    ]) {
      const text = JSON.stringify(answer);
      const [before, after] = both(text);
      expect(after).toEqual(before);
      expect(compactOutput(text, 'mutate').output.length).toBeLessThan(200_000);
    }
  });

  it('does not hand over a patch from validate: the failure evaluate.ts gives such an answer', () => {
    const text = padded({ outcome: 'allow', warnings: ['w'], patch: [{ op: 'add', path: '/spec/x', value: 1 }] });
    const compact = compactOutput(text, 'validate');
    expect(decodeOutput('p', compact.output, compact.compact)).toEqual({ policy: 'p', status: 'failed', failure: 'crash', message: PATCH_FROM_VALIDATE, warnings: ['w'] });
    expect(compactOutput(text, 'mutate').output).toContain('"patch"');
  });
});

describe('PATCH_TEXT_FROM', () => {
  const labels = (n: number) => Array.from({ length: n }, (_, i) => ({ op: 'add', path: `/metadata/labels/l${i}`, value: 'v' }));
  const wide = (members: number) => ({ op: 'add', path: '/metadata/annotations', value: Object.fromEntries(Array.from({ length: members }, (_, i) => [`k${i}`, 'v'])) });

  it('hands over a patch of that many operations and members or more as text, which parses to the same operations', () => {
    const mixed = [...labels(PATCH_TEXT_FROM / 2), wide(PATCH_TEXT_FROM / 2 - 1)];
    for (const patch of [[wide(PATCH_TEXT_FROM - 1)], labels(PATCH_TEXT_FROM), mixed, [wide(MAX_PATCH_MEMBERS)]]) {
      const compact = compactOutput(padded({ outcome: 'allow', patch }), 'mutate');
      const outcome = decodeOutput('p', compact.output, compact.compact);
      expect(outcome.status === 'allowed' && !Array.isArray(outcome.patch)).toBe(true);
      expect(outcome).toMatchObject({ status: 'allowed', patch: { length: patch.length } });
      if (outcome.status === 'allowed') expect(operationsOf(outcome.patch)).toEqual(patch);
    }
  });

  it('keeps a patch of fewer as operations, and an answer short enough not to be read in the worker as it came', () => {
    for (const patch of [[wide(PATCH_TEXT_FROM - 2)], labels(PATCH_TEXT_FROM - 1)]) {
      const compact = compactOutput(padded({ outcome: 'allow', patch }), 'mutate');
      expect(decodeOutput('p', compact.output, compact.compact)).toMatchObject({ status: 'allowed', patch });
    }
    const short = JSON.stringify({ outcome: 'allow', patch: [{ op: 'add', path: '/spec/x', value: Array.from({ length: 4000 }, () => 0) }] });
    expect(short.length).toBeLessThan(COMPACT_FROM_CHARS);
    expect(compactOutput(short, 'mutate')).toEqual({ output: short, compact: false });
  });

  it('hands over as text a patch of few operations whose paths are long and deep (red team: 76 of them held the main thread 300 ms)', () => {
    // Keys of slashes, each escaped to ~1 in the path: what costs the combine most per character.
    const deep = (i: number) => ({ op: 'replace', path: `/spec/${Array(16).fill('~1'.repeat(30)).join('/')}/k${i}`, value: i });
    const work = (patch: { path: string }[]) => patch.reduce((n, op) => n + op.path.length * op.path.split('/').length - op.path.length, 0);
    const under = Array.from({ length: Math.floor(PATCH_TEXT_FROM_PATH_WORK / work([deep(0)])) - 1 }, (_, i) => deep(i));
    const over = [...under, deep(under.length), deep(under.length + 1)];
    expect(work(under)).toBeLessThan(PATCH_TEXT_FROM_PATH_WORK);
    expect(work(over)).toBeGreaterThanOrEqual(PATCH_TEXT_FROM_PATH_WORK);
    const read = (patch: object[]) => {
      const compact = compactOutput(padded({ outcome: 'allow', patch }), 'mutate');
      return decodeOutput('p', compact.output, compact.compact);
    };
    const text = read(over);
    expect(text.status === 'allowed' && !Array.isArray(text.patch)).toBe(true);
    if (text.status === 'allowed') expect(operationsOf(text.patch)).toEqual(over);
    expect(read(under)).toMatchObject({ status: 'allowed', patch: under });
  });
});

describe('MAX_PATCH_MEMBERS', () => {
  it('takes MAX_PATCH_OPERATIONS operations of a label each: a scalar value holds no members', () => {
    const patch = Array.from({ length: MAX_PATCH_OPERATIONS }, (_, i) => ({ op: 'add', path: `/metadata/labels/l${i}`, value: 'v' }));
    const outcome = decodeOutput('p', JSON.stringify({ outcome: 'allow', patch }));
    expect(outcome.status === 'allowed' && outcome.patch.length).toBe(MAX_PATCH_OPERATIONS);
  });

  it('refuses patch values of more members and elements than that, in one value or over many operations, at any depth', () => {
    const message = `returned a patch whose values hold more than ${MAX_PATCH_MEMBERS.toLocaleString('en')} members and elements in all; a policy may return at most that many`;
    // Red team 11: one map of 65,496 keys, ~90 ms of the main thread a review.
    const map = { op: 'add', path: '/metadata/annotations', value: Object.fromEntries(Array.from({ length: 65_496 }, (_, i) => [`k${i}`, 0])) };
    expect(() => decodeOutput('p', JSON.stringify({ outcome: 'allow', patch: [map] }))).toThrow(message);
    const many = Array.from({ length: 600 }, (_, i) => ({ op: 'add', path: `/spec/x${i}`, value: [1, 2, 3, 4, 5, 6, 7] }));
    expect(() => decodeOutput('p', JSON.stringify({ outcome: 'allow', patch: many }))).toThrow(message);
    // Just at it: a list of MAX_PATCH_MEMBERS - 1 maps, one of them holding one member.
    const at = { op: 'add', path: '/spec/x', value: [...Array.from({ length: MAX_PATCH_MEMBERS - 2 }, () => ({})), { a: 1 }] };
    expect(decodeOutput('p', JSON.stringify({ outcome: 'allow', patch: [at] })).status).toBe('allowed');
    const over = { op: 'add', path: '/spec/x', value: [...Array.from({ length: MAX_PATCH_MEMBERS - 2 }, () => ({})), { a: 1, b: 2 }] };
    expect(() => decodeOutput('p', JSON.stringify({ outcome: 'allow', patch: [over] }))).toThrow(message);
  });
});
