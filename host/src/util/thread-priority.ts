// Threads that run work a policy chose (guests, merging their patches) run at a lower CPU
// priority than the main thread (Linux: a thread's nice value; raising it needs no privilege).
// When the cores are busy, the thread that answers the apiserver (TLS, parsing, refusals under
// overload, /healthz) is scheduled first, and policy work gets what is left.
import { readlinkSync } from 'node:fs';
import { setPriority } from 'node:os';

export const POLICY_WORK_NICE = 10;

/** Best effort: where /proc/thread-self is missing (not Linux, /proc not mounted) this does nothing. */
export function lowerThisThread(nice = POLICY_WORK_NICE): void {
  try {
    setPriority(Number(readlinkSync('/proc/thread-self').split('/').pop()), nice);
  } catch {
    // Same priority as the main thread.
  }
}
