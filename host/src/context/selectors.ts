// Kubernetes label selector strings ("app=web,tier!=db,env in (a,b),!legacy"), parsed into the
// structured LabelSelector the rest of the host already matches (select/match.ts).
import type { LabelSelector } from '../config/types.ts';
import { PortcullisError } from '../errors.ts';

const KEY = String.raw`[A-Za-z0-9](?:[A-Za-z0-9._/-]*[A-Za-z0-9])?`;
const VALUE = String.raw`(?:[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)?`;
const TERM = new RegExp(String.raw`^\s*(?:(!)\s*(${KEY})|(${KEY})\s*(?:(==|=|!=)\s*(${VALUE})|\s(in|notin)\s*\(([^)]*)\))?)\s*$`);

export class SelectorSyntaxError extends PortcullisError {
  constructor(message: string) {
    super('BAD_SELECTOR', message);
  }
}

/** Throws SelectorSyntaxError naming the term it cannot read. */
export function parseLabelSelector(text: string): LabelSelector {
  const expressions: NonNullable<LabelSelector['matchExpressions']> = [];
  for (const term of splitTerms(text)) {
    const m = TERM.exec(term);
    if (!m) throw new SelectorSyntaxError(`cannot read the label selector term "${term.trim()}"`);
    const [, bang, negated, key, op, value, setOp, set] = m;
    if (bang) expressions.push({ key: negated!, operator: 'DoesNotExist' });
    else if (op === '=' || op === '==') expressions.push({ key: key!, operator: 'In', values: [value ?? ''] });
    else if (op === '!=') expressions.push({ key: key!, operator: 'NotIn', values: [value ?? ''] });
    else if (setOp) {
      const values = set!.split(',').map((v) => v.trim());
      if (values.some((v) => !new RegExp(`^${VALUE}$`).test(v))) throw new SelectorSyntaxError(`bad value list in label selector term "${term.trim()}"`);
      expressions.push({ key: key!, operator: setOp === 'in' ? 'In' : 'NotIn', values });
    } else expressions.push({ key: key!, operator: 'Exists' });
  }
  return { matchExpressions: expressions };
}

/** Splits on commas outside parentheses. */
function splitTerms(text: string): string[] {
  const terms: string[] = [];
  let depth = 0;
  let start = 0;
  for (let i = 0; i < text.length; i++) {
    if (text[i] === '(') depth++;
    else if (text[i] === ')') depth--;
    else if (text[i] === ',' && depth === 0) {
      terms.push(text.slice(start, i));
      start = i + 1;
    }
  }
  terms.push(text.slice(start));
  return terms.filter((t) => t.trim() !== '');
}
