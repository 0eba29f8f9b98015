import { describe, expect, it } from 'vitest';
import { foreignText } from '../../host/src/util/text.ts';

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
