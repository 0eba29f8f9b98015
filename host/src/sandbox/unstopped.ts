// The sandbox worker threads of this process being stopped (SandboxPool #stop). Its own module,
// with nothing to import, so that the CLI's entry point can wait for them at exit without
// loading the sandbox.
const pending = new Set<Promise<unknown>>();

/** `ended`: settles when the thread has ended. */
export function stopping(ended: Promise<unknown>): void {
  pending.add(ended);
  void ended.finally(() => pending.delete(ended));
}

/** Waits up to `ms` for every thread being stopped to end; how many have not. */
export async function threadsLeft(ms: number): Promise<number> {
  if (pending.size === 0) return 0;
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([Promise.allSettled([...pending]), new Promise((resolve) => { timer = setTimeout(resolve, ms); })]);
  clearTimeout(timer);
  return pending.size;
}
