// One HTTP exchange with a registry or the storage it redirects to, over undici: follows
// redirects itself so that credentials never leave the registry's origin, caps how much of a
// body it will hold, and turns socket and TLS failures into messages that say what to check.
import { getCACertificates } from 'node:tls';
import type { IncomingHttpHeaders } from 'node:http';
import { Agent, request } from 'undici';
import { errorMessage } from '../errors.ts';
import { foreignText } from '../util/text.ts';
import { RegistryError } from './errors.ts';

export interface Exchange {
  status: number;
  headers: IncomingHttpHeaders;
  body: Uint8Array;
  /** Where the answer finally came from, after redirects (upload locations are relative to it). */
  url: URL;
}

export interface SendOptions {
  method: 'GET' | 'HEAD' | 'POST' | 'PUT';
  headers?: Record<string, string>;
  body?: Uint8Array;
  /** Bytes of body we accept; more is a protocol error, not an out-of-memory. */
  limit: number;
  /** Only sent to `origin`; dropped when a redirect leads elsewhere (blob storage, CDN). */
  authorization?: string;
  origin: string;
  /** What we were doing, for error messages: "manifest oci://reg/repo:tag". */
  what: string;
  /** Whether a redirect may go from https to plain http (only for registries listed as insecure). */
  allowHttp: boolean;
  /** Sees the first HEAD_BYTES of a 2xx body (or all of a shorter one); throwing stops the read. */
  checkHead?: (head: Uint8Array) => void;
  /**
   * The whole exchange (redirects, headers and body) must be over by then. undici's own timers
   * are idle timers: a body dripping a byte every 50 s never ended one (red team: /readyz 503
   * for 23 minutes, every later reload queued behind it).
   */
  deadlineMs: number;
  /** The deadline the caller's whole request had, when this exchange is a later part of it (said in the error). */
  requestMs?: number;
}

const shutdown = new AbortController();

/**
 * Ends every registry request under way, and fails every later one at once: what `serve` calls
 * when it shuts down, so that a stalled registry does not hold the process open (its sockets
 * kept it alive after "stopped"). For good: a reload queued behind the abandoned one (the file
 * watcher and SIGHUP both asked) started a new request after the signal and held it 60 s more.
 */
export function abandonRegistryRequests(): void {
  shutdown.abort();
}

const HEAD_BYTES = 8;

const MAX_REDIRECTS = 5;
const ERROR_BODY_LIMIT = 64 * 1024;
const REDIRECTS = new Set([301, 302, 303, 307, 308]);

export class Transport {
  readonly #agent: Agent;

  /** `ca` is trusted in addition to (not instead of) the usual roots. */
  constructor(ca?: string) {
    this.#agent = new Agent({
      connectTimeout: 10_000, headersTimeout: 30_000, bodyTimeout: 60_000,
      ...(ca ? { connect: { ca: [...getCACertificates('default'), ca] } } : {}),
    });
  }

  async send(target: URL, options: SendOptions): Promise<Exchange> {
    const signal = AbortSignal.any([AbortSignal.timeout(options.deadlineMs), shutdown.signal]);
    let url = target;
    try {
      return await this.#exchange(target, options, signal, (at) => { url = at; });
    } catch (error) {
      if (!signal.aborted) throw error;
      const at = `${url.host} (${url.protocol.replace(':', '')})`;
      const why = shutdown.signal.aborted ? 'abandoned: the host is shutting down'
        : `no complete answer from ${at} within ${Math.round((options.requestMs ?? options.deadlineMs) / 100) / 10} s (the whole request; the registry or the network is stalled or very slow)`;
      throw new RegistryError('REGISTRY_UNREACHABLE', `${options.what}: ${why}`, { cause: error });
    }
  }

  async #exchange(target: URL, options: SendOptions, signal: AbortSignal, at: (url: URL) => void): Promise<Exchange> {
    let url = target;
    for (let hop = 0; ; hop++) {
      at(url);
      const headers = { ...options.headers };
      if (options.authorization && url.origin === options.origin) headers.authorization = options.authorization;
      let response;
      try {
        response = await request(url, {
          method: options.method, headers, dispatcher: this.#agent, signal,
          ...(options.body ? { body: options.body } : {}),
        });
      } catch (error) {
        throw networkError(error, url, options.what);
      }
      const location = response.headers.location;
      const follow = REDIRECTS.has(response.statusCode) && typeof location === 'string' && (options.method === 'GET' || options.method === 'HEAD');
      if (!follow) {
        // Error bodies only feed messages: keep the start of a long one rather than fail on it.
        const ok = response.statusCode >= 200 && response.statusCode < 300;
        if (ok && Number(response.headers['content-length']) > options.limit) {
          response.body.destroy();
          throw new RegistryError('REGISTRY_PROTOCOL', `${options.what}: ${url.host} announced ${foreignText(String(response.headers['content-length']))} bytes, more than the expected ${options.limit}; refusing it`);
        }
        const body = await readBody(response.body, ok ? options.limit : ERROR_BODY_LIMIT, !ok, options.what, url, ok ? options.checkHead : undefined);
        return { status: response.statusCode, headers: response.headers, body, url };
      }
      await response.body.dump();
      if (hop >= MAX_REDIRECTS) throw new RegistryError('REGISTRY_PROTOCOL', `${options.what}: more than ${MAX_REDIRECTS} redirects (last to ${foreignText(location)})`);
      const next = new URL(location, url);
      // Not an outage, which a cached copy may stand in for: the registry answered, wrongly (red team: file:///etc/passwd).
      if (next.protocol !== 'https:' && next.protocol !== 'http:') {
        throw new RegistryError('REGISTRY_PROTOCOL', `${options.what}: ${url.host} redirected to a ${foreignText(next.protocol)} URL; only http(s) redirects are followed`);
      }
      if (next.protocol === 'http:' && url.protocol === 'https:' && !options.allowHttp) {
        throw new RegistryError('REGISTRY_PROTOCOL', `${options.what}: ${url.host} redirected from https to plain http (${next.origin}); refusing (list the registry as insecure only if plain HTTP is really intended)`);
      }
      url = next;
    }
  }

  close(): Promise<void> {
    return this.#agent.close();
  }
}

