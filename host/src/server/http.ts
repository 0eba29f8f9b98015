// The HTTP(S) edge: routes, method checks, body size and content type, timeouts, TLS and the
// caller's identity. Every refusal is a JSON error with a code; nothing here evaluates policy.
import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import type { TLSSocket } from 'node:tls';
import type { Mode, PeerCertificate } from '@portcullis/sdk';
import type { ServerConfig } from '../config/types.ts';
import { errorMessage, HttpError, type PortcullisError, ReviewError, UnknownPolicyError } from '../errors.ts';
import { review, type AdmissionDeps } from './admission.ts';
import type { TlsMaterial } from './tls.ts';
import { nodeHttp } from '../util/node-http.ts';
import { goDurationMs, peerCertificate } from './caller.ts';
import { limitConnections } from './connections.ts';
import { PARSED_WHOLE_BELOW, parsedCostOf } from '../review/parse.ts';
import { scanReview } from '../review/scan.ts';

/**
 * Below this a body's parsed cost is not estimated (the walk costs ~2.5 µs for a 5 KB review):
 * at most ~46 KB of heap each, ~190 MB if every one of 4,096 connections held one.
 */
const PARSE_COST_FROM = 2 * 1024;

export interface HttpDeps extends AdmissionDeps {
  isReady(): { ready: boolean; detail: Record<string, unknown> };
  /** /healthz: false when only a restart can mend the host (see liveness in app.ts); default: alive. */
  isAlive?(): { alive: boolean; detail: Record<string, unknown> };
  /**
   * Issue 15: whether reviews are served; default: isReady(). Reviews are served before the
   * context caches sync: only the policies reading an unsynced kind fail (temporary), not all.
   */
  acceptsReviews?(): boolean;
}

