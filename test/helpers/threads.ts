// The nice value of each thread of this process (Linux): where tests check that sandbox workers
// and the patch merger run below the main thread.
import { readdirSync, readFileSync } from 'node:fs';

/** Nice value of each thread, by thread id (field 19 of /proc/self/task/<tid>/stat). */
export function niceByThread(): Map<number, number> {
  const threads = new Map<number, number>();
  for (const tid of readdirSync('/proc/self/task')) {
    const stat = readFileSync(`/proc/self/task/${tid}/stat`, 'utf8');
    // The command name (field 2) may hold spaces: count fields after its closing parenthesis.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    threads.set(Number(tid), Number(fields[16]));
  }
  return threads;
}

/** Ids of the threads at `nice`. */
export function threadsAtNice(nice: number): number[] {
  return [...niceByThread()].filter(([, n]) => n === nice).map(([tid]) => tid);
}

/** This thread's id. */
export function thisThread(): number {
  return Number(readFileSync('/proc/thread-self/stat', 'utf8').split(' ')[0]);
}
