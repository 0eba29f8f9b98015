// Real policies, evaluated in parallel in the pool, merged: composition, conflicts, determinism.
import { afterAll, beforeAll, expect, it } from 'vitest';
import jsonpatch from 'fast-json-patch';
import { evaluatePolicy } from '../../host/src/evaluate/evaluate.ts';
import { merge } from '../../host/src/merge/merge.ts';
import type { LoadedPolicy } from '../../host/src/policy/loaded.ts';
import type { Mode } from '@portcullis/sdk';
import { SandboxPool } from '../../host/src/sandbox/pool.ts';
import { input, load } from '../helpers/policies.ts';

let pool: SandboxPool;
let mutators: LoadedPolicy[];
let validators: LoadedPolicy[];
beforeAll(async () => {
  pool = new SandboxPool(2);
  mutators = await Promise.all([
    load(pool, 'added-by', { settings: { value: 'portcullis' } }),
    load(pool, 'require-labels', { settings: { labels: { team: 'unowned' } } }),
    load(pool, 'resources-oversell', { settings: { cpuFactor: 0.5, memoryFactor: 0.5 } }),
    load(pool, 'numbers'),
  ]);
  validators = await Promise.all([
    load(pool, 'numbers'),
    load(pool, 'require-labels', { settings: { labels: { team: 'unowned' } } }),
    load(pool, 'no-delete'),
    load(pool, 'show-auth'),
  ]);
});
afterAll(() => pool.close());

const pod = { apiVersion: 'v1', kind: 'Pod', metadata: { name: 'web' }, spec: { numbers: [5, '300'], containers: [{ name: 'c', resources: { limits: { cpu: '1', memory: '1Gi' } } }] } };

async function review(policies: LoadedPolicy[], mode: Mode) {
  const evaluation = input({ object: pod });
  const outcomes = await Promise.all(policies.map((p) => evaluatePolicy(pool, p, mode, evaluation)));
  return merge(policies.map((p, i) => ({ policy: p, outcome: outcomes[i]! })), 'CREATE', pod).decision;
}

it('composes the patches of several mutating policies into one that applies', async () => {
  const decision = await review(mutators, 'mutate');
  expect(decision.allowed).toBe(true);
  const patched = jsonpatch.applyPatch(structuredClone(pod), decision.patch as jsonpatch.Operation[], true).newDocument;
  expect(patched).toEqual({
    ...pod,
    metadata: { name: 'web', annotations: { 'portcullis.dev/added-by': 'portcullis' }, labels: { team: 'unowned' } },
    spec: { numbers: [5, 300], containers: [{ name: 'c', resources: { limits: { cpu: '1', memory: '1Gi' }, requests: { cpu: '500m', memory: '512Mi' } } }] },
  });
});

it('reports two policies writing one annotation differently as a conflict', async () => {
  const other = await load(pool, 'added-by-other', { file: 'added-by', settings: { value: 'someone-else' } });
  const decision = await review([mutators[0]!, other], 'mutate');
  expect(decision).toMatchObject({
    allowed: false,
    status: { code: 500, message: 'policy "added-by-other": its patch conflicts with policy "added-by" at /metadata/annotations/portcullis.dev~1added-by' },
  });
});

it('gives the same response for the same inputs, 100 times over', async () => {
  const first = JSON.stringify(await review(validators, 'validate'));
  expect(JSON.parse(first)).toMatchObject({ allowed: false, status: { code: 499 } });
  for (let i = 0; i < 100; i++) expect(JSON.stringify(await review(validators, 'validate'))).toBe(first);
  const firstPatch = JSON.stringify(await review(mutators, 'mutate'));
  for (let i = 0; i < 100; i++) expect(JSON.stringify(await review(mutators, 'mutate'))).toBe(firstPatch);
});
