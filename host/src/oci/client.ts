// The OCI Distribution API for one repository: manifests and blobs, read and written, with
// the registry's auth dance (anonymous, Basic, or a Bearer token fetched from the realm its
// challenge names). Status codes become RegistryErrors naming the registry, repository and
// reference; what the bytes mean is for pull.ts and push.ts.
import { basicAuthorization, parseChallenge, type CredentialLookup } from './auth.ts';
import { RegistryError } from './errors.ts';
import { foreignText } from '../util/text.ts';
import { apiHost } from './reference.ts';
import { oneLine, Transport, type Exchange, type SendOptions } from './transport.ts';

export interface ClientOptions {
  registry: string;
  repository: string;
  /** Plain HTTP: only for registries the user listed as insecure. */
  insecure: boolean;
  /** Whether the user listed `host` ("name:port") as insecure: a token realm elsewhere over plain HTTP must be. */
  insecureHost?: (host: string) => boolean;
  /** Extra CA (PEM) to trust, e.g. a test registry's self-signed certificate. */
  ca?: string;
  credentials: CredentialLookup;
  /** Token scope we ask for up front, so a push does not need a second token. */
  actions: 'pull' | 'pull,push';
  timeouts?: Timeouts;
}

/** Whole-request deadlines: `requestMs` for one request (its 401, token exchange and second try included), plus a second per `blobBytesPerSecond` of a blob. */
export interface Timeouts {
  requestMs: number;
  blobBytesPerSecond: number;
}

// A minute is long for a manifest or a token; a blob gets that plus a second per 256 KiB, a
// link slower than that is not one to load policies over (32 MiB, the default module limit:
// about three minutes).
export const DEFAULT_TIMEOUTS: Timeouts = { requestMs: 60_000, blobBytesPerSecond: 256 * 1024 };

/** Manifests, tokens, error bodies (distribution's own manifest cap). */
export const MAX_SMALL = 4 * 1024 * 1024;
/**
 * Longest manifest read: a policy's is a few KB (a config and a layer or two). Red team 13: 4 MiB
 * of one annotations map of 470,000 keys passed every other bound and cost 0.3 s to parse.
 */
export const MAX_MANIFEST_BYTES = 256 * 1024;

type Request = Omit<SendOptions, 'origin' | 'allowHttp' | 'authorization' | 'limit' | 'deadlineMs'> & { limit?: number; deadlineMs?: number };

export class RegistryClient {
  readonly registry: string;
  readonly repository: string;
  readonly #options: ClientOptions;
  readonly #base: URL;
  readonly #transport: Transport;
  #authorization: string | undefined;

  constructor(options: ClientOptions) {
    this.registry = options.registry;
    this.repository = options.repository;
    this.#options = options;
    this.#base = new URL(`${options.insecure ? 'http' : 'https'}://${apiHost(options.registry)}/`);
    this.#transport = new Transport(options.ca);
  }

  close(): Promise<void> {
    return this.#transport.close();
  }

  /** The manifest bytes exactly as stored (their sha256 is the manifest digest). */
  async getManifest(reference: string, accept: readonly string[], what: string): Promise<{ bytes: Uint8Array; mediaType: string | undefined }> {
    const response = await this.#send(this.#path('manifests', reference), { method: 'GET', headers: { accept: accept.join(', ') }, what });
    if (response.status === 404) throw this.#notFound(response, `${what}: the registry has no such manifest (push it first, or check the tag or digest)`);
    this.#expect(response, [200], what);
    // A manifest's fields go into errors that /readyz shows: only the registry's own host gets to
    // write them (red team 13: a manifest GET redirected to an internal service showed its answer there).
    if (response.url.hostname !== this.#base.hostname) {
      throw new RegistryError('REGISTRY_PROTOCOL', `${what}: ${this.registry} sent the manifest from another host (${response.url.host}); a manifest is read only from the registry itself`);
    }
    if (response.body.length > MAX_MANIFEST_BYTES) {
      throw new RegistryError('UNSUPPORTED_MANIFEST', `${what}: the manifest is ${response.body.length} bytes; a policy's manifest is a few KB, and at most ${MAX_MANIFEST_BYTES / 1024} KiB is read`);
    }
    const type = response.headers['content-type'];
    return { bytes: response.body, mediaType: typeof type === 'string' ? type.split(';')[0]!.trim() : undefined };
  }

