// The inline lane takes a component only with glue it has reviewed (inline-lane.ts REVIEWED_GLUE):
// the glue lifts values in JavaScript, beyond the fuel's reach.
import { expect, it } from 'vitest';
import { glueHash, InlineLane, REVIEWED_GLUE } from '../../host/src/sandbox/inline-lane.ts';
import type { SandboxSpec } from '../../host/src/sandbox/protocol.ts';

const component = (glue: string): SandboxSpec => ({
  key: `p@${glue.slice(-16)}`, policy: 'p', kind: 'component', modules: {}, glue, memoryCapBytes: 2 ** 26, maxOutputBytes: 2 ** 20, fresh: false,
});

it('reads the glue\'s hash from its file name in the transpile cache', () => {
  expect(glueHash(`file:///cache/transpiled/glue/${'ab'.repeat(32)}.mjs`)).toBe('ab'.repeat(32));
  expect(glueHash('file:///elsewhere/glue.mjs')).toBe('');
  expect(glueHash(undefined)).toBe('');
});

it('keeps out a component whose glue it has not reviewed, and says why', async () => {
  const left: [string, string][] = [];
  const lane = new InlineLane(undefined, (key, reason) => left.push([key, reason]));
  const spec = component(`file:///cache/transpiled/glue/${'0'.repeat(64)}.mjs`);
  lane.want(spec);
  await new Promise((resolve) => setTimeout(resolve, 50));
  expect(lane.outReason(spec.key)).toBe('its jco glue is not the glue this SDK builds (the lane runs only glue reviewed for the main thread)');
  expect(left).toEqual([[spec.key, lane.outReason(spec.key)]]);
  expect(REVIEWED_GLUE.size).toBeGreaterThan(0);
  lane.close();
});
