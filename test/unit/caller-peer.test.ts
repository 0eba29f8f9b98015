// What a policy sees of the caller's certificate: repeated name attributes stay a list.
import { describe, expect, it } from 'vitest';
import { peerCertificate } from '../../host/src/server/caller.ts';

const base = { serialNumber: '01', valid_from: 'Jan 1 2026', valid_to: 'Jan 1 2027', fingerprint256: 'AB:CD' };

describe('peerCertificate', () => {
  it('keeps a repeated attribute as a list, so a comma in one value cannot pass for two', () => {
    const two = peerCertificate({ ...base, subject: { CN: 'alice', O: ['a', 'system:masters'] }, issuer: { CN: 'ca' } });
    const one = peerCertificate({ ...base, subject: { CN: 'alice', O: 'a, system:masters' }, issuer: { CN: 'ca' } });
    expect(two.subject).toEqual({ CN: 'alice', O: ['a', 'system:masters'] });
    expect(one.subject).toEqual({ CN: 'alice', O: 'a, system:masters' });
    expect(two.subject.O).not.toEqual(one.subject.O);
  });

  it('renames Node fields to the contract and tolerates a missing issuer', () => {
    expect(peerCertificate({ ...base, subject: { CN: 'x' } })).toEqual({
      subject: { CN: 'x' }, issuer: {}, serialNumber: '01', validFrom: 'Jan 1 2026', validTo: 'Jan 1 2027', fingerprint256: 'AB:CD',
    });
  });
});
