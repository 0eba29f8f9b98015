// Warnings as the apiserver will accept them: it truncates each warning past 256 characters
// and drops everything after 4096 characters in total, so we do the same, deterministically,
// and keep each policy's name in front of its words.

export const MAX_WARNING_LENGTH = 256;
export const MAX_WARNINGS_TOTAL = 4096;

export class WarningList {
  #seen = new Set<string>();
  #list: string[] = [];
  #total = 0;

  add(policy: string, message: string): void {
    // Full: not even one character more would fit. Checked first, since a guest may return a
    // quarter of a million warnings (red team: ~50 ms of main thread an answer, mostly the regex).
    if (this.#total + policy.length + 12 > MAX_WARNINGS_TOTAL) return;
    // The apiserver drops, without a word, a warning holding any rune Go calls a control: C0, DEL
    // and C1 (net.NewWarningHeader; red team 4: mis-decoded UTF-8 yields C1 characters).
    let text = `policy "${policy}": ${message}`.replace(/[\u0000-\u001f\u007f-\u009f]+/g, ' ').trim();
    if (text.length > MAX_WARNING_LENGTH) {
      // Never between the halves of a surrogate pair: half an emoji reaches the apiserver as U+FFFD (red team).
      const end = MAX_WARNING_LENGTH - 1 - (isHighSurrogate(text.charCodeAt(MAX_WARNING_LENGTH - 2)) ? 1 : 0);
      text = `${text.slice(0, end)}…`;
    }
    if (this.#seen.has(text) || this.#total + text.length > MAX_WARNINGS_TOTAL) return;
    this.#seen.add(text);
    this.#list.push(text);
    this.#total += text.length;
  }

  get list(): string[] {
    return this.#list;
  }
}

function isHighSurrogate(code: number): boolean {
  return code >= 0xd800 && code <= 0xdbff;
}
