// Reads the input the host passes to validate and mutate. Parsing the review is most of what a
// TypeScript policy costs (QuickJS parses a 5 KB Pod in about 60 µs), and most policies read a
// little of it. So a host may pass the request's `object` and `oldObject` apart, after the JSON:
//
//   <envelope JSON, with null where each object stood> NUL <object JSON or nothing> NUL <oldObject JSON or nothing>
//
// and each is parsed the first time the policy reads it. A raw NUL cannot occur in JSON text
// (control characters in strings are escaped), so the first NUL ends the envelope. Empty text
// means that object was not taken out: the envelope's own value stands. The host uses this form
// only for modules whose metadata lists `objects-apart`; it gives the same values as parsing
// the whole input (a test holds it to that).
import type { EvaluationInput, JsonObject } from './contract.ts';

const NUL = '\u0000';

export function readInput(input: string): EvaluationInput {
  const first = input.indexOf(NUL);
  if (first < 0) return JSON.parse(input) as EvaluationInput;
  const envelope = JSON.parse(input.slice(0, first)) as EvaluationInput;
  const second = input.indexOf(NUL, first + 1);
  if (second < 0) throw new TypeError('the input has one NUL separator, not two: a host bug, not the policy\'s');
  const request = envelope.request as unknown as Record<string, unknown>;
  if (second > first + 1) later(request, 'object', input.slice(first + 1, second));
  if (second + 1 < input.length) later(request, 'oldObject', input.slice(second + 1));
  return envelope;
}

/** Replaces `target[key]` (in place, keeping key order) by its value parsed from `text` when first read. */
function later(target: Record<string, unknown>, key: string, text: string): void {
  const settle = (value: unknown): void => {
    Object.defineProperty(target, key, { value, writable: true, enumerable: true, configurable: true });
  };
  Object.defineProperty(target, key, {
    get: () => {
      const value = JSON.parse(text) as JsonObject;
      settle(value);
      return value;
    },
    set: settle,
    enumerable: true,
    configurable: true,
  });
}
