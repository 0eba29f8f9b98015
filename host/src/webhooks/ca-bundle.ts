// The caBundle the managed webhooks carry. When the serving certificate is replaced, the
// apiserver may still hold connections (or a cached bundle) for the old one, so for an overlap
// period the bundle holds both CAs: the new first, then the previous.
export class CaBundle {
  #current: string | undefined;
  #previous: string | undefined;
  #overlapUntil = 0;
  readonly #now: () => number;

  constructor(initial: string | undefined, now: () => number = Date.now) {
    this.#current = initial;
    this.#now = now;
  }

  get current(): string | undefined {
    return this.#current;
  }

  /** Takes a new CA; false if it is the one already current. */
  rotate(pem: string, overlapMs: number): boolean {
    if (pem === this.#current) return false;
    this.#previous = this.#current;
    this.#current = pem;
    this.#overlapUntil = this.#now() + overlapMs;
    return true;
  }

  /** PEM for the webhooks: the current CA, plus the previous one during the overlap. */
  bundle(): string | undefined {
    if (!this.#current) return undefined;
    return this.#previous && this.#now() < this.#overlapUntil ? `${this.#current.trim()}\n${this.#previous.trim()}\n` : this.#current;
  }

  /** Whether a webhook's caBundle (base64, as stored) already trusts `pem`. */
  static trusts(encoded: string | undefined, pem: string): boolean {
    const bundle = encoded ? Buffer.from(encoded, 'base64').toString('utf8') : '';
    return bundle.includes(pem.trim());
  }
}
