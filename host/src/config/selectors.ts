// What Kubernetes label and field selectors mean, as the apiserver evaluates them. Used to pick
// policies for a request (select/) and to answer a policy's list calls (context/), so both
// layers share one definition.
import type { JsonObject, JsonValue } from '@portcullis/sdk';
import type { LabelSelector, PolicyConfig } from './types.ts';

export function labelSelectorMatches(selector: LabelSelector, labels: Record<string, string>): boolean {
  for (const [key, value] of Object.entries(selector.matchLabels ?? {})) if (labels[key] !== value) return false;
  for (const { key, operator, values = [] } of selector.matchExpressions ?? []) {
    const has = Object.prototype.hasOwnProperty.call(labels, key);
    if (operator === 'Exists' && !has) return false;
    if (operator === 'DoesNotExist' && has) return false;
    if (operator === 'In' && (!has || !values.includes(labels[key]!))) return false;
    if (operator === 'NotIn' && has && values.includes(labels[key]!)) return false;
  }
  return true;
}

/** "metadata.name=web,spec.replicas!=0": every term must hold; `=` and `==` are equal, `!=` not. */
export function fieldSelectorMatches(selector: string, object: JsonObject | null): boolean {
  return selector.split(',').map((t) => t.trim()).filter(Boolean).every((term) => {
    const match = /^([^!=]+?)\s*(==|!=|=)\s*(.*)$/.exec(term);
    if (!match) return false;
    const [, path, op, expected] = match as unknown as [string, string, string, string];
    const actual = fieldValue(object, path.trim());
    const equal = actual === expected.trim();
    return op === '!=' ? !equal : equal;
  });
}

function fieldValue(object: JsonObject | null, path: string): string {
  let node: JsonValue | undefined = object ?? undefined;
  for (const key of path.split('.')) {
    // Own fields only: `metadata.labels.constructor` read Object's constructor, and its text matched every object (red team).
    node = typeof node === 'object' && node !== null && !Array.isArray(node) && Object.hasOwn(node, key) ? node[key] : undefined;
  }
  if (node === undefined || node === null) return '';
  return typeof node === 'object' ? JSON.stringify(node) : String(node);
}

/**
 * A policy whose configuration entry says nothing of what it covers (no rules, match or
 * selectors): loaded, its rules come from its module; not loaded, it covers every request.
 */
export function unscoped(config: PolicyConfig): boolean {
  return config.rules.length === 0 && config.match.length === 0 && !config.objectSelector && !config.namespaceSelector;
}
