// Kubernetes resource quantities ("500m", "1", "128Mi", "1.5Gi", "2e3"), as exact as a double
// allows. Enough for policy arithmetic on requests and limits; not a full resource.Quantity.

const BINARY: Record<string, number> = { Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40, Pi: 2 ** 50, Ei: 2 ** 60 };
const DECIMAL: Record<string, number> = { n: 1e-9, u: 1e-6, m: 1e-3, '': 1, k: 1e3, M: 1e6, G: 1e9, T: 1e12, P: 1e15, E: 1e18 };
const PATTERN = /^([+-]?[0-9.]+)(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?$/;

export interface Quantity {
  /** The value in base units (cores, bytes). */
  value: number;
  /** "binary" for Ki/Mi/..., "decimal" otherwise; kept so results print in the same style. */
  format: 'binary' | 'decimal';
}

export function parseQuantity(text: string | number): Quantity {
  if (typeof text === 'number') return { value: text, format: 'decimal' };
  const match = PATTERN.exec(text.trim());
  if (!match || !/^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)$/.test(match[1]!)) throw new TypeError(`"${text}" is not a Kubernetes quantity`);
  const number = Number(match[1]);
  if (match[2]) return { value: number * 10 ** Number(match[2].slice(1)), format: 'decimal' };
  const suffix = match[3] ?? '';
  if (suffix in BINARY) return { value: number * BINARY[suffix]!, format: 'binary' };
  return { value: number * DECIMAL[suffix]!, format: 'decimal' };
}

/**
 * Prints a quantity the way kubectl would accept and a person would read it: fractions in
 * millis, whole values in the largest exact suffix of their own style (decimal k/M/G...,
 * binary Ki/Mi/Gi...), falling back to plain units.
 */
export function formatQuantity(quantity: Quantity): string {
  const { value, format } = quantity;
  if (format === 'binary') {
    const bytes = Math.round(value);
    for (const suffix of ['Ei', 'Pi', 'Ti', 'Gi', 'Mi', 'Ki']) {
      const unit = BINARY[suffix]!;
      if (bytes >= unit && bytes % unit === 0) return `${bytes / unit}${suffix}`;
    }
    return String(bytes);
  }
  const millis = Math.round(value * 1000);
  if (millis % 1000 !== 0) return `${millis}m`;
  const units = millis / 1000;
  for (const suffix of ['E', 'P', 'T', 'G', 'M', 'k']) {
    const unit = DECIMAL[suffix]!;
    if (units >= unit && units % unit === 0) return `${units / unit}${suffix}`;
  }
  return String(units);
}

export function scaleQuantity(text: string | number, factor: number): string {
  const q = parseQuantity(text);
  return formatQuantity({ value: q.value * factor, format: q.format });
}