async function readBody(
  body: AsyncIterable<Uint8Array> & { destroy(): void }, limit: number, truncate: boolean, what: string, url: URL, checkHead?: (head: Uint8Array) => void,
): Promise<Uint8Array> {
  const chunks: Uint8Array[] = [];
  let size = 0;
  let headChecked = !checkHead;
  try {
    for await (const chunk of body) {
      size += chunk.byteLength;
      if (size > limit) {
        body.destroy();
        if (truncate) break;
        throw new RegistryError('REGISTRY_PROTOCOL', `${what}: ${url.host} sent more than the expected ${limit} bytes; refusing it`);
      }
      chunks.push(chunk);
      if (!headChecked && size >= HEAD_BYTES) {
        headChecked = true;
        checkHead!(Buffer.concat(chunks).subarray(0, HEAD_BYTES));
      }
    }
  } catch (error) {
    body.destroy();
    if (error instanceof RegistryError) throw error;
    throw networkError(error, url, what);
  }
  const bytes = new Uint8Array(Buffer.concat(chunks));
  if (!headChecked) checkHead!(bytes);
  return bytes;
}

const TLS_CODES = /^(ERR_TLS_|ERR_SSL_|CERT_|UNABLE_TO_|DEPTH_ZERO_|SELF_SIGNED_|EPROTO$|HOSTNAME_MISMATCH)/;

/** Names the failure the way an operator would look for it: refused, not found, timed out, TLS. */
export function networkError(error: unknown, url: URL, what: string): RegistryError {
  if (error instanceof RegistryError) return error;
  const code = errorCode(error);
  const at = `${url.host} (${url.protocol.replace(':', '')})`;
  if (code && TLS_CODES.test(code)) {
    const hint = code === 'EPROTO' || code.startsWith('ERR_SSL_')
      ? 'if it serves plain HTTP, list it as insecure (--insecure, registries.insecure or PORTCULLIS_INSECURE_REGISTRIES)'
      : 'if its certificate comes from a private CA, trust that CA (PORTCULLIS_REGISTRY_CA or NODE_EXTRA_CA_CERTS)';
    return new RegistryError('REGISTRY_TLS', `${what}: TLS error talking to ${at}: ${code} ${foreignText(oneLine(errorMessage(error)))}; ${hint}`, { cause: error });
  }
  // undici refusing what the registry's answers made of the request (a token with a line break
  // in it as a header): the registry answered, wrongly; no outage a cached copy may stand in for.
  if (code === 'UND_ERR_INVALID_ARG') {
    return new RegistryError('REGISTRY_PROTOCOL', `${what}: the request to ${at} could not be made from what the registry answered: ${foreignText(oneLine(errorMessage(error)))}`, { cause: error });
  }
  const reason = code === 'ECONNREFUSED' ? 'connection refused (is the registry running, and on that port?)'
    : code === 'ENOTFOUND' || code === 'EAI_AGAIN' ? 'host not found (check the registry name and DNS)'
    : code === 'EHOSTUNREACH' || code === 'ENETUNREACH' ? 'host unreachable'
    : code === 'ETIMEDOUT' || code === 'UND_ERR_CONNECT_TIMEOUT' ? 'connection timed out'
    : code === 'UND_ERR_HEADERS_TIMEOUT' || code === 'UND_ERR_BODY_TIMEOUT' ? 'the registry stopped answering (timed out)'
    : code === 'ECONNRESET' || code === 'UND_ERR_SOCKET' || code === 'EPIPE' ? 'connection reset'
    : `${code ?? 'network error'}: ${foreignText(oneLine(errorMessage(error)))}`;
  return new RegistryError('REGISTRY_UNREACHABLE', `${what}: cannot reach ${at}: ${reason}`, { cause: error });
}

// undici rethrows socket errors as they come, sometimes wrapped (cause) or grouped (happy eyeballs).
function errorCode(error: unknown): string | undefined {
  for (let e: unknown = error, depth = 0; e && depth < 5; depth++) {
    const { code, cause, errors } = e as { code?: unknown; cause?: unknown; errors?: unknown };
    if (typeof code === 'string' && code !== 'UND_ERR' && code !== 'ERR_ASSERTION') return code;
    e = cause ?? (Array.isArray(errors) ? errors[0] : undefined);
  }
  return undefined;
}

export function oneLine(text: string): string {
  return text.replace(/\s+/g, ' ').trim();
}
