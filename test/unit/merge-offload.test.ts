// The patch merger combines large patches on its own thread, with the same answer as in place,
// within a deadline; a merge past it is stopped with its thread and the next one still works.
import type { JsonObject, PatchOperation } from '@portcullis/sdk';
import { afterEach, describe, expect, it } from 'vitest';
import type { Outcome } from '../../host/src/sandbox/outcome.ts';
import { merge, patchesToCombine, type Evaluated } from '../../host/src/merge/merge.ts';
import { MAX_WAITING_MERGES, MAX_WAITING_PATCH_CHARS, MergeError, OFFLOAD_ALONE_FROM_OPERATIONS, OFFLOAD_FROM_ENVELOPE_BYTES, OFFLOAD_FROM_OPERATIONS, PatchMerger, type MergedPatch } from '../../host/src/merge/offload.ts';
import { patchOperations, respond } from '../../host/src/review/respond.ts';
import { combinePatches, type PolicyPatch } from '../../host/src/merge/patches.ts';
import { niceByThread, thisThread, threadsAtNice } from '../helpers/threads.ts';

const pod = (): JsonObject => ({ apiVersion: 'v1', kind: 'Pod', metadata: { name: 'p', namespace: 'd', labels: { a: '1' } }, spec: { containers: [{ name: 'c', image: 'x' }] } });
const labels = (prefix: string, n: number): PatchOperation[] => Array.from({ length: n }, (_, i) => ({ op: 'add', path: `/metadata/labels/${prefix}${i}`, value: 'v' }));

/** Threads of this process at nice 10: the merger's (no sandbox pool runs here). */
const niceThreads = () => threadsAtNice(10).length;

/** A merged patch with its operations parsed, when the thread sent them as text. */
const decoded = ({ patch, rejected }: MergedPatch) => ({ patch: patchOperations(patch), rejected });

let merger: PatchMerger;
afterEach(() => merger?.close());

