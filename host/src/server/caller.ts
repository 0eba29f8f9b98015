// Who is asking, as the HTTP layer saw it: the endpoint, the mode it implies, and what a policy
// may read about the caller (headers, TLS peer certificate). Shared by the pipeline and telemetry.
import type { Mode, PeerCertificate } from '@portcullis/sdk';

export interface Caller {
  /** `/validate`, `/mutate`, `/validate/<policy>` or `/mutate/<policy>`. */
  endpoint: string;
  mode: Mode;
  /** Set for per-policy endpoints. */
  policy?: string;
  headers: Record<string, string>;
  sslpeer: PeerCertificate | null;
  /** How long the caller waits for the answer: the apiserver's `?timeout=` (a Go duration, e.g. `10s`). */
  timeoutMs?: number;
}

const DURATION = /^(?:(\d+(?:\.\d+)?)(h|m|s|ms|us|µs|ns))+$/;
const PART = /(\d+(?:\.\d+)?)(h|ms|m|s|us|µs|ns)/g;
const UNIT_MS: Record<string, number> = { h: 3_600_000, m: 60_000, s: 1000, ms: 1, us: 0.001, µs: 0.001, ns: 0.000001 };

/** A Go duration (`10s`, `2.5s`, `1m30s`, `500ms`) in ms, within 1 ms..60 s; undefined when it is not one. */
export function goDurationMs(text: string | null): number | undefined {
  if (!text || text.length > 32 || !DURATION.test(text)) return undefined;
  let ms = 0;
  for (const [, value, unit] of text.matchAll(PART)) ms += Number(value) * UNIT_MS[unit!]!;
  return ms >= 1 && ms <= 60_000 ? ms : undefined;
}

/** What Node says of a verified peer certificate, as much of it as a policy sees. */
export interface TlsPeer {
  subject?: object;
  issuer?: object;
  serialNumber: string;
  valid_from: string;
  valid_to: string;
  fingerprint256: string;
}

export function peerCertificate(cert: TlsPeer): PeerCertificate {
  return {
    subject: names(cert.subject), issuer: names(cert.issuer), serialNumber: cert.serialNumber,
    validFrom: cert.valid_from, validTo: cert.valid_to, fingerprint256: cert.fingerprint256,
  };
}

/** Node gives a repeated attribute as a list: kept a list (red team: "a, system:masters" joined
 * was the same string for `O=a` + `O=system:masters` and for one `O` holding a comma). */
function names(of: object | undefined): Record<string, string | string[]> {
  return Object.fromEntries(Object.entries(of ?? {}).map(([k, v]: [string, unknown]) => [k, Array.isArray(v) ? v.map(String) : String(v)]));
}
