// Reads the input the host passes to validate and mutate. Parsing the review is most of what a
// TypeScript policy costs (QuickJS parses a 5 KB Pod in about 60 µs), and most policies read a
// little of it. So a host may pass large values of the request (the object's and oldObject's
// spec, status, metadata, or either object whole) apart from the JSON:
//
//   NUL [jsonLength, [keys], length, [keys], length, …] NUL <JSON, null where each value stood> <value> <value> …
//
// and each is parsed the first time the policy reads it. With `nested-apart`, a value apart may
// be in this form itself, its keys relative to it (a Pod's spec without its containers, then
// the containers): a policy that reads spec.nodeName never parses the containers, and one that
// never reads the spec never reads that header either. Lengths count UTF-16 code units. JSON
// text never starts with NUL, so one character tells the two forms apart, and the lengths find
// each piece: a plain JSON input is never searched, and a split one only through its header
// (QuickJS's indexOf walks a string a character at a time; what that costs was not measured
// apart from the machine's noise). The host uses these forms only for modules whose metadata
// lists them; it gives the same values, in the same key order, as parsing the whole input (a
// test holds it to that).
import type { EvaluationInput, JsonValue } from './contract.ts';

export function readInput(input: string): EvaluationInput {
  return readApart(input) as unknown as EvaluationInput;
}

/** Plain JSON text, or the form above; a value apart may itself be in that form (nested-apart). */
function readApart(text: string): JsonValue {
  if (text.charCodeAt(0) !== 0) return JSON.parse(text) as JsonValue;
  const headerEnd = text.indexOf('\u0000', 1); // the header is short: this scans it alone
  const lengths = headerEnd < 0 ? [] : JSON.parse(text.slice(1, headerEnd)) as unknown[];
  const jsonLength = lengths[0];
  if (typeof jsonLength !== 'number') throw new TypeError('the input\'s header is not a list of lengths: a host bug, not the policy\'s');
  let at = headerEnd + 1;
  const root = JSON.parse(text.slice(at, at + jsonLength)) as JsonValue;
  at += jsonLength;
  for (let i = 1; i + 1 < lengths.length; i += 2) {
    const path = lengths[i];
    const length = lengths[i + 1];
    if (!Array.isArray(path) || typeof length !== 'number') throw new TypeError('the input\'s header is not a list of lengths: a host bug, not the policy\'s');
    later(root, path as string[], text, at, at + length);
    at += length;
  }
  return root;
}

/** Replaces the value at `path` (in place, keeping key order) by its value parsed from `text` [start, end) when first read. */
function later(root: JsonValue, path: string[], text: string, start: number, end: number): void {
  let target: unknown = root;
  for (let i = 0; i < path.length - 1; i++) target = (target as Record<string, unknown> | null)?.[path[i]!];
  const key = path[path.length - 1];
  if (key === undefined || typeof target !== 'object' || target === null || !Object.prototype.hasOwnProperty.call(target, key)) {
    throw new TypeError(`a value passed apart has no place at ${JSON.stringify(path)}: a host bug, not the policy's`);
  }
  // Parsed once, whoever reads it: the object, a copy made from its property descriptors, or a
  // frozen object (red team: deep-freezing the request, or Object.seal, threw where the getter
  // turned itself into a plain value). Where it can, the getter leaves a plain value behind.
  let parsed: { value: JsonValue } | undefined;
  // What was assigned to an owner that cannot take a plain value (sealed), by owner: a copy made
  // from the descriptors shares these accessors, and a write to one must not show in the other.
  let assigned: WeakMap<object, unknown> | undefined;
  const settle = (owner: object, value: unknown): void => {
    if (Object.getOwnPropertyDescriptor(owner, key)?.configurable) {
      Object.defineProperty(owner, key, { value, writable: true, enumerable: true, configurable: true });
    }
  };
  Object.defineProperty(target, key, {
    get(this: object) {
      if (assigned?.has(this)) return assigned.get(this);
      parsed ??= { value: readApart(text.slice(start, end)) };
      settle(this, parsed.value);
      return parsed.value;
    },
    set(this: object, value: unknown) {
      const own = Object.getOwnPropertyDescriptor(this, key);
      if (!own) {
        // Inherited (Object.create(spec)): as with a plain property, the write makes one on the
        // heir and leaves the original as it was (red team: it replaced the original's value).
        let owner = Object.getPrototypeOf(this) as object | null;
        while (owner !== null && !Object.prototype.hasOwnProperty.call(owner, key)) owner = Object.getPrototypeOf(owner) as object | null;
        if ((owner !== null && Object.isFrozen(owner)) || !Object.isExtensible(this)) throw new TypeError(`cannot assign to read only property '${key}'`);
        Object.defineProperty(this, key, { value, writable: true, enumerable: true, configurable: true });
        return;
      }
      if (own.configurable) return settle(this, value);
      // Sealed: still writable, as a plain value would be. Frozen: not.
      if (Object.isFrozen(this)) throw new TypeError(`cannot assign to read only property '${key}'`);
      (assigned ??= new WeakMap()).set(this, value);
    },
    enumerable: true,
    configurable: true,
  });
}
