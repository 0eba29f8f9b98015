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
export function cutMessage(text: string): string {
  if (text.length <= MAX_MESSAGE_LENGTH) return text;
  return `${Buffer.from(text.slice(0, MAX_MESSAGE_LENGTH)).toString()}… (${text.length - MAX_MESSAGE_LENGTH} more characters cut)`;
}
