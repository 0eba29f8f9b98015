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
