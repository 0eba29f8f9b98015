// The load generator, run as its own process (`node bench/load.ts '<LoadSpec JSON>'`) so it
// never shares an event loop with the server it measures. Prints one LoadResult JSON line.
//
//  saturate   autocannon, `connections` keep-alive connections, closed loop, as fast as the
//             server answers. Several paths are cycled per connection (per-policy endpoints).
//  paced      open loop: a review every 1/rate s whether or not earlier ones have answered,
//             on up to `connections` keep-alive TLS connections opened as needed (a request
//             waits in the generator while all are busy, and that wait counts). With several
//             paths, each review is all of them in parallel, as the apiserver calls validating
//             webhooks; reviewLatency is the slowest.
//  autocannon-rate  autocannon --overallRate: note that it sends each connection's quota for
//             the second back to back and then idles, so it is a burst per second, not a pace.
//
// Latencies are taken per response with sub-millisecond resolution (autocannon's own
// histogram keeps whole milliseconds); autocannon's own figures are kept too.
import { createRequire } from 'node:module';
import { connect, type TLSSocket } from 'node:tls';

export interface LoadSpec {
  kind: 'saturate' | 'paced' | 'autocannon-rate';
  origin: string;
  paths: string[];
  body: string;
  connections: number;
  durationSec: number;
  warmupSec: number;
  /** paced: reviews per second; autocannon-rate: requests per second. */
  rate?: number;
}

export interface Percentiles {
  p50: number;
  p90: number;
  p99: number;
  p999: number;
  max: number;
  mean: number;
  count: number;
}

export interface LoadResult {
  kind: LoadSpec['kind'];
  connections: number;
  durationSec: number;
  /** 2xx responses. */
  ok: number;
  non2xx: number;
  errors: number;
  /** 2xx responses per second. */
  rps: number;
  latencyMs: Percentiles;
  /** paced with several paths: the slowest of each review's parallel requests. */
  reviewLatencyMs?: Percentiles;
  /** paced: how late the generator sent (timer lag), to tell its delays from the server's. */
  sendLagMs?: Percentiles;
  /** CPU seconds this load generator process used in all (start, warm-up, measurement). */
  cpuSec?: number;
  /** autocannon's own (whole-millisecond, coordinated-omission-corrected) figures. */
  autocannon?: { p50: number; p99: number; max: number; rps: number };
}

export function percentiles(values: ArrayLike<number>): Percentiles {
  const sorted = Float64Array.from(values).sort();
  const at = (q: number) => (sorted.length === 0 ? NaN : sorted[Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1)]!);
  let sum = 0;
  for (const v of sorted) sum += v;
  const round = (v: number) => Math.round(v * 1000) / 1000;
  return {
    p50: round(at(0.5)), p90: round(at(0.9)), p99: round(at(0.99)), p999: round(at(0.999)),
    max: round(sorted.at(-1) ?? NaN), mean: round(sum / sorted.length), count: sorted.length,
  };
}

