// Tells the user who called the webhook: the TLS peer's common name, and whether an
// Authorization header came along. Never its value.
import { definePolicy } from '@portcullis/sdk';

export default definePolicy({
  validate({ sslpeer, headers, warnings }) {
    const cn = sslpeer?.subject?.CN;
    warnings.push(cn ? `TLS peer: CN=${String(cn)}` : 'TLS peer: none (no verified client certificate)');
    // A client certificate's groups: one O is a string, several are a list.
    const groups = sslpeer?.subject?.O;
    if (groups !== undefined) warnings.push(`TLS peer groups (O): ${JSON.stringify(typeof groups === 'string' ? [groups] : groups)}`);
    warnings.push(`Authorization header: ${'authorization' in headers ? 'present' : 'absent'}`);
  },
});
