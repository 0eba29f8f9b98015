// The one retry loop of the cluster-facing code: exponential delays, a deadline or an attempt
// budget, and a predicate for which failures are worth another try. Conflicts (409) retry at
// once; network and 5xx failures wait. Every caller states its budget, so shutdown and CA
// rotation cannot retry past their grace periods.
export interface RetryPolicy {
  /** Whether this failure may pass on its own. Anything else is thrown at once. */
  retryable: (error: unknown) => boolean;
  /** At most this many attempts in all (default: until the deadline). */
  attempts?: number;
  /** Give up rather than wait past this time (ms since the epoch). */
  deadline?: number;
  /** Delay before the second attempt; doubled each time up to maxDelayMs. 0: retry at once. */
  firstDelayMs?: number;
  maxDelayMs?: number;
  /** Checked before each new attempt: stop early (shutdown). */
  stopped?: () => boolean;
  /** Injected by tests. */
  sleep?: (ms: number) => Promise<void>;
  now?: () => number;
}

export async function retry<T>(attempt: (n: number) => Promise<T>, policy: RetryPolicy): Promise<T> {
  const sleep = policy.sleep ?? ((ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms)));
  const now = policy.now ?? Date.now;
  let delay = policy.firstDelayMs ?? 0;
  for (let n = 1; ; n++) {
    try {
      return await attempt(n);
    } catch (error) {
      const outOfAttempts = policy.attempts !== undefined && n >= policy.attempts;
      const outOfTime = policy.deadline !== undefined && now() + delay > policy.deadline;
      if (!policy.retryable(error) || outOfAttempts || outOfTime || policy.stopped?.()) throw error;
    }
    if (delay > 0) await sleep(delay);
    delay = Math.min(delay * 2, policy.maxDelayMs ?? Infinity);
  }
}

/** The delay before the next background retry: 1 s, then doubling up to `maxMs`. */
export function nextBackoff(previousMs: number, maxMs: number): number {
  return previousMs === 0 ? 1_000 : Math.min(previousMs * 2, maxMs);
}
