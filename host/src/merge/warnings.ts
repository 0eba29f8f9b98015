// Warnings as the apiserver will accept them: it truncates each warning past 256 characters
// and drops everything after 4096 characters in total, so we do the same, deterministically,
// and keep each policy's name in front of its words.

import { MAX_WARNING_LENGTH, WARNING_CONTROLS } from '../util/text.ts';

export { MAX_WARNING_LENGTH };
export const MAX_WARNINGS_TOTAL = 4096;

interface Warning {
  text: string;
  /** The host's own words about a policy (its failure was ignored, it would deny): kept first. */
  notice: boolean;
}

/**
 * Every policy's warnings, in the order they came. When they do not all fit, the budget is
 * shared: the host's notices first, then each policy's first warning, then each one's second,
 * and so on. Filling it in arrival order let one chatty policy (or a hostile one) hide every
 * other policy's warnings, and the notices that a failure was ignored.
 */
export class WarningList {
  #byPolicy = new Map<string, { warnings: Warning[]; texts: Set<string>; size: number }>();
  #all: Warning[] = [];
  #size = 0;
  #list: string[] | undefined;

  add(policy: string, message: string, notice = false): void {
    let own = this.#byPolicy.get(policy);
    if (!own) this.#byPolicy.set(policy, own = { warnings: [], texts: new Set(), size: 0 });
    // More than could ever be kept of this policy: not even one character more would fit.
    // Checked first, since a guest may return a quarter of a million warnings (red team: ~50 ms
    // of main thread an answer, mostly the regex). Not for the host's notices, one or two a
    // policy, which come after its own warnings and must not be crowded out by them (review 9:
    // a chatty trial's "would deny" was dropped here).
    if (!notice && own.size + policy.length + 12 > MAX_WARNINGS_TOTAL) return;
    // The apiserver drops, without a word, a warning holding any rune Go calls a control: C0, DEL
    // and C1 (net.NewWarningHeader; red team 4: mis-decoded UTF-8 yields C1 characters).
    let text = `policy "${policy}": ${message}`.replace(WARNING_CONTROLS, ' ').trim();
    if (text.length > MAX_WARNING_LENGTH) {
      // Never between the halves of a surrogate pair: half an emoji reaches the apiserver as U+FFFD (red team).
      const end = MAX_WARNING_LENGTH - 1 - (isHighSurrogate(text.charCodeAt(MAX_WARNING_LENGTH - 2)) ? 1 : 0);
      text = `${text.slice(0, end)}…`;
    }
    if ((!notice && own.size + text.length > MAX_WARNINGS_TOTAL) || own.texts.has(text)) return;
    own.texts.add(text);
    const warning = { text, notice };
    own.warnings.push(warning);
    own.size += text.length;
    this.#all.push(warning);
    this.#size += text.length;
    this.#list = undefined;
  }

  get list(): string[] {
    this.#list ??= this.#size <= MAX_WARNINGS_TOTAL ? this.#all.map((w) => w.text) : this.#shared();
    return this.#list;
  }

  #shared(): string[] {
    const kept = new Set<Warning>();
    let room = MAX_WARNINGS_TOTAL;
    const take = (warning: Warning) => {
      if (warning.text.length > room) return;
      kept.add(warning);
      room -= warning.text.length;
    };
    for (const warning of this.#all) if (warning.notice) take(warning);
    const queues = [...this.#byPolicy.values()].map(({ warnings }) => warnings.filter((w) => !w.notice));
    for (let round = 0; queues.some((queue) => round < queue.length); round++) {
      for (const queue of queues) if (round < queue.length) take(queue[round]!);
    }
    return this.#all.filter((w) => kept.has(w)).map((w) => w.text);
  }
}

function isHighSurrogate(code: number): boolean {
  return code >= 0xd800 && code <= 0xdbff;
}