/** A growable list of numbers. */
class Samples {
  #data = new Float64Array(1 << 16);
  length = 0;
  push(v: number): void {
    if (this.length === this.#data.length) {
      const next = new Float64Array(this.#data.length * 2);
      next.set(this.#data);
      this.#data = next;
    }
    this.#data[this.length++] = v;
  }
  get values(): Float64Array {
    return this.#data.subarray(0, this.length);
  }
}

// ---- autocannon (CommonJS, no bundled types) ----

interface AutocannonResult {
  '2xx': number;
  non2xx: number;
  errors: number;
  timeouts: number;
  duration: number;
  latency: { p50: number; p99: number; max: number };
  requests: { average: number };
}
interface AutocannonInstance {
  on(event: 'response', listener: (client: unknown, statusCode: number, bytes: number, ms: number) => void): void;
}
type Autocannon = (opts: Record<string, unknown>, done: (error: Error | null, result: AutocannonResult) => void) => AutocannonInstance;
const autocannon = createRequire(import.meta.url)('autocannon') as Autocannon;

function cannon(spec: LoadSpec, durationSec: number, onResponse?: (status: number, ms: number) => void): Promise<AutocannonResult> {
  const opts: Record<string, unknown> = {
    url: spec.paths.length === 1 ? spec.origin + spec.paths[0] : spec.origin,
    connections: spec.connections, duration: durationSec, method: 'POST',
    headers: { 'content-type': 'application/json' }, body: spec.body,
    ...(spec.paths.length > 1 ? { requests: spec.paths.map((path) => ({ path, method: 'POST' })) } : {}),
    ...(spec.kind === 'autocannon-rate' ? { overallRate: spec.rate } : {}),
  };
  return new Promise((resolve, reject) => {
    const instance = autocannon(opts, (error, result) => (error ? reject(error) : resolve(result)));
    if (onResponse) instance.on('response', (_client, status, _bytes, ms) => onResponse(status, ms));
  });
}

async function runCannon(spec: LoadSpec): Promise<LoadResult> {
  if (spec.warmupSec > 0) await cannon({ ...spec, kind: 'saturate' }, spec.warmupSec);
  const latencies = new Samples();
  const started = performance.now();
  const result = await cannon(spec, spec.durationSec, (status, ms) => {
    if (status >= 200 && status < 300) latencies.push(ms);
  });
  const seconds = (performance.now() - started) / 1000;
  return {
    kind: spec.kind, connections: spec.connections, durationSec: Math.round(seconds * 100) / 100,
    ok: result['2xx'], non2xx: result.non2xx, errors: result.errors + result.timeouts,
    rps: Math.round(latencies.length / seconds), latencyMs: percentiles(latencies.values),
    autocannon: { p50: result.latency.p50, p99: result.latency.p99, max: result.latency.max, rps: result.requests.average },
  };
}

// ---- paced (open loop) ----

/**
 * A minimal HTTPS/1.1 keep-alive client for the pacer: the request bytes are built once and a
 * response is read only as far as its status and Content-Length. The generator shares the
 * machine's two cores with the server it measures; undici's pool spent about 110 µs of CPU per
 * request here (autocannon about 30), which under the overload scenario's 4x load took CPU
 * from the server and so measured the generator as much as the server.
 */
class RawClient {
  readonly #host: string;
  readonly #port: number;
  readonly #max: number;
  readonly #requests = new Map<string, Buffer>();
  readonly #idle: Connection[] = [];
  #open = 0;
  readonly #waiting: Pending[] = [];
  #head = 0;
  #closed = false;

  constructor(origin: string, body: string, paths: string[], connections: number) {
    const url = new URL(origin);
    this.#host = url.hostname;
    this.#port = Number(url.port || 443);
    this.#max = connections;
    const payload = Buffer.from(body);
    for (const path of paths) {
      const head = `POST ${path} HTTP/1.1\r\nHost: ${url.host}\r\nContent-Type: application/json\r\nContent-Length: ${payload.length}\r\n\r\n`;
      this.#requests.set(path, Buffer.concat([Buffer.from(head), payload]));
    }
  }

  /** Calls `done` with the status code, or 0 when the connection failed. */
  send(path: string, done: (status: number) => void): void {
    const pending = { bytes: this.#requests.get(path)!, done };
    const conn = this.#idle.pop();
    if (conn) return conn.start(pending);
    this.#waiting.push(pending);
    if (this.#open < this.#max) this.#connect();
  }

  close(): void {
    this.#closed = true;
    for (const conn of this.#idle.splice(0)) conn.socket.destroy();
  }

  #connect(): void {
    this.#open++;
    const socket = connect({ host: this.#host, port: this.#port, rejectUnauthorized: false });
    socket.setNoDelay(true);
    const conn = new Connection(socket, (c) => this.#free(c), (c) => this.#lost(c));
    socket.once('secureConnect', () => {
      conn.connected = true;
      this.#free(conn);
    });
  }

  #next(): Pending | undefined {
    if (this.#head >= this.#waiting.length) return undefined;
    const pending = this.#waiting[this.#head]!;
    this.#waiting[this.#head++] = undefined as unknown as Pending;
    if (this.#head > 4096 && this.#head * 2 > this.#waiting.length) {
      this.#waiting.splice(0, this.#head);
      this.#head = 0;
    }
    return pending;
  }

  #free(conn: Connection): void {
    const pending = this.#next();
    if (pending) conn.start(pending);
    else if (this.#closed) conn.socket.destroy();
    else this.#idle.push(conn);
  }

  #lost(conn: Connection): void {
    this.#open--;
    const i = this.#idle.indexOf(conn);
    if (i >= 0) this.#idle.splice(i, 1);
    // A connection that never opened fails a waiting request, so a server that is down ends the run.
    if (!conn.connected) this.#next()?.done(0);
    if (!this.#closed && this.#head < this.#waiting.length && this.#open < this.#max) this.#connect();
  }
}

interface Pending {
  bytes: Buffer;
  done: (status: number) => void;
}

const HEADER_END = Buffer.from('\r\n\r\n');

class Connection {
  #current: Pending | undefined;
  #buffer: Buffer | undefined;
  #dead = false;
  connected = false;
  readonly socket: TLSSocket;

  constructor(socket: TLSSocket, free: (c: Connection) => void, lost: (c: Connection) => void) {
    this.socket = socket;
    socket.on('data', (chunk: Buffer) => {
      const data = this.#buffer ? Buffer.concat([this.#buffer, chunk]) : chunk;
      const end = data.indexOf(HEADER_END);
      if (end < 0) return void (this.#buffer = data);
      const head = data.toString('latin1', 0, end).toLowerCase();
      const length = /\r\ncontent-length: *(\d+)/.exec(head);
      if (!length) return void socket.destroy(new Error('a response without Content-Length'));
      if (data.length < end + 4 + Number(length[1])) return void (this.#buffer = data);
      this.#buffer = undefined;
      const current = this.#current;
      this.#current = undefined;
      const closing = head.includes('\r\nconnection: close');
      current?.done(Number(head.slice(9, 12)));
      if (closing) socket.destroy();
      else free(this);
    });
    const gone = () => {
      if (this.#dead) return;
      this.#dead = true;
      const current = this.#current;
      this.#current = undefined;
      current?.done(0);
      lost(this);
    };
    socket.on('error', gone);
    socket.on('close', gone);
  }

  start(pending: Pending): void {
    this.#current = pending;
    this.socket.write(pending.bytes);
  }
}

async function runPaced(spec: LoadSpec): Promise<LoadResult> {
  const rate = spec.rate ?? 200;
  const client = new RawClient(spec.origin, spec.body, spec.paths, spec.connections);
  let non2xx = 0;
  let errors = 0;
  const send = (path: string, record: boolean, latencies: Samples): Promise<number> => new Promise((resolve) => {
    const started = performance.now();
    client.send(path, (statusCode) => {
      const ms = performance.now() - started;
      if (statusCode === 0) {
        if (record) errors++;
        return resolve(NaN);
      }
      if (statusCode < 200 || statusCode >= 300) {
        if (record) non2xx++;
        return resolve(NaN);
      }
      if (record) latencies.push(ms);
      resolve(ms);
    });
  });
  const latencies = new Samples();
  const reviews = new Samples();
  const lags = new Samples();
  const phase = (seconds: number, record: boolean) => new Promise<number>((resolve) => {
    const interval = 1000 / rate;
    const total = Math.round(seconds * rate);
    const start = performance.now() + 20;
    const inflight: Promise<void>[] = [];
    let i = 0;
    const tick = () => {
      const now = performance.now();
      while (i < total && start + i * interval <= now) {
        if (record) lags.push(now - (start + i * interval));
        inflight.push(Promise.all(spec.paths.map((path) => send(path, record, latencies))).then((times) => {
          if (record && spec.paths.length > 1 && times.every((t) => !Number.isNaN(t))) reviews.push(Math.max(...times));
        }));
        i++;
      }
      if (i < total) setTimeout(tick, Math.max(0, start + i * interval - performance.now()));
      else void Promise.all(inflight).then(() => resolve((performance.now() - start) / 1000));
    };
    setTimeout(tick, 20);
  });
  if (spec.warmupSec > 0) await phase(spec.warmupSec, false);
  const seconds = await phase(spec.durationSec, true);
  client.close();
  return {
    kind: 'paced', connections: spec.connections, durationSec: Math.round(seconds * 100) / 100,
    ok: latencies.length, non2xx, errors, rps: Math.round(latencies.length / seconds), latencyMs: percentiles(latencies.values),
    ...(spec.paths.length > 1 ? { reviewLatencyMs: percentiles(reviews.values) } : {}),
    sendLagMs: percentiles(lags.values),
  };
}

if (import.meta.main) {
  const spec = JSON.parse(process.argv[2] ?? '') as LoadSpec;
  const result = spec.kind === 'paced' ? await runPaced(spec) : await runCannon(spec);
  const cpu = process.cpuUsage();
  process.stdout.write(`${JSON.stringify({ ...result, cpuSec: Math.round((cpu.user + cpu.system) / 1e4) / 100 })}\n`);
}
