// Text as it goes into responses and log lines: what a guest chooses (a denial, an error, a
// fault), cut to size, and sizes said in MiB.

/** Bytes as MiB with one decimal, for messages. */
export function mib(bytes: number): number {
  return Math.round((bytes / 2 ** 20) * 10) / 10;
}

/** The most characters of a guest's message the host passes on. */
export const MAX_MESSAGE_LENGTH = 4096;

/**
 * At most MAX_MESSAGE_LENGTH characters, saying how many were cut. A copy, not a slice: V8's
 * slice of a long string keeps the whole string alive (red team: megabytes held per message).
 */
export function cutMessage(text: string, max = MAX_MESSAGE_LENGTH): string {
  if (text.length <= max) return text;
  return `${Buffer.from(text.slice(0, max)).toString()}… (${text.length - max} more characters cut)`;
}

/** Longest a name from a request is written to the log: Kubernetes names are at most 253 characters. */
const MAX_FIELD_LENGTH = 256;

/** A request's name (namespace, user) for a log line, cut when no API server would have sent it. */
export function cutField<T extends string | undefined>(text: T): T {
  return (text === undefined ? text : cutMessage(text, MAX_FIELD_LENGTH)) as T;
}

/** What the apiserver keeps of one warning, in characters: it cuts the rest (merge/warnings.ts). */
export const MAX_WARNING_LENGTH = 256;
/**
 * Runs of the runes Go calls controls (C0, DEL, C1): the apiserver drops, without a word, a
 * warning that holds one, so each run becomes a space (merge/warnings.ts, sandbox/outcome.ts).
 */
export const WARNING_CONTROLS = /[\u0000-\u001f\u007f-\u009f]+/g;

/**
 * What a guest's denial or error message may not carry as it is: C0 controls but tab and
 * newline (a policy's message may run over lines), DEL, C1, line and paragraph separators, bidi
 * marks and overrides (not the zero-width joiner, which emoji are made with). kubectl prints the message to the user's terminal: red team (session 50), a
 * policy's ESC sequences cleared it and painted fake lines. Built from a string (see UNPRINTABLE).
 */
const MESSAGE_CONTROL = '[\\u0000-\\u0008\\u000b-\\u001f\\u007f-\\u009f\\u061c\\u200e\\u200f\\u2028\\u2029\\u202a-\\u202e\\u2066-\\u2069]';
const MESSAGE_CONTROLS = new RegExp(MESSAGE_CONTROL, 'g');
const IS_MESSAGE_CONTROL = new RegExp(MESSAGE_CONTROL);
/** Room for the note guestMessage adds to what it cut: passed on again, such a message is not cut twice. */
export const MESSAGE_SLACK = 64;
const shownControl = (c: string) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`;

/**
 * A guest's message as the host passes it on: at most `max` characters once those controls are
 * shown as \uXXXX (six each: 15 MiB of NULs must not become 24 KiB), saying how many of the
 * guest's were cut. What it made comes out the same, within MESSAGE_SLACK more characters.
 */
export function guestMessage(text: string, max = MAX_MESSAGE_LENGTH): string {
  const head = text.length > max ? text.slice(0, max) : text;
  if (!IS_MESSAGE_CONTROL.test(head)) return cutMessage(text, max);
  let kept = 0;
  for (let shown = 0; kept < head.length; kept++) {
    shown += IS_MESSAGE_CONTROL.test(head[kept]!) ? 6 : 1;
    if (shown > max) break;
  }
  // A copy (see cutMessage), which also mends a surrogate pair cut in half.
  const shown = Buffer.from(head.slice(0, kept)).toString().replace(MESSAGE_CONTROLS, shownControl);
  return kept < text.length ? `${shown}… (${text.length - kept} more characters cut)` : shown;
}

/** The most characters of a remote party's text (a registry's media type, title, error) put in a message. */
export const MAX_FOREIGN_LENGTH = 200;

// C0, DEL, C1, line/paragraph separators and bidi overrides: what can clear a terminal, forge a
// log line or reorder what an operator reads; zero-width characters and the byte-order mark, which
// make two names read the same ("\ufeffalloc" as alloc). Built from a string: a regex literal of
// control characters is what no-control-regex exists to catch by accident.
const UNPRINTABLE = new RegExp('[\\u0000-\\u001f\\u007f-\\u009f\\u200b-\\u200f\\u2028\\u2029\\u202a-\\u202e\\u2066-\\u2069\\ufeff]', 'g');

/**
 * Text chosen by someone outside (a registry), made fit for a one-line message: at most
 * `max` characters, saying how many were cut, with control characters shown as \uXXXX
 * (red team: a 4 MiB media type made 4 MiB log lines; ESC sequences cleared the terminal).
 */
export function foreignText(text: string, max = MAX_FOREIGN_LENGTH): string {
  const cut = text.length > max;
  // A copy, not a slice (see cutMessage); Buffer also mends a surrogate pair cut in half.
  const head = cut ? Buffer.from(text.slice(0, max)).toString() : text;
  const shown = head.replace(UNPRINTABLE, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
  return cut ? `${shown}… (${text.length - max} more characters cut)` : shown;
}
