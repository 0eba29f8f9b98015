// tls.mode "secret" and the operator-facing server fields: defaults, and the errors for what
// cannot work (no Service to issue the certificate for, a name Kubernetes would refuse).
import { describe, expect, it } from 'vitest';
import { parseConfig } from '../../host/src/config/load.ts';
import { ConfigError } from '../../host/src/errors.ts';

const managed = 'webhooks: { managed: portcullis.dev, service: { name: portcullis, namespace: portcullis } }';

describe('tls.mode secret', () => {
  it('defaults the Secret name and validity, and the new server fields', () => {
    const config = parseConfig(`server: { tls: { mode: secret } }\n${managed}\npolicies: []`, 'c.yaml');
    expect(config.server.tls).toEqual({ mode: 'secret', secretName: 'portcullis-tls', validityDays: 365, requireClientCert: false });
    expect(config.server).toMatchObject({ readyWhenAllPoliciesLoaded: false, logAllowedReviews: false });
    expect(config.server.metricsPort).toBeUndefined();
  });

  it('needs managed webhooks reached through a Service, and says so', () => {
    expect(() => parseConfig('server: { tls: { mode: secret } }\npolicies: []', 'c.yaml')).toThrow(ConfigError);
    expect(() => parseConfig('server: { tls: { mode: secret } }\nwebhooks: { managed: portcullis.dev, url: "https://x:1" }\npolicies: []', 'c.yaml'))
      .toThrow(/c\.yaml: \/server\/tls: mode "secret" .* set webhooks\.managed and webhooks\.service/);
  });

  it('refuses a Secret name Kubernetes would refuse, and a validity out of range', () => {
    expect(() => parseConfig(`server: { tls: { mode: secret, secretName: Bad_Name } }\n${managed}\npolicies: []`, 'c.yaml')).toThrow(/secretName/);
    expect(() => parseConfig(`server: { tls: { mode: secret, validityDays: 0 } }\n${managed}\npolicies: []`, 'c.yaml')).toThrow(/validityDays/);
    expect(() => parseConfig('server: { metricsPort: 70000 }\npolicies: []', 'c.yaml')).toThrow(/metricsPort/);
  });
});
