// What each form of a TypeScript guest's input costs it (issue 14; docs/policy-contract.md,
// Values apart): the same module called with the benchmark review as plain JSON, with the
// object's large members apart (objects-apart), and with large values inside those apart too
// (nested-apart). In process, no pool: one guest per example, the forms alternating round by
// round so that a slow moment of the machine does not land on one form only.
// Run: npx node bench/input-forms.ts   (taskset -c 0 in front pins it to one CPU: steadier)
import { readFile } from 'node:fs/promises';
import type { EvaluationInput } from '@portcullis/sdk';
import { DEFAULT_LIMITS } from '../host/src/config/limits.ts';
import { rawEnvelope, sharedInput } from '../host/src/evaluate/evaluate.ts';
import type { LoadedPolicy } from '../host/src/policy/loaded.ts';
import { rawRequestSpan, scanReview } from '../host/src/review/scan.ts';
import { instantiateGuest, LogBuffer } from '../host/src/sandbox/guest.ts';
import { joinInput } from '../host/src/sandbox/input.ts';
import { prepareSandbox } from '../host/src/sandbox/prepare.ts';
import { modulePath, SETTINGS, type Example } from './policies.ts';
import { podReview } from './review.ts';

const EXAMPLES: Example[] = ['show-auth', 'require-labels', 'numbers'];
const FORMS = { whole: {}, 'objects-apart': { objectsApart: true }, 'nested-apart': { objectsApart: true, nestedApart: true } } as const;
const ROUNDS = 8;
const CALLS = 1000;

const review = podReview();
const body = Buffer.from(JSON.stringify(review));
const scan = scanReview(body);

/** The input a guest of this form gets for the benchmark review, as the server builds it. */
function inputText(settings: unknown, form: keyof typeof FORMS): string {
  const input: EvaluationInput = { request: review.request as unknown as EvaluationInput['request'], settings: null, headers: {}, sslpeer: null, dryRun: false, webhook: '/validate' };
  rawEnvelope(input, body, rawRequestSpan(body, scan)!, scan);
  return joinInput(sharedInput(input, { settings, ...FORMS[form] } as unknown as LoadedPolicy));
}

const logs = new LogBuffer();
console.log(`median µs per validate call, the best of ${ROUNDS} rounds of ${CALLS}:`);
for (const example of EXAMPLES) {
  const spec = await prepareSandbox(example, await readFile(modulePath(example)), DEFAULT_LIMITS, false);
  const guest = await instantiateGuest(spec, logs);
  const forms = Object.keys(FORMS) as (keyof typeof FORMS)[];
  const inputs = forms.map((form) => inputText(SETTINGS[example] ?? {}, form));
  const best = forms.map(() => Infinity);
  for (let round = 0; round < ROUNDS; round++) {
    for (const [i, input] of inputs.entries()) {
      const times: number[] = [];
      for (let call = 0; call < CALLS; call++) {
        const started = performance.now();
        const output = await guest.call('validate', input);
        times.push(performance.now() - started);
        logs.take();
        if (call === 0 && !output.includes('"allow"')) throw new Error(`${example} (${forms[i]}): ${output}`);
      }
      times.sort((a, b) => a - b);
      best[i] = Math.min(best[i]!, times[times.length >> 1]! * 1000);
    }
  }
  console.log(`${example.padEnd(16)} ${forms.map((form, i) => `${form} ${best[i]!.toFixed(0)}`).join('   ')}`);
  guest.close();
}
