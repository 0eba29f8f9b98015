// Metric series counted in plain numbers on the review path and handed to prom-client only when
// scraped. prom-client hashes a series' label values on every inc or observe, even through a
// labels() handle: a review refused under overload with ten policies spent 16 µs of its 43 µs
// of main thread there (microbenchmark of review()), and one evaluated AS policy ~5 µs of its
// ~100 µs. Label values come from the configuration (policy names, endpoints, outcomes), so the
// series are bounded.
import type { Histogram } from 'prom-client';

interface Counted {
  values: [string, string];
  count: number;
  added: number;
}

/** Counts for a prom-client counter with two labels, added to it by `flush` (call it from the counter's collect). */
export class Tally {
  readonly #counter: { labels(...values: string[]): { inc(value: number): void } };
  // Two levels, so that counting builds no key string.
  readonly #series = new Map<string, Map<string, Counted>>();
  constructor(counter: { labels(...values: string[]): { inc(value: number): void } }) {
    this.#counter = counter;
  }

  add(first: string, second: string): void {
    let inner = this.#series.get(first);
    if (!inner) this.#series.set(first, inner = new Map<string, Counted>());
    const series = inner.get(second);
    if (series) series.count++;
    else inner.set(second, { values: [first, second], count: 1, added: 0 });
  }

  flush(): void {
    for (const inner of this.#series.values()) {
      for (const series of inner.values()) {
        if (series.count === series.added) continue;
        this.#counter.labels(...series.values).inc(series.count - series.added);
        series.added = series.count;
      }
    }
  }
}

interface Observed {
  /** Per bucket, not cumulative; the last one is +Inf. */
  buckets: number[];
  sum: number;
  count: number;
}

type Sample = { value: number; metricName: string; labels: Record<string, string | number> };

/**
 * A histogram with one label, kept here and read by the registry as prom-client reads its own:
 * the same lines (buckets with `le`, +Inf, _sum, _count) in the same order.
 */
export class TallyHistogram {
  readonly name: string;
  readonly help: string;
  readonly type = 'histogram';
  readonly aggregator = 'sum';
  readonly #label: string;
  readonly #bounds: number[];
  #series = new Map<string, Observed>();

  constructor(options: { name: string; help: string; label: string; buckets: number[]; registry: { registerMetric(metric: Histogram): void } }) {
    this.name = options.name;
    this.help = options.help;
    this.#label = options.label;
    this.#bounds = [...options.buckets].sort((a, b) => a - b);
    options.registry.registerMetric(this as unknown as Histogram);
  }

  observe(value: string, seconds: number): void {
    let series = this.#series.get(value);
    if (!series) this.#series.set(value, series = { buckets: new Array<number>(this.#bounds.length + 1).fill(0), sum: 0, count: 0 });
    let i = 0;
    while (i < this.#bounds.length && seconds > this.#bounds[i]!) i++;
    series.buckets[i]!++;
    series.sum += seconds;
    series.count++;
  }

  get(): Promise<{ name: string; help: string; type: string; aggregator: string; values: Sample[] }> {
    const values: Sample[] = [];
    for (const [value, series] of this.#series) {
      let cumulative = 0;
      this.#bounds.forEach((le, i) => {
        cumulative += series.buckets[i]!;
        values.push({ value: cumulative, metricName: `${this.name}_bucket`, labels: { le, [this.#label]: value } });
      });
      values.push({ value: series.count, metricName: `${this.name}_bucket`, labels: { le: '+Inf', [this.#label]: value } });
      values.push({ value: series.sum, metricName: `${this.name}_sum`, labels: { [this.#label]: value } });
      values.push({ value: series.count, metricName: `${this.name}_count`, labels: { [this.#label]: value } });
    }
    return Promise.resolve({ name: this.name, help: this.help, type: this.type, aggregator: this.aggregator, values });
  }

  reset(): void {
    this.#series = new Map();
  }
}
