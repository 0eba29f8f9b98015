// The calling thread's CPU time. The inline lane judges a guest by it rather than by wall time:
// a thread descheduled on a busy node loses wall time that no guest spent.

/** This thread's CPU time so far (µs): user and system. About 0.3 µs a call (measured on Node 24). */
export function threadCpuMicros(): number {
  const { user, system } = process.threadCpuUsage();
  return user + system;
}
