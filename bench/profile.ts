// Summarises the .cpuprofile files `node --cpu-prof` writes (one per thread): the functions
// with the most self time, per thread. Used by `npm run bench -- --profile <scenario>`.
import { readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { root } from './policies.ts';

interface CpuProfile {
  nodes: { id: number; callFrame: { functionName: string; url: string; lineNumber: number }; hitCount?: number }[];
  startTime: number;
  endTime: number;
  samples: number[];
  timeDeltas: number[];
}

export interface ThreadProfile {
  file: string;
  thread: string;
  /** Sampled time (ms), and the part that was not idle. */
  totalMs: number;
  busyMs: number;
  top: { fn: string; where: string; selfMs: number; pctBusy: number }[];
}

/**
 * `window` (µs on the monotonic clock, as process.hrtime) keeps only the samples taken while
 * the load ran, leaving out start-up (module compilation, policy loading).
 */
export async function summariseProfiles(dir: string, window?: { fromUs: number; toUs: number }, topN = 15): Promise<ThreadProfile[]> {
  const files = (await readdir(dir)).filter((f) => f.endsWith('.cpuprofile')).sort();
  const out: ThreadProfile[] = [];
  for (const file of files) {
    const profile = JSON.parse(await readFile(join(dir, file), 'utf8')) as CpuProfile;
    const byId = new Map(profile.nodes.map((n) => [n.id, n]));
    const self = new Map<string, { fn: string; where: string; us: number }>();
    let total = 0;
    let idle = 0;
    let at = profile.startTime;
    profile.samples.forEach((id, i) => {
      // timeDeltas[i] is the time before sample i; attribute the next delta to this sample.
      at += profile.timeDeltas[i] ?? 0;
      const us = profile.timeDeltas[i + 1] ?? 0;
      if (window && (at < window.fromUs || at > window.toUs)) return;
      const frame = byId.get(id)!.callFrame;
      total += us;
      if (frame.functionName === '(idle)') {
        idle += us;
        return;
      }
      const where = frame.url ? `${frame.url.replace(`file://${root}`, '').replace(/^.*node_modules\//, '')}:${frame.lineNumber + 1}` : '';
      const key = `${frame.functionName}|${where}`;
      const entry = self.get(key) ?? { fn: frame.functionName || '(anonymous)', where, us: 0 };
      entry.us += us;
      self.set(key, entry);
    });
    const busy = total - idle;
    // CPU.<date>.<time>.<pid>.<thread id>.<seq>.cpuprofile: thread 0 is the main thread.
    const tid = file.split('.').at(-3);
    out.push({
      file, thread: tid === '0' ? 'main' : `worker ${tid}`, totalMs: Math.round(total / 1000), busyMs: Math.round(busy / 1000),
      top: [...self.values()].sort((a, b) => b.us - a.us).slice(0, topN)
        .map((e) => ({ fn: e.fn, where: e.where, selfMs: Math.round(e.us / 1000), pctBusy: Math.round((e.us / busy) * 1000) / 10 })),
    });
  }
  return out;
}

export function renderProfiles(title: string, threads: ThreadProfile[]): string {
  const lines = [`### ${title}`, ''];
  // A process that did not run while the load did (a short-lived child) has nothing to show.
  for (const t of threads.filter((thread) => thread.totalMs > 0)) {
    lines.push(`**${t.thread}** — busy ${t.busyMs} ms of ${t.totalMs} ms sampled`, '', '| self ms | % of busy | function | where |', '|---:|---:|---|---|');
    for (const e of t.top) lines.push(`| ${e.selfMs} | ${e.pctBusy} | \`${e.fn}\` | ${e.where} |`);
    lines.push('');
  }
  return lines.join('\n');
}
