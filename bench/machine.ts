// What the benchmarks know of the machine they ran on: CPU time from /proc (theirs, a server's,
// a thread's, everyone's), the code's git state, and the machine's description. Shared by
// bench/run.ts and bench/intake.ts.
import { spawn } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { availableParallelism, cpus, release } from 'node:os';
import { root } from './policies.ts';

export const HZ = 100; // USER_HZ: /proc/stat and /proc/PID/stat count in 1/100 s

export async function machineCpu(): Promise<{ busy: number; total: number }> {
  const fields = (await readFile('/proc/stat', 'utf8')).split('\n')[0]!.trim().split(/\s+/).slice(1).map(Number);
  const total = fields.reduce((a, b) => a + b, 0);
  return { busy: total - fields[3]! - fields[4]!, total };
}

/** utime + stime of a process, or of one of its threads (`tid`: the main thread's is the pid). */
export async function processCpu(pid: number, tid?: number): Promise<number> {
  try {
    const stat = await readFile(tid === undefined ? `/proc/${pid}/stat` : `/proc/${pid}/task/${tid}/stat`, 'utf8');
    const after = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return Number(after[11]) + Number(after[12]); // utime + stime
  } catch {
    return NaN;
  }
}

export async function gitState(): Promise<string> {
  const run = (args: string[]) => new Promise<string>((resolve) => {
    const proc = spawn('git', args, { cwd: root, stdio: ['ignore', 'pipe', 'ignore'] });
    let out = '';
    proc.stdout.on('data', (d: Buffer) => (out += d.toString()));
    proc.once('close', () => resolve(out.trim()));
    proc.once('error', () => resolve(''));
  });
  const head = await run(['rev-parse', '--short', 'HEAD']);
  const dirty = (await run(['status', '--porcelain', '--', 'host', 'sdk', 'policies'])).split('\n').filter(Boolean).length;
  return head ? `${head}${dirty ? ` + ${dirty} uncommitted change(s) in host/sdk/policies` : ''}` : 'unknown';
}

export async function machine() {
  const cpuinfo = await readFile('/proc/cpuinfo', 'utf8');
  const meminfo = await readFile('/proc/meminfo', 'utf8');
  return {
    cpuModel: /model name\s*:\s*(.*)/.exec(cpuinfo)?.[1] ?? cpus()[0]?.model ?? 'unknown',
    cores: availableParallelism(),
    memoryGiB: Math.round((Number(/MemTotal:\s+(\d+)/.exec(meminfo)?.[1]) / 2 ** 20) * 10) / 10,
    node: process.version,
    kernel: release(),
  };
}
