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
