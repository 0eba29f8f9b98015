// What of a YAML value JSON cannot hold: settings reach policies as JSON.
/**
 * The first value YAML can say and JSON cannot, with its path: settings reach policies as JSON,
 * and JSON.stringify wrote a !!set or !!omap as {} and .nan as null, so a require-labels policy
 * given `labels: !!set {team}` required nothing and allowed everything (red team 5).
 */
export function nonJsonValue(root: unknown): string | undefined {
  // An alias gives the same object twice, and an alias inside its own anchor a cycle (review 8:
  // the walk grew until the heap ran out). Each object is walked once (done); one met again
  // while it is being walked (open) holds itself.
  const open = new Set<object>();
  const done = new WeakSet<object>();
  const stack: { value: unknown; path: string; leaving?: true }[] = [{ value: root, path: '' }];
  for (let next = stack.pop(); next; next = stack.pop()) {
    const { value, path } = next;
    if (next.leaving) {
      open.delete(value as object);
      done.add(value as object);
      continue;
    }
    if (typeof value === 'number' && !Number.isFinite(value)) return `${path || '/'} is ${String(value)}, which JSON cannot hold`;
    if (typeof value !== 'object' || value === null || done.has(value)) continue;
    if (open.has(value)) return `${path || '/'} contains itself (a YAML alias inside its own anchor), which JSON cannot hold`;
    const proto = Object.getPrototypeOf(value) as unknown;
    if (!Array.isArray(value) && proto !== Object.prototype && proto !== null) {
      const kind = value instanceof Map ? 'a YAML map with a tag such as !!omap or !!pairs' : value instanceof Set ? 'a YAML !!set'
        : value instanceof Uint8Array ? 'YAML !!binary data' : value instanceof Date ? 'a YAML !!timestamp' : 'a tagged YAML value';
      return `${path || '/'} is ${kind}, which JSON has no form for: write it as a plain map, list, string or number`;
    }
    open.add(value);
    stack.push({ value, path, leaving: true });
    const entries = Array.isArray(value) ? value.map((item, i) => [String(i), item] as const) : Object.entries(value);
    for (const [key, item] of entries) stack.push({ value: item, path: `${path}/${key.replaceAll('~', '~0').replaceAll('/', '~1')}` });
  }
  return undefined;
}
