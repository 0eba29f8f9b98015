// Reads the input the host passes to validate and mutate. Parsing the review is most of what a
// TypeScript policy costs (QuickJS parses a 5 KB Pod in about 60 µs), and most policies read a
// little of it. So a host may pass large values of the request (the object's and oldObject's
// spec, status, metadata, or either object whole) after the JSON:
//
//   <input JSON, with null where each such value stood> ( NUL <JSON Pointer> SOH <value JSON> )*
//
// and each is parsed the first time the policy reads it. Neither NUL nor SOH can occur raw in
// JSON text (control characters in strings are escaped), so they cannot be confused with it.
// The host uses this form only for modules whose metadata lists `objects-apart`; it gives the
// same values, in the same key order, as parsing the whole input (a test holds it to that).
import type { EvaluationInput, JsonValue } from './contract.ts';

const NUL = '\u0000';
const SOH = '\u0001';

export function readInput(input: string): EvaluationInput {
  let at = input.indexOf(NUL);
  if (at < 0) return JSON.parse(input) as EvaluationInput;
  const envelope = JSON.parse(input.slice(0, at)) as EvaluationInput;
  while (at >= 0) {
    const separator = input.indexOf(SOH, at + 1);
    if (separator < 0) throw new TypeError('a value passed apart has no pointer: a host bug, not the policy\'s');
    const next = input.indexOf(NUL, separator + 1);
    later(envelope, input.slice(at + 1, separator), input.slice(separator + 1, next < 0 ? input.length : next));
    at = next;
  }
  return envelope;
}

/** Replaces the value at `pointer` (in place, keeping key order) by its value parsed from `text` when first read. */
function later(envelope: EvaluationInput, pointer: string, text: string): void {
  const path = pointer.split('/').slice(1).map((segment) => segment.split('~1').join('/').split('~0').join('~'));
  const key = path.pop();
  let target: unknown = envelope;
  for (const segment of path) target = (target as Record<string, unknown> | null)?.[segment];
  if (key === undefined || typeof target !== 'object' || target === null || !Object.prototype.hasOwnProperty.call(target, key)) {
    throw new TypeError(`a value passed apart has no place at ${pointer}: a host bug, not the policy's`);
  }
  const settle = (value: unknown): void => {
    Object.defineProperty(target, key, { value, writable: true, enumerable: true, configurable: true });
  };
  Object.defineProperty(target, key, {
    get: () => {
      const value = JSON.parse(text) as JsonValue;
      settle(value);
      return value;
    },
    set: settle,
    enumerable: true,
    configurable: true,
  });
}
