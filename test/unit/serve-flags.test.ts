import { expect, it } from 'vitest';
import { parseConfig } from '../../host/src/config/load.ts';
import { applyFlags, BUILTIN_CONFIG } from '../../host/src/cli/serve.ts';
import { loadConfigFile } from '../../host/src/config/load.ts';

const base = () => parseConfig('server: { tls: { mode: self-signed, hostnames: [a.example] } }\npolicies: []', '/etc/p.yaml');

it('lets --host and --port override the file', () => {
  const config = applyFlags(base(), { host: '127.0.0.1', port: '9443' });
  expect(config.server).toMatchObject({ host: '127.0.0.1', port: 9443 });
});

it('picks the TLS mode from --tls-self-signed, --cert/--key or --insecure', () => {
  expect(applyFlags(base(), { insecure: true }).server.tls).toEqual({ mode: 'insecure' });
  expect(applyFlags(base(), { cert: 'c.pem', key: 'k.pem' }).server.tls).toMatchObject({ mode: 'files', certFile: 'c.pem', keyFile: 'k.pem' });
  expect(applyFlags(base(), { 'tls-self-signed': true, cadump: 'ca.pem' }).server.tls).toMatchObject({ mode: 'self-signed', hostnames: ['a.example'], cadump: 'ca.pem' });
  expect(applyFlags(base(), { 'client-ca': 'clients.pem' }).server.tls).toMatchObject({ mode: 'self-signed', clientCA: 'clients.pem', requireClientCert: true });
});

it('refuses contradictory or malformed flags', () => {
  expect(() => applyFlags(base(), { insecure: true, 'tls-self-signed': true })).toThrow('choose one of --tls-self-signed, --cert/--key and --insecure');
  expect(() => applyFlags(base(), { cert: 'c.pem' })).toThrow('--cert and --key go together');
  expect(() => applyFlags(base(), { port: 'http' })).toThrow('--port must be 0..65535, not "http"');
  expect(() => applyFlags(base(), { insecure: true, cadump: 'x' })).toThrow('--cadump writes the self-signed certificate');
});

it('defaults to the built-in example policies on 0.0.0.0:8443', async () => {
  const config = await loadConfigFile(BUILTIN_CONFIG);
  expect(config.server).toMatchObject({ host: '0.0.0.0', port: 8443, tls: { mode: 'self-signed' } });
  expect(config.policies.map((p) => p.name)).toEqual(['numbers', 'no-delete', 'added-by', 'resources-oversell', 'require-labels', 'show-auth']);
});
