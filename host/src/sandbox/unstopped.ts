// The sandbox worker threads of this process being stopped (SandboxPool #stop). Its own module,
// with nothing to import, so that the CLI's entry point can wait for them at exit without
// loading the sandbox.
const pending = new Map<Promise<unknown>, number>();

/** `ended`: settles when the thread has ended. */
export function stopping(ended: Promise<unknown>): void {
  pending.set(ended, performance.now());
  void ended.finally(() => pending.delete(ended));
}

/**
 * Waits until every thread being stopped has ended, or has had `ms` since it was told to stop
 * (one stuck for hours is not waited for again); how many have not ended.
 */
export async function threadsLeft(ms: number): Promise<number> {
  if (pending.size === 0) return 0;
  const until = Math.max(...pending.values()) + ms;
  let timer: NodeJS.Timeout | undefined;
  const waited = new Promise((resolve) => { timer = setTimeout(resolve, Math.max(0, until - performance.now())); });
  await Promise.race([Promise.allSettled([...pending.keys()]), waited]);
  clearTimeout(timer);
  return pending.size;
}