  /**
   * Blob bytes, at most `size` of them; checking their digest is the caller's job. `checkHead`
   * sees the first bytes as they arrive and may throw to stop the download there.
   */
  async getBlob(digest: string, size: number, what: string, checkHead?: (head: Uint8Array) => void): Promise<Uint8Array> {
    const response = await this.#send(this.#path('blobs', digest), { method: 'GET', limit: size, what, deadlineMs: this.#blobDeadline(size), ...(checkHead ? { checkHead } : {}) });
    if (response.status === 404) throw this.#notFound(response, `${what}: blob ${digest} listed by the manifest is missing from the repository`);
    this.#expect(response, [200], what);
    return response.body;
  }

  async hasBlob(digest: string, what: string): Promise<boolean> {
    const response = await this.#send(this.#path('blobs', digest), { method: 'HEAD', what });
    if (response.status === 404) return false;
    this.#expect(response, [200], what);
    return true;
  }

  /** POST opens an upload session, one PUT closes it with the whole blob (a "monolithic" upload). */
  async putBlob(digest: string, bytes: Uint8Array, what: string): Promise<void> {
    const opened = await this.#send(this.#path('blobs', 'uploads/'), { method: 'POST', what });
    this.#expect(opened, [202], what);
    const location = opened.headers.location;
    if (typeof location !== 'string') throw new RegistryError('REGISTRY_PROTOCOL', `${what}: ${this.registry} opened an upload without a Location`);
    const url = new URL(location, opened.url);
    url.searchParams.set('digest', digest);
    const closed = await this.#send(url, {
      method: 'PUT', what, body: bytes, headers: { 'content-type': 'application/octet-stream' }, deadlineMs: this.#blobDeadline(bytes.length),
    });
    this.#expect(closed, [201, 204], what);
  }

  /** Stores a manifest under `tag`; returns the digest the registry says it has. */
  async putManifest(tag: string, bytes: Uint8Array, mediaType: string, what: string): Promise<string | undefined> {
    const response = await this.#send(this.#path('manifests', tag), { method: 'PUT', what, body: bytes, headers: { 'content-type': mediaType } });
    this.#expect(response, [201, 204], what);
    const digest = response.headers['docker-content-digest'];
    return typeof digest === 'string' ? digest : undefined;
  }

  #blobDeadline(size: number): number {
    const { requestMs, blobBytesPerSecond } = this.#options.timeouts ?? DEFAULT_TIMEOUTS;
    return requestMs + Math.ceil((size / blobBytesPerSecond) * 1000);
  }

  #path(kind: 'manifests' | 'blobs', reference: string): URL {
    return new URL(`/v2/${this.repository}/${kind}/${reference}`, this.#base);
  }

  // A 401 from the registry itself is answered once per request: a first contact, or an
  // expired token. A second 401 means the credentials are not good enough. The request's
  // deadline covers its token exchange and second try too: each used to get a deadline of its
  // own, so a registry slow at each step held a pull for three.
  async #send(url: URL, request: Request): Promise<Exchange> {
    const requestMs = request.deadlineMs ?? (this.#options.timeouts ?? DEFAULT_TIMEOUTS).requestMs;
    const until = Date.now() + requestMs;
    const options = (): SendOptions => ({
      limit: MAX_SMALL, ...request, deadlineMs: left(until), requestMs, origin: this.#base.origin, allowHttp: this.#options.insecure,
      ...(this.#authorization ? { authorization: this.#authorization } : {}),
    });
    const first = await this.#transport.send(url, options());
    if (first.status !== 401 || first.url.origin !== this.#base.origin) return first;
    const before = this.#authorization;
    await this.#authenticate(first, request.what, until, requestMs);
    if (this.#authorization === before) return first;
    return this.#transport.send(url, options());
  }

  async #authenticate(response: Exchange, what: string, until: number, requestMs: number): Promise<void> {
    const challenge = parseChallenge(response.headers['www-authenticate']);
    const { credentials } = this.#options.credentials;
    if (challenge?.scheme === 'basic') {
      if (credentials) this.#authorization = basicAuthorization(credentials);
      return;
    }
    const realm = challenge?.params.realm;
    if (!realm) return;
    let url: URL;
    try {
      url = new URL(realm);
    } catch {
      throw new RegistryError('REGISTRY_PROTOCOL', `${what}: ${this.registry} named a token realm that is not a URL: ${foreignText(realm)}`);
    }
    // The realm gets our password: only over TLS, unless the user accepted plain HTTP there. An
    // insecure registry's own host has it in plain text anyway (Basic auth); any other host must
    // be listed itself (red team 12: a registry named an http realm on another port, and got it).
    const plainAccepted = url.hostname === this.#base.hostname ? this.#options.insecure : this.#options.insecureHost?.(url.host) ?? false;
    if (url.protocol !== 'https:' && !(url.protocol === 'http:' && plainAccepted)) {
      throw new RegistryError('REGISTRY_PROTOCOL', `${what}: ${this.registry} asks for a token from ${url.origin}, which is not https; refusing to send credentials there (list ${url.host} in registries.insecure or PORTCULLIS_INSECURE_REGISTRIES if plain HTTP is really meant)`);
    }
    if (challenge.params.service) url.searchParams.set('service', challenge.params.service);
    const scopes = new Set([`repository:${this.repository}:${this.#options.actions}`, ...(challenge.params.scope?.split(' ').filter(Boolean) ?? [])]);
    for (const scope of scopes) url.searchParams.append('scope', scope);
    const answer = await this.#transport.send(url, {
      method: 'GET', limit: MAX_SMALL, deadlineMs: left(until), requestMs,
      what: `${what} (token from ${url.host})`, origin: url.origin, allowHttp: this.#options.insecure,
      ...(credentials ? { authorization: basicAuthorization(credentials) } : {}),
    });
    this.#expect(answer, [200], `${what} (token from ${url.host})`);
    let token: unknown;
    try {
      const json = JSON.parse(Buffer.from(answer.body).toString('utf8')) as { token?: unknown; access_token?: unknown };
      token = json.token ?? json.access_token;
    } catch {
      // reported below
    }
    if (typeof token !== 'string' || !token) throw new RegistryError('REGISTRY_PROTOCOL', `${what}: the token service ${url.host} answered without a token`);
    this.#authorization = `Bearer ${token}`;
  }

  #expect(response: Exchange, statuses: number[], what: string): void {
    if (statuses.includes(response.status)) return;
    const detail = this.#detail(response);
    const status = `HTTP ${response.status}${detail ? ` ${detail}` : ''}`;
    if (response.status === 401 || response.status === 403) {
      const { credentials, source, helpers } = this.#options.credentials;
      const hint = credentials
        ? `check the credentials for ${this.registry} in ${source}${response.status === 403 ? ` (they may not allow ${this.#options.actions} on ${this.repository})` : ''}`
        : `no credentials for ${this.registry} in ${source}: add them there (docker login ${this.registry}, or an "auths" entry)${helpers ? '; credential helpers (credsStore/credHelpers) are not used' : ''}`;
      throw new RegistryError('REGISTRY_UNAUTHORIZED', `${what}: ${response.url.host} refused access (${status}); ${hint}`);
    }
    if (response.status === 404) throw this.#notFound(response, `${what}: not found`);
    if (response.status === 429 || response.status >= 500) {
      throw new RegistryError('REGISTRY_UNAVAILABLE', `${what}: ${response.url.host} is not serving requests (${status}); try again later`);
    }
    throw new RegistryError('REGISTRY_PROTOCOL', `${what}: unexpected answer from ${response.url.host} (${status})`);
  }

  /**
   * registryDetail, from the registry's own host only (its token service often runs there on
   * another port): the message goes into errors that /readyz shows on the webhook port, and a
   * redirect's target is whatever the registry names (red team 12: a blob redirected to an
   * internal service, whose answer /readyz then showed anyone).
   */
  #detail(response: Exchange): string {
    return response.url.hostname === this.#base.hostname ? registryDetail(response) : '';
  }

  #notFound(response: Exchange, message: string): RegistryError {
    const detail = this.#detail(response);
    return new RegistryError('REGISTRY_NOT_FOUND', `${message} (HTTP 404${detail ? ` ${detail}` : ''})`);
  }
}

/** The registry's own words from an error body: `{"errors":[{"code":…,"message":…}]}`. */
function registryDetail(response: Exchange): string {
  try {
    const json = JSON.parse(Buffer.from(response.body).toString('utf8')) as { errors?: { code?: unknown; message?: unknown }[] };
    const first = json.errors?.[0];
    if (!first) return '';
    const text = (value: unknown) => (typeof value === 'string' ? value : JSON.stringify(value) ?? '');
    return foreignText(oneLine(`${text(first.code)}: ${text(first.message)}`));
  } catch {
    return '';
  }
}

/** What is left of a request's deadline, ms: at least 1, so that a spent one fails at once rather than never. */
function left(until: number): number {
  return Math.max(1, until - Date.now());
}
