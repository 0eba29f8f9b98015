// The calling thread's CPU time. The inline lane judges a guest by it rather than by wall time:
// a thread descheduled on a busy node loses wall time that no guest spent.

// Node 22.19 brought it. Before, a load failed with "process.threadCpuUsage is not a function",
// in a message that blamed the policy being loaded (newcomer, Node 22.12 through the SDK's tests).
const usage: typeof process.threadCpuUsage | undefined = typeof process.threadCpuUsage === 'function' ? process.threadCpuUsage.bind(process) : undefined;

/** This thread's CPU time so far (µs): user and system. About 0.3 µs a call (measured on Node 24). */
export function threadCpuMicros(): number {
  if (!usage) throw new Error(`Portcullis needs Node 22.19 or later, or Node 24; this is Node ${process.versions.node}`);
  const { user, system } = usage();
  return user + system;
}
