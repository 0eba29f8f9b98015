// Kopf's example: spec.numbers must be a list of numbers within 0..100.
// validate: strings that convert to numbers only warn; anything else, or out of range, denies (499).
// mutate: default spec.numbers to [1, 2, 3] and convert convertible strings to numbers.
import { AdmissionError, definePolicy, type JsonValue } from '@portcullis/sdk';

function asNumber(value: JsonValue): number | undefined {
  if (typeof value === 'number') return Number.isFinite(value) ? value : undefined;
  if (typeof value === 'string' && value.trim() !== '') {
    const n = Number(value);
    return Number.isFinite(n) ? n : undefined;
  }
  return undefined;
}

export default definePolicy({
  validate({ object, warnings }) {
    const spec = object?.spec;
    if (spec === undefined || spec === null || typeof spec !== 'object' || Array.isArray(spec)) return;
    const numbers = spec.numbers;
    if (numbers === undefined) return;
    if (!Array.isArray(numbers)) throw new AdmissionError('spec.numbers must be a list.', 499);
    numbers.forEach((value, index) => {
      const n = asNumber(value);
      if (n === undefined) throw new AdmissionError(`spec.numbers[${index}] is not a number: ${JSON.stringify(value)}.`, 499);
      if (typeof value === 'string') warnings.push(`spec.numbers[${index}] is a string (${JSON.stringify(value)}); it should be a number.`);
      if (n < 0 || n > 100) throw new AdmissionError('Numbers must be within 0..100.', 499);
    });
  },
  mutate({ object, patch }) {
    const spec = object?.spec;
    if (!object || (spec !== undefined && (spec === null || typeof spec !== 'object' || Array.isArray(spec)))) return;
    const numbers = spec?.numbers;
    if (numbers === undefined) {
      patch.set(['spec', 'numbers'], [1, 2, 3]);
      return;
    }
    if (!Array.isArray(numbers)) return;
    numbers.forEach((value, index) => {
      const n = asNumber(value);
      if (typeof value === 'string' && n !== undefined) patch.set(['spec', 'numbers', index], n);
    });
  },
});
