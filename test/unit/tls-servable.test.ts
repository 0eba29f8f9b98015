// What a reloaded certificate must be before it replaces the served one (tls.mode files).
import { generate, type SelfsignedOptions } from 'selfsigned';
import { describe, expect, it } from 'vitest';
import { checkServable } from '../../host/src/server/tls.ts';

const caOptions: SelfsignedOptions = {
  keyType: 'ec', curve: 'P-256', algorithm: 'sha256', extensions: [{ name: 'basicConstraints', cA: true }, { name: 'keyUsage', keyCertSign: true, digitalSignature: true }],
};

async function leafOf(ca: { private: string; cert: string }, ip: string, dates: { notBeforeDate?: Date; notAfterDate?: Date } = {}) {
  return generate([{ name: 'commonName', value: ip }], {
    keyType: 'ec', curve: 'P-256', algorithm: 'sha256', ...dates, ca: { key: ca.private, cert: ca.cert },
    extensions: [{ name: 'subjectAltName', altNames: [{ type: 7, ip }] }],
  });
}

describe('checkServable', () => {
  it('takes a pair its CA verifies, for the name the apiserver calls, within its dates', async () => {
    const ca = await generate([{ name: 'commonName', value: 'ca' }], caOptions);
    const leaf = await leafOf(ca, '127.0.0.5');
    expect(() => checkServable({ cert: leaf.cert, key: leaf.private, caBundle: ca.cert }, ['127.0.0.5'])).not.toThrow();
  });

  it('refuses a key of another certificate, another CA, another name, an expired or not yet valid certificate', async () => {
    const ca = await generate([{ name: 'commonName', value: 'ca' }], caOptions);
    const other = await generate([{ name: 'commonName', value: 'other-ca' }], caOptions);
    const leaf = await leafOf(ca, '127.0.0.5');
    const foreign = await leafOf(other, '127.0.0.5');
    const elsewhere = await leafOf(ca, '127.0.0.9');
    const expired = await leafOf(ca, '127.0.0.5', { notBeforeDate: new Date(Date.now() - 3 * 86_400_000), notAfterDate: new Date(Date.now() - 86_400_000) });
    const early = await leafOf(ca, '127.0.0.5', { notBeforeDate: new Date(Date.now() + 86_400_000), notAfterDate: new Date(Date.now() + 3 * 86_400_000) });
    const check = (pair: { cert: string; private: string }, key = pair.private) => () => checkServable({ cert: pair.cert, key, caBundle: ca.cert }, ['127.0.0.5']);
    expect(check(leaf, foreign.private)).toThrow(/the key does not belong to the certificate/);
    expect(check(foreign)).toThrow(/does not verify the certificate/);
    expect(check(elsewhere)).toThrow(/does not cover 127\.0\.0\.5, the name the apiserver calls/);
    expect(check(expired)).toThrow(/the certificate expired at/);
    expect(check(early)).toThrow(/is not valid before/);
  });
});