describe('the patch merger', () => {
  it('gives what combinePatches gives in place, for large patches, conflicts and __proto__ keys alike', async () => {
    merger = new PatchMerger();
    const cases: PolicyPatch[][] = [
      [{ policy: 'a', operations: labels('a', 400) }, { policy: 'b', operations: labels('b', 400) }],
      // The same label with two values: the second policy is rejected as conflicting.
      [{ policy: 'a', operations: labels('k', 300) }, { policy: 'b', operations: [...labels('b', 300), { op: 'add', path: '/metadata/labels/k7', value: 'other' }] }],
      // A key named __proto__ is data, here as there (JSON.parse makes it an own property).
      [{ policy: 'a', operations: [...labels('a', 300), ...(JSON.parse('[{"op":"add","path":"/metadata/annotations","value":{"__proto__":{"x":1}}}]') as PatchOperation[])] },
        { policy: 'b', operations: labels('b', 300) }],
    ];
    for (const patches of cases) {
      expect(patches.reduce((n, p) => n + p.operations.length, 0)).toBeGreaterThanOrEqual(OFFLOAD_FROM_OPERATIONS);
      expect(decoded(await merger.combine(pod(), patches))).toEqual(combinePatches(pod(), patches));
    }
  });

  it('with the review\'s envelope, never calls the object\'s reader on the main thread for a large merge (red team)', async () => {
    merger = new PatchMerger();
    const patches = [{ policy: 'a', operations: labels('a', 200) }, { policy: 'b', operations: labels('b', 200) }];
    const text = JSON.stringify({ request: { object: pod() } });
    const envelope = new Uint8Array(new SharedArrayBuffer(Buffer.byteLength(text)));
    envelope.set(Buffer.from(text));
    let reads = 0;
    const reader = () => (reads++, pod());
    expect(decoded(await merger.combine(reader, patches, undefined, envelope))).toEqual(combinePatches(pod(), patches));
    expect(reads).toBe(0);
    // Small patches are merged in place: read once.
    await merger.combine(reader, [{ policy: 'a', operations: labels('a', 2) }]);
    expect(reads).toBe(1);
  });

  it('merges even one small patch on its thread when the review is large, never parsing its object on the main thread (red team)', async () => {
    merger = new PatchMerger();
    const envelopeOf = (object: JsonObject) => {
      const text = JSON.stringify({ request: { object } });
      const envelope = new Uint8Array(new SharedArrayBuffer(Buffer.byteLength(text)));
      envelope.set(Buffer.from(text));
      return envelope;
    };
    // A megabyte of tiny maps with keys of their own: what costs JSON.parse the most.
    const heavy = { ...pod(), spec: { junk: Array.from({ length: OFFLOAD_FROM_ENVELOPE_BYTES / 10 }, (_, i) => ({ [`k${i}`]: 0 })) } };
    const small = { ...pod(), spec: { junk: Array.from({ length: OFFLOAD_FROM_ENVELOPE_BYTES / 24 }, (_, i) => ({ [`k${i}`]: 0 })) } };
    expect(envelopeOf(heavy).length).toBeGreaterThanOrEqual(OFFLOAD_FROM_ENVELOPE_BYTES);
    expect(envelopeOf(small).length).toBeLessThan(OFFLOAD_FROM_ENVELOPE_BYTES);
    const patches = [{ policy: 'a', operations: labels('a', 1) }];
    let reads = 0;
    const before = niceThreads();
    expect(decoded(await merger.combine(() => (reads++, small), patches, undefined, envelopeOf(small)))).toEqual(combinePatches(small, patches));
    expect([reads, niceThreads()]).toEqual([1, before]);
    expect(decoded(await merger.combine(() => (reads++, heavy), patches, undefined, envelopeOf(heavy)))).toEqual(combinePatches(heavy, patches));
    expect([reads, niceThreads()]).toEqual([1, before + 1]);
  });

  it('sends a large merge back as JSON text, which merge and the response carry as they are, unparsed', async () => {
    merger = new PatchMerger();
    const patches = [{ policy: 'a', operations: labels('a', 200) }, { policy: 'b', operations: labels('b', 200) }];
    const merged = await merger.combine(pod(), patches);
    const own = combinePatches(pod(), patches);
    expect(merged.patch).toEqual({ json: JSON.stringify(own.patch), length: own.patch.length });
    const evaluated: Evaluated[] = patches.map(({ policy, operations }) => ({ policy: { name: policy, failurePolicy: 'Fail', enforcement: 'enforce' }, outcome: { policy, status: 'allowed', patch: operations, warnings: [] } }));
    const { decision } = merge(evaluated, 'CREATE', pod(), merged);
    expect(decision.patch).toBe(merged.patch);
    expect(respond('admission.k8s.io/v1', 'u', decision).response.patch).toBe(respond('admission.k8s.io/v1', 'u', merge(evaluated, 'CREATE', pod()).decision).response.patch);
  });

  it('merges on a thread of its own at nice 10, below the main thread', async () => {
    const before = niceByThread();
    merger = new PatchMerger();
    await merger.combine(pod(), [{ policy: 'a', operations: labels('a', 150) }, { policy: 'b', operations: labels('b', 150) }]);
    const added = [...niceByThread()].filter(([tid]) => !before.has(tid));
    expect(added.map(([, n]) => n)).toContain(10);
    expect(niceByThread().get(thisThread())).not.toBe(10);
  });

  it('answers a review whose deadline passes mid-merge, and lets the merge run on in the same thread', async () => {
    merger = new PatchMerger();
    const heavy = [{ policy: 'a', operations: labels('a', 10_000) }, { policy: 'b', operations: labels('b', 10_000) }];
    const light = [{ policy: 'a', operations: labels('a', 200) }, { policy: 'b', operations: labels('b', 200) }];
    for (let round = 0; round < 2; round++) {
      await expect(merger.combine(pod(), heavy, 1)).rejects.toThrow(new MergeError('merging the patches took longer than the 1 ms the review had left', true));
      expect(decoded(await merger.combine(pod(), light))).toEqual(combinePatches(pod(), light));
      // One thread all along: a deadline does not cost a new one.
      expect(niceThreads()).toBe(1);
    }
    await expect(merger.combine(pod(), light, 0)).rejects.toThrow('the review\'s deadline had passed before its patches could be merged');
  });

  it('stops a merge past its hard cap with its thread; the next merge gets a new thread and its answer', async () => {
    // The cap counts from when the thread has loaded (not its start-up): 30,000 writes take 0.3 s or more, 300 a few ms.
    merger = new PatchMerger({ hardCapMs: 80 });
    const heavy = ['a', 'b', 'c'].map((p) => ({ policy: p, operations: labels(p, 10_000) }));
    await expect(merger.combine(pod(), heavy)).rejects.toThrow(new MergeError('merging the patches took longer than 80 ms', true));
    const light = [{ policy: 'a', operations: labels('a', 150) }, { policy: 'b', operations: labels('b', 150) }];
    expect(decoded(await merger.combine(pod(), light))).toEqual(combinePatches(pod(), light));
  });

  it('lets at most MAX_WAITING_MERGES reviews wait; one more fails at once, temporarily', async () => {
    merger = new PatchMerger();
    const heavy = [{ policy: 'a', operations: labels('a', 10_000) }, { policy: 'b', operations: labels('b', 10_000) }];
    const light = [{ policy: 'a', operations: labels('a', 150) }, { policy: 'b', operations: labels('b', 150) }];
    const running = merger.combine(pod(), heavy);
    const waiting = Array.from({ length: MAX_WAITING_MERGES }, () => merger.combine(pod(), light));
    const refused = await merger.combine(pod(), light).catch((error: unknown) => error);
    expect(refused).toBeInstanceOf(MergeError);
    expect(refused).toMatchObject({ temporary: true, message: expect.stringMatching(new RegExp(`^${MAX_WAITING_MERGES} other reviews' patches \\([\\d.]+ MiB of them\\) were waiting to be merged already$`)) as unknown });
    expect((await running).rejected).toEqual([]);
    for (const combined of await Promise.all(waiting)) expect(decoded(combined)).toEqual(combinePatches(pod(), light));
  });

  it('lets reviews wait with at most MAX_WAITING_PATCH_CHARS of patches (an operation counted as 64), however few', async () => {
    merger = new PatchMerger();
    const heavy = [{ policy: 'a', operations: labels('a', 10_000) }, { policy: 'b', operations: labels('b', 10_000) }];
    const running = merger.combine(pod(), heavy);
    const fit = Math.floor(MAX_WAITING_PATCH_CHARS / (20_000 * 64));
    const waiting = Array.from({ length: fit }, () => merger.combine(pod(), heavy));
    const refused = await merger.combine(pod(), heavy).catch((error: unknown) => error);
    expect(refused).toMatchObject({ temporary: true, message: `${fit} other reviews' patches (${(fit * 20_000 * 64 / 2 ** 20).toFixed(1)} MiB of them) were waiting to be merged already` });
    await running;
    expect((await Promise.all(waiting)).every((c) => c.rejected.length === 0)).toBe(true);
  }, 60_000);

  it('reads a deep object from the review\'s envelope on the thread; without one, refuses it at once, first or queued (red team, review)', async () => {
    merger = new PatchMerger();
    const depth = 5000;
    const deepText = `${'{"d":'.repeat(depth)}"leaf"${'}'.repeat(depth)}`;
    const object = JSON.parse(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","labels":{"a":"1"}},"spec":${deepText}}`) as JsonObject;
    const envelopeText = `{"webhook":"/mutate","request":{"uid":"u","object":${JSON.stringify({ ...object, spec: null }).replace('"spec":null', `"spec":${deepText}`)}}}`;
    const envelope = new Uint8Array(new SharedArrayBuffer(Buffer.byteLength(envelopeText)));
    envelope.set(Buffer.from(envelopeText));
    const patches = [{ policy: 'a', operations: labels('a', 200) }, { policy: 'b', operations: labels('b', 200) }];
    expect(() => structuredClone(object)).toThrow(RangeError);
    expect(decoded(await merger.combine(object, patches, undefined, envelope))).toEqual(combinePatches(object, patches));
    const refused = new MergeError('the object nests too deep to hand to the merging thread', true);
    await expect(merger.combine(object, patches)).rejects.toThrow(refused);
    const heavy = [{ policy: 'a', operations: labels('a', 10_000) }, { policy: 'b', operations: labels('b', 10_000) }];
    const [first, second] = await Promise.allSettled([merger.combine(pod(), heavy), merger.combine(object, patches)]);
    expect(first).toMatchObject({ status: 'fulfilled', value: { rejected: [] } });
    expect(second).toEqual({ status: 'rejected', reason: refused });
  });

  it('checks one policy\'s patch in place below OFFLOAD_ALONE_FROM_OPERATIONS, several policies\' from OFFLOAD_FROM_OPERATIONS', async () => {
    merger = new PatchMerger();
    const before = niceThreads();
    const alone = [{ policy: 'a', operations: labels('a', OFFLOAD_ALONE_FROM_OPERATIONS - 1) }];
    expect(decoded(await merger.combine(pod(), alone))).toEqual(combinePatches(pod(), alone));
    const few = [{ policy: 'a', operations: labels('a', 100) }, { policy: 'b', operations: labels('b', OFFLOAD_FROM_OPERATIONS - 101) }];
    expect(decoded(await merger.combine(pod(), few))).toEqual(combinePatches(pod(), few));
    expect(niceThreads()).toBe(before);
    const larger = [{ policy: 'a', operations: labels('a', OFFLOAD_ALONE_FROM_OPERATIONS) }];
    expect(decoded(await merger.combine(pod(), larger))).toEqual(combinePatches(pod(), larger));
    expect(niceThreads()).toBe(before + 1);
  });

  it('combines a few copies and moves of small values in place; more, or of a large value, or of one the patch made, on its thread (red team 11, review)', async () => {
    // Red team 11: 150 copies of /spec cost the main thread 10-17 ms. Review: sending every
    // single-move rename to the thread failed a burst of them on its queue.
    const wide = (): JsonObject => ({ ...pod(), data: Object.fromEntries(Array.from({ length: 2000 }, (_, i) => [`k${i}`, 'v'])) });
    const copy = (from: string, path: string): PatchOperation => ({ op: 'copy', from, path });
    const cases: [string, JsonObject, PolicyPatch[], boolean][] = [
      ['a copy of the spec', pod(), [{ policy: 'a', operations: [copy('/spec', '/metadata/annotations')] }], false],
      ['a rename beside another patch', pod(), [{ policy: 'a', operations: labels('a', 2) }, { policy: 'b', operations: [{ op: 'move', from: '/metadata/labels/a', path: '/metadata/labels/b' }] }], false],
      ['five copies', pod(), [{ policy: 'a', operations: Array.from({ length: 5 }, (_, i) => copy('/spec', `/spec/c${i}`)) }], true],
      ['a copy of 2,000 keys', wide(), [{ policy: 'a', operations: [copy('/data', '/metadata/annotations')] }], true],
      ['a copy of what the patch added', pod(), [{ policy: 'a', operations: [{ op: 'add', path: '/spec/x', value: 1 }, copy('/spec/x', '/spec/y')] }], true],
    ];
    for (const [what, object, patches, onThread] of cases) {
      merger = new PatchMerger();
      const before = niceThreads();
      expect(decoded(await merger.combine(object, patches)), what).toEqual(combinePatches(object, patches));
      expect(niceThreads() - before, what).toBe(onThread ? 1 : 0);
      await merger.close();
    }
  });

  it('fails merges still waiting when closed, and combines later ones in place', async () => {
    merger = new PatchMerger();
    const heavy = [{ policy: 'a', operations: labels('a', 10_000) }, { policy: 'b', operations: labels('b', 10_000) }];
    const pending = merger.combine(pod(), heavy).catch((error: unknown) => error);
    await merger.close();
    expect(await pending).toEqual(new MergeError('the host is shutting down', true));
    const light = [{ policy: 'a', operations: labels('a', 300) }];
    expect(decoded(await merger.combine(pod(), light))).toEqual(combinePatches(pod(), light));
  });
});

describe('merge with patches combined by its caller', () => {
  const ev = (outcome: Outcome, extra: Partial<Evaluated['policy']> = {}): Evaluated => ({ policy: { name: outcome.policy, failurePolicy: 'Fail', enforcement: 'enforce', ...extra }, outcome });
  const allowed = (name: string, patch: PatchOperation[]): Outcome => ({ policy: name, status: 'allowed', patch, warnings: [] });

  it('hands out exactly the patches it would combine: none once the review is denied, none for DELETE', () => {
    const two = [ev(allowed('a', labels('a', 2))), ev(allowed('b', labels('b', 2)))];
    expect(patchesToCombine(two, 'CREATE', pod()).map((p) => p.policy)).toEqual(['a', 'b']);
    expect(patchesToCombine(two, 'DELETE', pod())).toEqual([]);
    const denied: Outcome = { policy: 'no', status: 'denied', code: 403, message: 'no', warnings: [] };
    expect(patchesToCombine([...two, ev(denied)], 'CREATE', pod())).toEqual([]);
    expect(patchesToCombine([...two, ev(denied, { enforcement: 'warn' })], 'CREATE', pod())).toHaveLength(2);
    const crashed: Outcome = { policy: 'x', status: 'failed', failure: 'crash', message: 'x', warnings: [] };
    expect(patchesToCombine([...two, ev(crashed)], 'CREATE', pod())).toEqual([]);
    expect(patchesToCombine([...two, ev(crashed, { failurePolicy: 'Ignore' })], 'CREATE', pod())).toHaveLength(2);
    expect(patchesToCombine([...two, ev(allowed('audit', labels('c', 1)), { enforcement: 'audit' })], 'CREATE', pod())).toHaveLength(2);
  });

  it('reads the object through a reader only to merge in place; whether there is one comes from the reader (red team)', () => {
    const two = [ev(allowed('a', labels('a', 2))), ev(allowed('b', labels('b', 2)))];
    const unread = (present: boolean) => Object.assign(() => {
      throw new Error('the object was read');
    }, { present });
    expect(patchesToCombine(two, 'CREATE', unread(true))).toHaveLength(2);
    expect(patchesToCombine(two, 'CREATE', unread(false))).toEqual([]);
    // Combined by the caller (the merger's thread): the object is never read here.
    const given = combinePatches(pod(), patchesToCombine(two, 'CREATE', pod()));
    expect(merge(two, 'CREATE', unread(true), given).decision.patch).toEqual(given.patch);
    // No patch: not read either.
    expect(merge([ev(allowed('a', []))], 'CREATE', unread(true)).decision.allowed).toBe(true);
    const reads: number[] = [];
    const reader = Object.assign(() => (reads.push(1), pod()), { present: true });
    expect(merge(two, 'CREATE', reader).decision.patch).toEqual(given.patch);
    expect(reads).toHaveLength(1);
  });

  it('uses the combined patch it is given, rejections included, as it would its own', () => {
    const two = [ev(allowed('a', labels('a', 2))), ev(allowed('b', [{ op: 'add', path: '/metadata/labels/a0', value: 'other' }]))];
    const own = merge(two, 'CREATE', pod());
    const given = merge(two, 'CREATE', pod(), combinePatches(pod(), patchesToCombine(two, 'CREATE', pod())));
    expect(given).toEqual(own);
    expect(own.decision).toMatchObject({ allowed: false, status: { code: 500, message: 'policy "b": its patch conflicts with policy "a" at /metadata/labels/a0' } });
  });
});
