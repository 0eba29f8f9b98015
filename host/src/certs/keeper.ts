// Keeps the serving certificate in the cluster (tls.mode "secret"): fills the Secret when it
// is empty, lets every replica serve from it and follow its changes, and has the leader
// rotate it well before expiry. Rotation order is what keeps the apiserver's calls working:
//   1. the leader issues a new CA + certificate,
//   2. publishes caBundle = new CA + old CA in the webhook configurations and waits for it,
//   3. only then writes the Secret; each replica (the leader too) switches when it reads it,
//      after checking the new CA is published (WebhookManager.publishCa).
import { errorMessage, PortcullisError } from '../errors.ts';
import type { Logger } from '../util/log.ts';
import { KubeApiError, statusOf } from '../webhooks/kube.ts';
import { CertificateInvalidError, checkBundle, issueBundle, renewalTime, type CheckedBundle } from './issue.ts';
import { ISSUED_BY_ANNOTATION, NOT_AFTER_ANNOTATION, type SecretApi, type StoredSecret } from './secret-store.ts';

/** The Secret cannot be used at all (missing, or RBAC denies it): an operator has to act. */
export class CertificateSecretError extends PortcullisError {
  constructor(message: string, options?: { cause?: unknown }) {
    super('CERTIFICATE_SECRET_UNUSABLE', message, options);
  }
}

export interface CertificateKeeperOptions {
  secret: SecretApi;
  dnsNames: string[];
  validityDays: number;
  log: Logger;
  /** Read again this often (a replica picks up a rotation within this time). Default 5 s. */
  pollMs?: number;
  identity?: string;
  now?: () => Date;
}

/** What the keeper needs from the rest of the host while following the Secret. */
export interface CertificateHooks {
  /** Whether this replica may rotate (the webhook manager's leader check). */
  isLeader(): boolean;
  /** Runs a write to the cluster only while this replica surely leads (the manager's lease fence). */
  fence<T>(what: string, write: () => Promise<T>): Promise<T>;
  /** Publish `ca` in the webhooks' caBundle (beside the old one) and wait; false if it could not. */
  publishCa(ca: string): Promise<boolean>;
  /** Start serving `bundle` (the server publishes/awaits its CA first, then swaps the context). */
  serve(bundle: CheckedBundle): Promise<void>;
}

export class CertificateKeeper {
  readonly #o: CertificateKeeperOptions;
  readonly #now: () => Date;
  #current: CheckedBundle | undefined;
  #timer: NodeJS.Timeout | undefined;
  #round: Promise<void> | undefined;
  #stopped = false;
  #lastError = '';

  constructor(options: CertificateKeeperOptions) {
    this.#o = options;
    this.#now = options.now ?? (() => new Date());
  }

