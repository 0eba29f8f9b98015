// JSON.stringify without recursion, for values nested deeper than V8's stack lets JSON.stringify
// go (about 5,000 levels; the apiserver lets objects nest 10,000 deep). Used only where
// JSON.stringify ran out of stack: it is several times slower.
/** The same text as JSON.stringify(value) for plain data (objects, arrays, strings, numbers, booleans, null). */
export function stringifyDeep(value: unknown): string {
  const out: string[] = [];
  // Each entry: a value still to write, or a piece of punctuation.
  const pending: (readonly [unknown] | string)[] = [[value]];
  while (pending.length > 0) {
    const next = pending.pop()!;
    if (typeof next === 'string') {
      out.push(next);
      continue;
    }
    const [item] = next;
    if (item === null || typeof item !== 'object') {
      out.push(JSON.stringify(item) ?? 'null');
    } else if (Array.isArray(item)) {
      pending.push(']');
      for (let i = item.length - 1; i >= 0; i--) {
        const element: unknown = item[i];
        pending.push([element === undefined || typeof element === 'function' || typeof element === 'symbol' ? null : element]);
        if (i > 0) pending.push(',');
      }
      pending.push('[');
    } else {
      const entries = Object.entries(item as Record<string, unknown>).filter(([, v]) => v !== undefined && typeof v !== 'function' && typeof v !== 'symbol');
      pending.push('}');
      for (let i = entries.length - 1; i >= 0; i--) {
        const [key, member] = entries[i]!;
        pending.push([member]);
        pending.push(`${i > 0 ? ',' : ''}${JSON.stringify(key)}:`);
      }
      pending.push('{');
    }
  }
  return out.join('');
}

/** JSON.stringify, or stringifyDeep where JSON.stringify runs out of stack. */
export function stringifyAnyDepth(value: unknown): string {
  try {
    return JSON.stringify(value);
  } catch (error) {
    if (!(error instanceof RangeError)) throw error;
    return stringifyDeep(value);
  }
}
