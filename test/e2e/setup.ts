// After every e2e test: if the kube-apiserver died, say why here, not as a string of
// "connection refused" failures in the tests that follow.
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterEach, inject } from 'vitest';

afterEach(async () => {
  const log = await readFile(join(inject('apiserverDir'), 'apiserver.log'), 'utf8').catch(() => '');
  const crash = /^(fatal error: .*|panic: .*)$/m.exec(log);
  if (!crash) return;
  const reflect2 = /reflect2|mapiterinit/.test(log)
    ? ' It is the known crash of a kube-apiserver 1.20 built with Go >= 1.18 and the vendored github.com/modern-go/reflect2 v1.0.1, when it encodes a mutating webhook\'s patch: build it with reflect2 v1.0.2 (Debian: golang-github-modern-go-reflect2-dev) and point KUBE_APISERVER at it; see docs/webhooks.md.'
    : '';
  throw new Error(`the kube-apiserver crashed (${crash[0]}); see ${join(inject('apiserverDir'), 'apiserver.log')}.${reflect2}`);
});
