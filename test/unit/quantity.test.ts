import { expect, it } from 'vitest';
import { formatQuantity, parseQuantity, scaleQuantity } from '@portcullis/sdk';

it('parses Kubernetes quantities', () => {
  expect(parseQuantity('500m').value).toBeCloseTo(0.5);
  expect(parseQuantity('1').value).toBe(1);
  expect(parseQuantity('128Mi')).toEqual({ value: 128 * 2 ** 20, format: 'binary' });
  expect(parseQuantity('1Gi').value).toBe(2 ** 30);
  expect(parseQuantity('1.5G').value).toBe(1.5e9);
  expect(parseQuantity('2e3').value).toBe(2000);
  expect(() => parseQuantity('lots')).toThrow('"lots" is not a Kubernetes quantity');
  expect(() => parseQuantity('1.2.3Mi')).toThrow();
});

it('prints results in the style of the input', () => {
  expect(scaleQuantity('500m', 0.5)).toBe('250m');
  expect(scaleQuantity('1', 0.5)).toBe('500m');
  expect(scaleQuantity('2', 0.5)).toBe('1');
  expect(scaleQuantity('1Gi', 0.25)).toBe('256Mi');
  expect(scaleQuantity('100Mi', 0.3)).toBe('30Mi');
  expect(scaleQuantity('1Mi', 0.3)).toBe('314573');
  expect(scaleQuantity('1G', 0.25)).toBe('250M');
  expect(formatQuantity({ value: 1536, format: 'binary' })).toBe('1536');
  expect(formatQuantity({ value: 3 * 2 ** 10, format: 'binary' })).toBe('3Ki');
});
