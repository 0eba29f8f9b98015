// The one retry helper of the cluster-facing code, and the CA bundle's rotation overlap.
import { describe, expect, it } from 'vitest';
import { CaBundle } from '../../host/src/webhooks/ca-bundle.ts';
import { nextBackoff, retry } from '../../host/src/webhooks/retry.ts';

/** A clock that only moves when the helper sleeps. */
function fakeTime() {
  let now = 1_000_000;
  const slept: number[] = [];
  return { now: () => now, sleep: (ms: number) => { slept.push(ms); now += ms; return Promise.resolve(); }, slept };
}

describe('retry', () => {
  it('retries what is retryable with doubling delays, and returns the first success', async () => {
    const time = fakeTime();
    let calls = 0;
    const result = await retry(async (n) => { calls = n; if (n < 4) throw new Error('503'); return 'ok'; },
      { retryable: () => true, firstDelayMs: 250, maxDelayMs: 1_000, sleep: time.sleep, now: time.now });
    expect(result).toBe('ok');
    expect(calls).toBe(4);
    expect(time.slept).toEqual([250, 500, 1_000]);
  });

  it('throws at once what is not retryable', async () => {
    let calls = 0;
    await expect(retry(async () => { calls++; throw new Error('403'); }, { retryable: () => false })).rejects.toThrow('403');
    expect(calls).toBe(1);
  });

  it('stops at the attempt budget, at the deadline (without sleeping past it), and when stopped', async () => {
    let calls = 0;
    await expect(retry(async () => { calls++; throw new Error('409'); }, { retryable: () => true, attempts: 3 })).rejects.toThrow('409');
    expect(calls).toBe(3);
    const time = fakeTime();
    await expect(retry(async () => { throw new Error('down'); },
      { retryable: () => true, deadline: time.now() + 1_000, firstDelayMs: 300, sleep: time.sleep, now: time.now })).rejects.toThrow('down');
    expect(time.slept).toEqual([300, 600]); // a third wait (1200) would pass the deadline
    let stopped = false;
    calls = 0;
    await expect(retry(async () => { calls++; stopped = true; throw new Error('x'); }, { retryable: () => true, stopped: () => stopped })).rejects.toThrow('x');
    expect(calls).toBe(1);
  });

  it('background backoff: 1 s, then doubling up to the cap', () => {
    const delays = [0];
    for (let i = 0; i < 8; i++) delays.push(nextBackoff(delays.at(-1), 60_000));
    expect(delays.slice(1)).toEqual([1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 60_000, 60_000]);
  });
});

describe('CaBundle', () => {
  it('holds the new and the previous CA during the overlap, then only the new one', () => {
    let now = 0;
    const ca = new CaBundle('OLD', () => now);
    expect(ca.bundle()).toBe('OLD');
    expect(ca.rotate('OLD', 1_000)).toBe(false);
    expect(ca.rotate('NEW', 1_000)).toBe(true);
    expect(ca.bundle()).toBe('NEW\nOLD\n');
    now = 1_001;
    expect(ca.bundle()).toBe('NEW');
    expect(CaBundle.trusts(Buffer.from('NEW\nOLD\n').toString('base64'), 'OLD')).toBe(true);
    expect(CaBundle.trusts(undefined, 'OLD')).toBe(false);
  });
});
