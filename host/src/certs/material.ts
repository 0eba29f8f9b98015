// The key, certificate and CAs the HTTPS server serves with, wherever they come from (self-signed,
// files, or the cluster Secret kept by this folder).
export interface TlsMaterial {
  key: string;
  cert: string;
  /** PEM of the CA that signed `cert`, for webhook caBundles. */
  caBundle: string;
  /** CA to verify client certificates with, if configured. */
  clientCA?: string;
  requireClientCert: boolean;
}
