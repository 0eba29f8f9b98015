// `portcullis bench`: one policy measured in the real sandbox.
import { describe, expect, it } from 'vitest';
import { cli } from '../helpers/cli.ts';
import { root, wasm } from '../helpers/policies.ts';

const review = `${root}test/fixtures/reviews/numbers-bad.json`;

describe('portcullis bench', () => {
  it('reports per-evaluation percentiles, throughput and memory as JSON', async () => {
    const { code, stdout } = await cli(['bench', '--policy', wasm('numbers'), '--request', review, '--iterations', '50', '--warmup', '5', '--json']);
    expect(code).toBe(0);
    const result = JSON.parse(stdout);
    expect(result).toMatchObject({ policy: 'numbers', mode: 'validate', iterations: 50, warmup: 5, memory: { memoryCapMiB: 64 } });
    expect(result.evaluation.p50).toBeGreaterThan(0);
    expect(result.evaluation.p99).toBeGreaterThanOrEqual(result.evaluation.p50);
    expect(result.guestCall.p50).toBeLessThanOrEqual(result.evaluation.p50);
    expect(result.evaluationsPerSecond).toBeGreaterThan(0);
    expect(result.memory.rssLoadedMiB).toBeGreaterThan(0);
  });

  it('prints a human summary by default', async () => {
    const { code, stdout } = await cli(['bench', '--policy', wasm('numbers'), '--request', review, '--iterations', '20', '--warmup', '2']);
    expect(code).toBe(0);
    expect(stdout).toMatch(/^policy numbers \(component\), validate, 20 evaluations after 2 warm-up/);
    expect(stdout).toMatch(/evaluation \(hop \+ guest\): p50 \d+ µs, p99 \d+ µs/);
    expect(stdout).toMatch(/\d+ evaluations\/s on one worker/);
    expect(stdout).toMatch(/process RSS: +\+[\d.]+ MiB once loaded, \+[\d.]+ MiB after the run \(a sandbox worker, its runtime and the module; the policy's own memory cap is 64 MiB\)/);
  });

  it('refuses to measure a policy that fails, saying why', async () => {
    const { code, stderr } = await cli(['bench', '--policy', wasm('trap'), '--request', review, '--iterations', '5']);
    expect(code).toBe(1);
    expect(stderr).toMatch(/^portcullis bench: policy "trap" failed on evaluation 1 \(crash\): crashed: wasm trap.*fix it before measuring it\n$/);
  });

  it('usage errors exit 2', async () => {
    const { code, stderr } = await cli(['bench', '--policy', wasm('numbers')]);
    expect(code).toBe(2);
    expect(stderr).toMatch(/^portcullis bench: usage: portcullis bench --policy/);
  });
});