const ROUTE = /^\/(validate|mutate)(?:\/([^/?#]+))?\/?$/;

/**
 * Memory that request bodies hold at once, across connections: their bytes as they arrive, and,
 * for a large one, what parsing it will cost, until its answer is sent. Red team: 300
 * connections each holding a 3 MiB body short of its last byte put RSS past the pod's 1 GiB
 * limit; and 85 bodies of 1 million empty objects, within the byte budget, took 2.5 GB to
 * parse. Charged as bytes arrive (not as declared: 85 chunked requests that never sent a byte
 * had reserved the whole budget and locked every other caller out).
 */
class BodyBudget {
  #held = 0;
  /** Bodies still arriving, by client address. */
  readonly #arriving = new Map<string, Holder>();
  readonly limit: number;
  constructor(limit: number) {
    this.limit = limit;
  }

  /**
   * An account for one request from `address`: grow() says why `bytes` more cannot be held, or
   * undefined when they are; arrived() once the whole body is in; `cut` ends the request, when
   * the budget is full and its address holds more of it in bodies still arriving than the one
   * asking. While its body arrives, what one address holds so counts against ARRIVING_SHARE of
   * the limit (red team 12: one client refilling bodies short of their last byte got 66 of 70
   * reviews from another address refused 503; red team 13: two clients, 35 of 40). Whole
   * bodies are not shared out: under overload the apiserver, one address, holds thousands of
   * them, and a share of those refused it (session 39, the benchmark's overload).
   */
  open(address: string, cut: () => void): { grow: (bytes: number) => 'full' | 'share' | undefined; arrived: () => void; release: () => void } {
    const account: Arriving = { bytes: 0, cut: () => {
      release();
      cut();
    } };
    let arriving = true;
    let released = false;
    const leave = () => {
      const holder = this.#arriving.get(address);
      if (!holder?.accounts.delete(account)) return;
      holder.bytes -= account.bytes;
      if (holder.accounts.size === 0) this.#arriving.delete(address);
    };
    const release = () => {
      if (released) return;
      if (arriving) leave();
      released = true;
      this.#held -= account.bytes;
    };
    return {
      grow: (bytes) => {
        if (released) return 'full';
        if (this.#held + bytes > this.limit && !this.#makeRoom(address, bytes)) return 'full';
        if (arriving) {
          const holder = this.#arriving.get(address) ?? { accounts: new Set<Arriving>(), bytes: 0 };
          if (holder.bytes + bytes > this.limit * ARRIVING_SHARE) return 'share';
          holder.accounts.add(account);
          holder.bytes += bytes;
          this.#arriving.set(address, holder);
        }
        // Counted arrived or not: a cut looks only at accounts still held by an address.
        account.bytes += bytes;
        this.#held += bytes;
        return undefined;
      },
      arrived: () => {
        if (!arriving || released) return;
        leave();
        arriving = false;
      },
      release,
    };
  }

  /**
   * Cuts the largest bodies still arriving from whichever address holds the most of them, while
   * that is more than `address` would hold, until `bytes` fit. Which address is fine: each one
   * cut is replaced only by a caller holding less.
   */
  #makeRoom(address: string, bytes: number): boolean {
    const mine = (this.#arriving.get(address)?.bytes ?? 0) + bytes;
    while (this.#held + bytes > this.limit) {
      let top: Holder | undefined;
      for (const [other, holder] of this.#arriving) if (other !== address && holder.bytes > (top?.bytes ?? 0)) top = holder;
      if (!top || top.bytes <= mine) return false;
      let largest: Arriving | undefined;
      for (const account of top.accounts) if (!largest || account.bytes > largest.bytes) largest = account;
      largest!.cut();
    }
    return true;
  }
}

/** A request's body: the bytes it holds (while arriving, the body's so far; then also what parsing it costs), and how to end its request. */
interface Arriving {
  bytes: number;
  cut: () => void;
}

/** One address's bodies still arriving, and their bytes in all. */
interface Holder {
  accounts: Set<Arriving>;
  bytes: number;
}

/** Of maxBodyBytesInFlight, what the bodies still arriving from one client address may hold. */
const ARRIVING_SHARE = 0.5;

/**
 * Copies of a large body the main thread holds beside it while answering, which the budget
 * counts at parse time: the decoded text JSON.parse reads, the one-byte text the raw-request
 * walk reads, and the envelope the workers read (red team: RSS past 1 GiB within the budget).
 */
const BODY_COPIES = 3;

export function createServer(config: ServerConfig, tls: TlsMaterial | undefined, deps: HttpDeps): Server {
  const bodies = new BodyBudget(config.maxBodyBytesInFlight);
  const handler = (req: IncomingMessage, res: ServerResponse) => {
    handle(config, deps, bodies, req, res).catch((error: unknown) => {
      deps.log.error('unexpected error handling a request', { path: req.url, message: errorMessage(error) });
      sendError(res, new HttpError('INTERNAL_ERROR', 'the webhook failed unexpectedly; see its logs'));
    });
  };
  // Node checks header and request timeouts only every connectionsCheckingInterval (30 s by
  // default); check often enough that the configured timeouts mean what they say.
  const timing = { connectionsCheckingInterval: Math.max(50, Math.min(1000, config.headersTimeoutMs / 2)) };
  const server = tls
    ? createHttpsServer({
      // A TCP connection that never starts its handshake is closed as a slow request is
      // (Node's default keeps it 120 s: red team, 5,000 such connections held ~90 MB).
      ...timing, handshakeTimeout: config.headersTimeoutMs, key: tls.key, cert: tls.cert,
      ...(tls.clientCA ? { ca: tls.clientCA, requestCert: true, rejectUnauthorized: tls.requireClientCert } : {}),
    }, handler)
    : nodeHttp.createServer(timing, handler);
  // Slow or stalled clients are cut off instead of holding sockets: headers must arrive within
  // headersTimeout, the whole request within requestTimeout; idle keep-alive sockets close.
  server.headersTimeout = config.headersTimeoutMs;
  server.requestTimeout = config.requestTimeoutMs;
  // The apiserver keeps idle webhook connections for 90 s (Go's http.DefaultTransport
  // IdleConnTimeout, which client-go keeps) and reuses them. Closing one first races with a call
  // it is writing there, and it does not retry a POST that met EOF: the call fails, and with
  // failurePolicy Fail the request is denied. So an idle connection is left for the caller to close.
  server.keepAliveTimeout = 120_000;
  // So idle connections are bounded by count instead (connections.ts).
  limitConnections(server, config, tls !== undefined, () => deps.metrics.badRequests.inc({ code: 'TOO_MANY_CONNECTIONS' }));
  server.on('clientError', (error: NodeJS.ErrnoException, socket) => {
    // TLS errors (a handshake that failed or never finished) come here too, on a socket that
    // cannot carry an HTTP answer: writing one left it open (red team: handshakeTimeout had no
    // effect). HTTP answers are for the parser's errors and timeouts only.
    const http = error.code === 'ERR_HTTP_REQUEST_TIMEOUT' || error.code?.startsWith('HPE_') === true;
    if (!http) {
      deps.metrics.badRequests.inc({ code: 'BAD_TLS' });
      deps.log.debug('TLS handshake failed; connection closed', { message: errorMessage(error) });
      return void socket.destroy();
    }
    const refused = error.code === 'ERR_HTTP_REQUEST_TIMEOUT'
      ? new HttpError('REQUEST_TIMEOUT', 'the request did not arrive in time')
      : new HttpError('BAD_HTTP', 'the request is not valid HTTP');
    deps.metrics.badRequests.inc({ code: refused.code });
    deps.log.info(refused.code === 'REQUEST_TIMEOUT' ? 'client too slow; connection closed' : 'malformed HTTP; connection closed', { message: errorMessage(error) });
    if (!socket.writable) return void socket.destroy();
    const body = JSON.stringify({ error: { code: refused.code, message: refused.message } });
    const reason = refused.httpStatus === 408 ? 'Request Timeout' : 'Bad Request';
    socket.end(`HTTP/1.1 ${refused.httpStatus} ${reason}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
  });
  return server;
}

async function handle(config: ServerConfig, deps: HttpDeps, bodies: BodyBudget, req: IncomingMessage, res: ServerResponse): Promise<void> {
  const path = (req.url ?? '/').split('?')[0]!;
  if (path === '/healthz') {
    return get(req, res, () => {
      const { alive, detail } = deps.isAlive?.() ?? { alive: true, detail: {} };
      sendJson(res, alive ? 200 : 503, { status: alive ? 'ok' : 'unhealthy', ...detail });
    });
  }
  if (path === '/readyz') {
    return get(req, res, () => {
      const { ready, detail } = deps.isReady();
      sendJson(res, ready ? 200 : 503, { status: ready ? 'ready' : 'not ready', ...detail });
    });
  }
  if (path === '/metrics') {
    return get(req, res, async () => {
      res.writeHead(200, { 'content-type': deps.metrics.registry.contentType });
      res.end(await deps.metrics.registry.metrics());
    });
  }
  const route = ROUTE.exec(path);
  if (!route) return refuse(deps, res, new HttpError('NOT_FOUND', `no such endpoint ${path}; use /validate, /mutate, /validate/<policy> or /mutate/<policy>`));
  const mode = route[1] as Mode;
  let policy: string | undefined;
  try {
    policy = route[2] === undefined ? undefined : decodeURIComponent(route[2]);
  } catch {
    return refuse(deps, res, new HttpError('NOT_FOUND', `no such endpoint ${path}: its policy name is not valid percent-encoding`));
  }
  if (req.method !== 'POST') {
    res.setHeader('allow', 'POST');
    return refuse(deps, res, new HttpError('METHOD_NOT_ALLOWED', `${path} takes POST with an AdmissionReview, not ${req.method}`));
  }
  if (!(deps.acceptsReviews ? deps.acceptsReviews() : deps.isReady().ready)) {
    // Until the first policy set is loaded an empty set would allow everything: say 503 and
    // let the apiserver apply the webhook's failurePolicy instead.
    res.setHeader('retry-after', '1');
    return refuse(deps, res, new HttpError('NOT_READY', 'the webhook is still loading its policies'));
  }
  // Early answer without reading the body; review() looks the policy up again, and owns the answer.
  if (policy !== undefined && !deps.allowUnknownPolicies && !deps.registry.lookup(policy, mode)) {
    const configured = deps.registry.current.byName.get(policy);
    const error = new UnknownPolicyError(policy, mode, configured?.modes);
    return refuse(deps, res, error);
  }
  const contentType = (req.headers['content-type'] ?? '').split(';')[0]!.trim().toLowerCase();
  if (contentType !== 'application/json') {
    return refuse(deps, res, new HttpError('UNSUPPORTED_MEDIA_TYPE', `expected Content-Type application/json, got ${contentType ? JSON.stringify(contentType) : 'none'}`));
  }
  const address = req.socket.remoteAddress ?? '';
  // Cut to make room for a caller holding less (BodyBudget): its connection goes, as a slow body's does.
  const account = bodies.open(address, () => req.socket.destroy());
  res.once('close', account.release);
  const busy = (why: 'full' | 'share') => {
    res.setHeader('connection', 'close');
    res.setHeader('retry-after', '1');
    const mib = Math.round(bodies.limit / 2 ** 20);
    refuse(deps, res, new HttpError('SERVER_BUSY', why === 'full'
      ? `the webhook holds ${mib} MiB of request bodies already; retry shortly`
      : `bodies still arriving from ${address || 'this client'} would hold more than half of the ${mib} MiB of request bodies the webhook takes at once; retry shortly`));
  };
  let refusal: 'full' | 'share' | undefined;
  const body = await readBody(req, config, (bytes) => !(refusal = account.grow(bytes)));
  account.arrived();
  if (body === 'busy') {
    busy(refusal ?? 'full');
    req.resume();
    return;
  }
  if (body === 'slow') {
    // Not resumed: the rest of a stalled body is not waited for; the connection closes.
    res.setHeader('connection', 'close');
    refuse(deps, res, new HttpError('REQUEST_TIMEOUT', `the body did not arrive within ${config.bodyTimeoutMs} ms of the headers (server.bodyTimeoutMs)`));
    return;
  }
  if (body === undefined || body === 'fragmented') {
    res.setHeader('connection', 'close');
    refuse(deps, res, new HttpError('BODY_TOO_LARGE', body === undefined
      ? `the body is larger than the ${config.maxBodyBytes}-byte limit`
      : `the body came in too many small pieces (under ${BYTES_PER_CHUNK} bytes each on average); send it in larger writes`));
    req.resume();
    return;
  }
  if (body === null) return; // the client went away mid-body
  const scan = scanReview(body);
  // What JSON.parse will make of it: a large body of tiny containers costs many times its bytes.
  // A small body the scan stopped early in is counted whole: JSON.parse gives its error.
  if (body.length >= PARSE_COST_FROM) {
    const parsedCost = scan.valid || body.length >= PARSED_WHOLE_BELOW ? scan.parsedCost : parsedCostOf(body);
    const why = account.grow(parsedCost + BODY_COPIES * body.length);
    if (why) return busy(why);
  }
  try {
    const query = req.url?.includes('?') ? req.url.slice(req.url.indexOf('?') + 1) : undefined;
    const timeoutMs = query === undefined ? undefined : goDurationMs(new URLSearchParams(query).get('timeout'));
    const caller = {
      endpoint: path.replace(/\/$/, ''), mode, ...(policy !== undefined ? { policy } : {}), headers: headersOf(req), sslpeer: peerOf(req),
      ...(timeoutMs !== undefined ? { timeoutMs } : {}),
    };
    const answer = await review(deps, caller, body, scan);
    sendJson(res, 200, answer);
  } catch (error) {
    if (error instanceof ReviewError || error instanceof UnknownPolicyError) return refuse(deps, res, error);
    throw error;
  }
}

function get(req: IncomingMessage, res: ServerResponse, then: () => void | Promise<void>): void | Promise<void> {
  if (req.method === 'GET' || req.method === 'HEAD') return then();
  res.setHeader('allow', 'GET');
  sendError(res, new HttpError('METHOD_NOT_ALLOWED', `use GET, not ${req.method}`));
}

/**
 * A body's pieces must average at least this many bytes (past its first 1,024 pieces): one sent
 * in 1-byte chunks (or 1-byte TLS records) costs an event and a Buffer per byte. Red team: 1.5 MB
 * that way was 1.5 million Buffers kept until the end, 700 MB of heap for one connection. Chunks
 * are also copied as they come, never kept. A fixed count per limit refused an ordinary client
 * streaming 2.5 MB in 256-byte writes (re-test); an average does not.
 */
const BYTES_PER_CHUNK = 64;

type BodyRead = Buffer | undefined | null | 'fragmented' | 'busy' | 'slow';

/**
 * The body's bytes (kept as bytes: guests get the request from them, issue 14); undefined when
 * over the limit, null when the client disconnected, 'slow' when it did not arrive within
 * bodyTimeoutMs: red team, 4,300 requests of headers and no body held every connection slot,
 * and bodies short of their last byte held the body budget, for requestTimeoutMs (30 s) each.
 */
function readBody(req: IncomingMessage, config: ServerConfig, charge: (bytes: number) => boolean): Promise<BodyRead> {
  const limit = config.maxBodyBytes;
  const declared = Number(req.headers['content-length']);
  if (Number.isFinite(declared) && declared > limit) return Promise.resolve(undefined);
  return new Promise((resolve) => {
    // Grown as bytes arrive, never allocated at a declared length nobody sends; the usual case,
    // a body in one piece of its declared length, is kept as it came (no copy).
    let body: Buffer | undefined;
    let size = 0;
    let chunks = 0;
    let done = false;
    const finish = (value: BodyRead) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      resolve(value);
    };
    const timer = setTimeout(() => {
      req.removeAllListeners('data');
      finish('slow');
    }, config.bodyTimeoutMs);
    req.on('data', (chunk: Buffer) => {
      if (size + chunk.length > limit || (++chunks > 1024 && chunks * BYTES_PER_CHUNK > size + chunk.length)) {
        req.removeAllListeners('data');
        return finish(size + chunk.length > limit ? undefined : 'fragmented');
      }
      if (!charge(chunk.length)) {
        req.removeAllListeners('data');
        return finish('busy');
      }
      if (size === 0 && chunk.length === declared) {
        body = chunk;
      } else {
        // (A kept first chunk is full, so more bytes always grow into a new buffer.)
        if (!body || size + chunk.length > body.length) {
          const first = Number.isFinite(declared) && declared >= 0 ? Math.min(declared, 64 * 1024) : 64 * 1024;
          const grown = Buffer.allocUnsafe(Math.min(limit, Math.max(body ? body.length * 2 : first, size + chunk.length)));
          if (body) body.copy(grown, 0, 0, size);
          body = grown;
        }
        chunk.copy(body, size);
      }
      size += chunk.length;
    });
    req.on('end', () => finish(body === undefined ? Buffer.alloc(0) : size === body.length ? body : body.subarray(0, size)));
    req.on('aborted', () => finish(null));
    req.on('error', () => finish(null));
  });
}

function headersOf(req: IncomingMessage): Record<string, string> {
  const headers: Record<string, string> = {};
  for (const [name, value] of Object.entries(req.headers)) if (value !== undefined) headers[name] = Array.isArray(value) ? value.join(', ') : value;
  return headers;
}

/** The verified client certificate, or null (no TLS, no certificate, or not verified). */
function peerOf(req: IncomingMessage): PeerCertificate | null {
  const socket = req.socket as TLSSocket;
  if (typeof socket.getPeerCertificate !== 'function' || !socket.authorized) return null;
  const cert = socket.getPeerCertificate();
  if (!cert || Object.keys(cert).length === 0) return null;
  return peerCertificate(cert);
}

/** Answers with the error's catalog status and code; counted and logged as a refused request. */
function refuse(deps: HttpDeps, res: ServerResponse, error: PortcullisError): void {
  deps.metrics.badRequests.inc({ code: error.code });
  deps.log.info('request refused', { status: error.httpStatus, code: error.code, message: error.message });
  sendError(res, error);
}

function sendError(res: ServerResponse, error: PortcullisError): void {
  if (res.headersSent) return void res.destroy();
  sendJson(res, error.httpStatus, { error: { code: error.code, message: error.message } });
}

function sendJson(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}
