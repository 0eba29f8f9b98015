import { describe, expect, it } from 'vitest';
import { toOutcome } from '../../host/src/evaluate/evaluate.ts';
import { compactOutput, COMPACT_FROM_CHARS, decodeOutput } from '../../host/src/sandbox/outcome.ts';
import { foreignText, guestMessage, MAX_MESSAGE_LENGTH, MESSAGE_SLACK } from '../../host/src/util/text.ts';

describe('foreignText', () => {
  it('leaves plain text as it is', () => {
    expect(foreignText('application/vnd.oci.image.manifest.v1+json')).toBe('application/vnd.oci.image.manifest.v1+json');
  });

  it('shows control characters, DEL, C1, line separators and bidi overrides as \\uXXXX', () => {
    expect(foreignText('a\u001b[2Jb\nc\rd\u007fe\u0085f\u2028g\u202eh')).toBe('a\\u001b[2Jb\\u000ac\\u000dd\\u007fe\\u0085f\\u2028g\\u202eh');
  });

  it('shows zero-width characters and the byte-order mark, which make two names read the same', () => {
    expect(foreignText('\ufeffalloc a\u200bb')).toBe('\\ufeffalloc a\\u200bb');
  });

  it('cuts long text, saying how much, and mends a surrogate pair cut in half', () => {
    expect(foreignText('x'.repeat(250))).toBe(`${'x'.repeat(200)}… (50 more characters cut)`);
    expect(foreignText(`${'x'.repeat(199)}😀`, 200)).toBe(`${'x'.repeat(199)}\ufffd… (1 more characters cut)`);
  });
});

describe('guestMessage', () => {
  it('keeps a policy message\'s newlines and tabs, and shows the controls a terminal obeys as \\uXXXX (red team, session 50)', () => {
    expect(guestMessage('denied:\n\t- no team label')).toBe('denied:\n\t- no team label');
    expect(guestMessage('a\u001b[2Jb\rc\u0007d\u0000e\u007ff\u009bg\u2028h\u202ei\u200fj')).toBe('a\\u001b[2Jb\\u000dc\\u0007d\\u0000e\\u007ff\\u009bg\\u2028h\\u202ei\\u200fj');
    expect(guestMessage('👩\u200d💻')).toBe('👩\u200d💻');
    // Called again on what it made, it changes nothing.
    expect(guestMessage(guestMessage('x\u001by'))).toBe('x\\u001by');
  });

  it('cuts a long message to 4096 characters as shown, each control taking six', () => {
    expect(guestMessage(`${'x'.repeat(5000)}\u001b`)).toBe(`${'x'.repeat(4096)}… (905 more characters cut)`);
    expect(guestMessage('\u0000'.repeat(1_000_000))).toBe(`${'\\u0000'.repeat(682)}… (${1_000_000 - 682} more characters cut)`);
    expect(guestMessage(`${'x'.repeat(4090)}\u001b`)).toBe(`${'x'.repeat(4090)}\\u001b`);
    expect(guestMessage(`${'x'.repeat(4091)}\u001b`)).toBe(`${'x'.repeat(4091)}… (1 more characters cut)`);
  });

  it('passes on what it made unchanged within the slack: a worker\'s cut message is not cut again on the main thread', () => {
    for (const text of ['\u0000'.repeat(15 * 2 ** 20), 'y'.repeat(20_000), `a\u001b${'z'.repeat(4200)}`]) {
      const once = guestMessage(text);
      expect(guestMessage(once, MAX_MESSAGE_LENGTH + MESSAGE_SLACK)).toBe(once);
    }
  });
});

describe('a guest\'s denial and error messages', () => {
  it('reach the review with their controls shown, whether the answer was compacted by the worker or not', () => {
    const answer = JSON.stringify({ outcome: 'deny', message: 'no\u001b[31m way\u0007', warnings: ['w\u001bx'] });
    const direct = decodeOutput('p', answer);
    expect(direct).toMatchObject({ status: 'denied', message: 'no\\u001b[31m way\\u0007' });
    const long = JSON.stringify({ outcome: 'error', kind: 'permanent', message: `broken\u001b[2J${' '.repeat(COMPACT_FROM_CHARS)}` });
    const { output, compact } = compactOutput(long, 'validate');
    expect(compact).toBe(true);
    expect(decodeOutput('p', output, true)).toMatchObject({ status: 'failed', message: expect.stringMatching(/^broken\\u001b\[2J /) });
  });

  it('a long answer the worker cannot read is refused quoting it with its controls shown (review: the compacted error path skipped them)', () => {
    const pad = ' '.repeat(COMPACT_FROM_CHARS);
    const notJson = compactOutput(`\u001b[2Jnot json${pad}`, 'validate');
    expect(notJson.compact).toBe(true);
    expect(decodeOutput('p', notJson.output, true)).toMatchObject({ status: 'failed', message: expect.stringContaining('(\\u001b[2Jnot json') });
    const badPath = compactOutput(JSON.stringify({ outcome: 'allow', patch: [{ op: 'add', path: '\u001b]0;owned\u0007', value: 1 }], warnings: [pad] }), 'mutate');
    expect(decodeOutput('p', badPath.output, true)).toMatchObject({ status: 'failed', message: expect.stringContaining('\\u001b]0;owned\\u0007') });
    // And a compacted message that missed it on the worker's side is shown on the main thread.
    expect(decodeOutput('p', JSON.stringify({ outcome: 'deny', message: 'x\u001by' }), true)).toMatchObject({ message: 'x\\u001by' });
  });

  it('a fault\'s message and an unreadable answer\'s quote are shown the same way', () => {
    expect(toOutcome('p', { ok: false, fault: 'trap', message: 'abort: \u001b]0;owned\u0007', logs: [] })).toMatchObject({ message: 'abort: \\u001b]0;owned\\u0007' });
    expect(toOutcome('p', { ok: true, output: '\u0007\u0007 not json', compact: false, logs: [], guestMicros: 1, totalMicros: 2 }))
      .toMatchObject({ status: 'failed', message: 'returned output that is not JSON (\\u0007\\u0007 not json)' });
  });
});
