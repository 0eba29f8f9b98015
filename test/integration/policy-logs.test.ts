// What a policy logs (ctx.log, console) reaches the host's log naming the policy and request,
// `portcullis run`'s stderr, and the SDK's test results; a chatty policy is held to a budget.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { evaluatePolicy } from '../../host/src/evaluate/evaluate.ts';
import { SandboxPool } from '../../host/src/sandbox/pool.ts';
import { LineBudget } from '../../host/src/server/telemetry.ts';
import { cli } from '../helpers/cli.ts';
import { input, load, wasm } from '../helpers/policies.ts';
import { admissionReview, startServer } from '../helpers/server.ts';
import { request, testPolicy } from '../../sdk/src/testing.ts';

let pool: SandboxPool;
beforeAll(() => { pool = new SandboxPool(1); });
afterAll(() => pool.close());

const LINES = [
  ['info', 'plain {"a":1} 2'], ['warn', 'careful'], ['error', 'cycle [object Object]'], ['debug', 'from ctx.log'],
];

describe('a TypeScript policy logging', () => {
  it('has a console that writes to the host log at its level, as ctx.log does', async () => {
    const outcome = await evaluatePolicy(pool, await load(pool, 'logger'), 'validate', input());
    expect(outcome).toMatchObject({ status: 'allowed', logs: LINES });
  });

  it('reaches the server log with the policy and the request uid', async () => {
    const server = await startServer(`policies:\n  - name: logger\n    module: ${wasm('logger')}\n`);
    try {
      const review = admissionReview({ kind: 'ConfigMap', metadata: { name: 'c' } });
      expect((await server.post('/validate/logger', review)).body.response.allowed).toBe(true);
      const lines = server.logs.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.msg === 'policy log');
      expect(lines.map((l) => [l.level, l.message])).toEqual(LINES);
      expect(lines.every((l) => l.policy === 'logger' && l.uid === review.request.uid)).toBe(true);
    } finally {
      await server.close();
    }
  });

  it('is in the SDK test helper\'s results', async () => {
    const policy = await testPolicy(wasm('logger'));
    try {
      expect((await policy.validate(request())).logs).toEqual(LINES.map(([level, message]) => ({ level, message })));
    } finally {
      await policy.close();
    }
  });

  it('is printed by portcullis run on stderr', async () => {
    const result = await cli(['run', '--policy', wasm('logger'), '--request', '-'], {
      input: JSON.stringify({ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'c', namespace: 'default' } }),
    });
    expect(result.code, result.stderr).toBe(0);
    expect(result.stderr).toContain('policy "logger" info: plain {"a":1} 2\n');
    expect(result.stderr).toContain('policy "logger" debug: from ctx.log\n');
  });
});

describe('LineBudget', () => {
  it('admits so many lines a second per key, then says how many it held back', () => {
    let now = 0;
    const budget = new LineBudget(2, 1000, () => now);
    expect([budget.admit('p'), budget.admit('p'), budget.admit('p'), budget.admit('p')]).toEqual([0, 0, undefined, undefined]);
    expect(budget.admit('q')).toBe(0);
    now = 1000;
    expect(budget.admit('p')).toBe(2);
    expect(budget.admit('p')).toBe(0);
  });
});
