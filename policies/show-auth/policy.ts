// Tells the user who called the webhook: the TLS peer's common name, and whether an
// Authorization header came along. Never its value.
import { definePolicy } from '@portcullis/sdk';

export default definePolicy({
  validate({ sslpeer, headers, warnings }) {
    const cn = sslpeer?.subject?.CN;
    warnings.push(cn ? `TLS peer: CN=${cn}` : 'TLS peer: none (no verified client certificate)');
    warnings.push(`Authorization header: ${'authorization' in headers ? 'present' : 'absent'}`);
  },
});