  get #ref(): string {
    return this.#o.secret.ref;
  }

  get current(): CheckedBundle | undefined {
    return this.#current;
  }

  /**
   * The certificate to start serving with. Fills the Secret if it is empty or unusable: before
   * any certificate exists no replica can serve, so this does not wait for a leader; two
   * replicas racing are settled by the resourceVersion (the loser reads the winner's).
   * Retries until `deadlineMs`, then throws what an operator has to fix.
   */
  async initial(deadlineMs = 120_000): Promise<CheckedBundle> {
    const deadline = Date.now() + deadlineMs;
    for (let delay = 500; ; delay = Math.min(delay * 2, 5_000)) {
      try {
        const stored = await this.#o.secret.read();
        const usable = this.#usable(stored);
        if (usable) {
          this.#current = usable;
          return usable;
        }
        const written = await this.#issueAndWrite(stored.resourceVersion, 'no usable certificate in the Secret');
        this.#current = written;
        return written;
      } catch (error) {
        const message = describe(error, this.#o.secret.ref);
        if (statusOf(error) !== 409) this.#o.log.error('TLS: cannot get a serving certificate from the Secret yet; retrying', { secret: this.#ref, message });
        if (Date.now() + delay > deadline) {
          throw new CertificateSecretError(`no serving certificate after ${Math.round(deadlineMs / 1000)} s: ${message}`, { cause: error });
        }
        await sleep(delay);
      }
    }
  }

  /** Polls the Secret: serves what another replica wrote, and rotates as the leader when due. */
  follow(hooks: CertificateHooks): void {
    const pollMs = this.#o.pollMs ?? 5_000;
    const tick = () => {
      if (this.#stopped) return;
      this.#round = this.#poll(hooks).finally(() => {
        this.#round = undefined;
        if (!this.#stopped) {
          this.#timer = setTimeout(tick, pollMs);
          this.#timer.unref();
        }
      });
    };
    this.#timer = setTimeout(tick, pollMs);
    this.#timer.unref();
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    clearTimeout(this.#timer);
    await this.#round;
  }

  async #poll(hooks: CertificateHooks): Promise<void> {
    try {
      const stored = await this.#o.secret.read();
      const usable = this.#usable(stored);
      if (usable && usable.fingerprint !== this.#current?.fingerprint) {
        this.#o.log.info('TLS: the Secret holds a new certificate; switching to it', {
          secret: this.#ref, fingerprint: usable.fingerprint, notAfter: usable.notAfter.toISOString(),
        });
        await hooks.serve(usable);
        this.#current = usable;
      }
      const reason = this.#rotationReason(stored, usable);
      if (reason && hooks.isLeader()) await this.#rotate(stored.resourceVersion, reason, hooks);
      this.#lastError = '';
    } catch (error) {
      const message = describe(error, this.#o.secret.ref);
      // One line per distinct problem: a Secret that stays unreadable must not flood the log.
      if (message !== this.#lastError && statusOf(error) !== 409) {
        this.#o.log.error('TLS: certificate Secret check failed; serving the current certificate', { secret: this.#ref, message });
      }
      this.#lastError = message;
    }
  }

  #rotationReason(stored: StoredSecret, usable: CheckedBundle | undefined): string | undefined {
    if (!usable) return 'no usable certificate in the Secret';
    if (stored.rotateRequested) return 'rotation requested by annotation';
    if (this.#now() >= renewalTime(usable)) return `renewal due (expires ${usable.notAfter.toISOString()})`;
    return undefined;
  }

  async #rotate(resourceVersion: string, reason: string, hooks: CertificateHooks): Promise<void> {
    const next = checkBundle(await issueBundle(this.#o.dnsNames, this.#o.validityDays, this.#now()), this.#o.dnsNames, this.#now());
    this.#o.log.info('TLS: rotating the serving certificate; publishing the new CA first', { secret: this.#ref, reason });
    if (!(await hooks.publishCa(next.ca))) {
      // Writing anyway would make replicas present a certificate the apiserver cannot verify.
      this.#o.log.error('TLS: rotation postponed: the new CA could not be published in the webhook configurations', { secret: this.#ref });
      await this.#republishServed(hooks);
      return;
    }
    if (!hooks.isLeader()) return this.#republishServed(hooks);
    let written: CheckedBundle;
    try {
      written = await hooks.fence(`Secret ${this.#ref}`, () => this.#write(resourceVersion, next));
    } catch (error) {
      await this.#republishServed(hooks);
      throw error;
    }
    this.#o.log.info('TLS: rotated the serving certificate', { secret: this.#ref, fingerprint: written.fingerprint, notAfter: written.notAfter.toISOString() });
    await hooks.serve(written);
    this.#current = written;
  }

  /**
   * After a rotation that did not happen: make the served CA the manager's current one again.
   * Otherwise the next rotation would keep the unused CA as "previous" and drop the served one.
   */
  async #republishServed(hooks: CertificateHooks): Promise<void> {
    if (!this.#current) return;
    try {
      await hooks.publishCa(this.#current.ca);
    } catch (error) {
      this.#o.log.error('TLS: could not publish the served CA again after a failed rotation', { secret: this.#ref, message: errorMessage(error) });
    }
  }

  async #issueAndWrite(resourceVersion: string, reason: string): Promise<CheckedBundle> {
    const bundle = checkBundle(await issueBundle(this.#o.dnsNames, this.#o.validityDays, this.#now()), this.#o.dnsNames, this.#now());
    const written = await this.#write(resourceVersion, bundle);
    this.#o.log.info('TLS: issued a CA and serving certificate into the Secret', {
      secret: this.#ref, reason, dnsNames: this.#o.dnsNames, notAfter: written.notAfter.toISOString(),
    });
    return written;
  }

  async #write(resourceVersion: string, bundle: CheckedBundle): Promise<CheckedBundle> {
    await this.#o.secret.write(resourceVersion, bundle, {
      [NOT_AFTER_ANNOTATION]: bundle.notAfter.toISOString(),
      ...(this.#o.identity ? { [ISSUED_BY_ANNOTATION]: this.#o.identity } : {}),
    });
    return bundle;
  }

  #usable(stored: StoredSecret): CheckedBundle | undefined {
    if (!stored.bundle) return undefined;
    try {
      return checkBundle(stored.bundle, this.#o.dnsNames, this.#now());
    } catch (error) {
      if (!(error instanceof CertificateInvalidError)) throw error;
      const message = `the certificate in the Secret cannot be served: ${error.message}`;
      if (message !== this.#lastError) this.#o.log.warn(`TLS: ${message}; a new one will be issued`, { secret: this.#ref });
      this.#lastError = message;
      return undefined;
    }
  }
}

function describe(error: unknown, ref: string): string {
  if (error instanceof KubeApiError && error.status === 404) {
    const [namespace, name] = ref.split('/');
    return `the Secret ${ref} does not exist; the host only reads and updates it (RBAC cannot limit "create" by name): `
      + `apply deploy/10-rbac.yaml, or create it empty with kubectl -n ${namespace} create secret generic ${name}`;
  }
  return errorMessage(error);
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
