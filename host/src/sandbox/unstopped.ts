// The sandbox worker threads of this process being stopped (SandboxPool #stop). Its own module,
// with nothing to import, so that the CLI's entry point can wait for them at exit without
// loading the sandbox.
const pending = new Map<Promise<unknown>, number>();

/**
 * How long a thread may take to end once told to stop. One that takes longer is running a guest
 * V8 cannot interrupt, and will not end: /healthz fails (server/app.ts), and the CLI stops
 * waiting for it at exit (cli/main.ts).
 */
export const UNSTOPPED_MS = 10_000;

/** `ended`: settles when the thread has ended. */
export function stopping(ended: Promise<unknown>): void {
  pending.set(ended, performance.now());
  void ended.finally(() => pending.delete(ended));
}

/** Threads told to stop UNSTOPPED_MS ago or more that have not ended. */
export function unstoppedThreads(): number {
  const now = performance.now();
  let count = 0;
  for (const since of pending.values()) if (now - since >= UNSTOPPED_MS) count++;
  return count;
}

/** Waits until every thread being stopped has ended or had UNSTOPPED_MS (one stuck for hours is not waited for again); how many have not ended. */
export async function threadsLeft(): Promise<number> {
  if (pending.size === 0) return 0;
  const until = Math.max(...pending.values()) + UNSTOPPED_MS;
  let timer: NodeJS.Timeout | undefined;
  const waited = new Promise((resolve) => { timer = setTimeout(resolve, Math.max(0, until - performance.now())); });
  await Promise.race([Promise.allSettled([...pending.keys()]), waited]);
  clearTimeout(timer);
  return pending.size;
}
