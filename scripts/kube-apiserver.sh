#!/usr/bin/env bash
# Builds a real kube-apiserver (Kubernetes 1.20.2) from Debian's source package
# and prints the path of the binary. Cached: later calls print the cached path at once.
#
#   KUBE_APISERVER=$(scripts/kube-apiserver.sh)
#
# The recipe of ../shared/tools/kube-apiserver.sh (kept here so the repository builds its
# own), with the same fix: the vendored
# github.com/modern-go/reflect2 v1.0.1 iterates maps with a pre-Go-1.18 layout, so an
# apiserver built with Debian's go1.19 segfaults (fatal error: fault, in mapiterinit)
# whenever it encodes a mutating webhook's patch. Debian ships reflect2 v1.0.2, which
# is swapped into vendor/ below. The binary is cached under a name that says so (the
# shared tool uses the same one), so a binary built without the fix is never taken for it.
#
# Needs root for apt-get (as on these machines). Takes about 10 minutes on 2 cores
# the first time; set PORTCULLIS_CACHE to move the cache (default ~/.cache/portcullis).
set -euo pipefail
cache=${PORTCULLIS_CACHE:-$HOME/.cache/portcullis}
bin=$cache/kube-apiserver-1.20.2-reflect2
if [[ -x $bin ]]; then echo "$bin"; exit 0; fi
mkdir -p "$cache"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
log=$cache/kube-apiserver-reflect2-build.log
{
  export DEBIAN_FRONTEND=noninteractive
  # Debian's source packages come from the same archive as the binary ones: copy the first
  # `Types: deb` stanza of the machine's own sources as a `deb-src` one.
  if ! grep -rqs '^Types:.*deb-src' /etc/apt/sources.list.d/; then
    awk 'BEGIN { RS = ""; ORS = "\n\n" } /Types: deb/ && /Suites:[^\n]*bookworm/ { sub(/Types: deb/, "Types: deb-src"); print; exit }' \
      /etc/apt/sources.list.d/*.sources > /etc/apt/sources.list.d/portcullis-deb-src.sources
  fi
  apt-get update -qq
  apt-get install -y -qq golang-go rsync dpkg-dev golang-github-modern-go-reflect2-dev >/dev/null
  cd "$work"
  apt-get source --download-only kubernetes
  tar xzf kubernetes_*.orig.tar.gz
  cd kubernetes-*/
  rm -rf vendor/github.com/modern-go/reflect2
  cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 vendor/github.com/modern-go/reflect2
  sed -i "s|^# github.com/modern-go/reflect2 v1.0.1$|# github.com/modern-go/reflect2 v1.0.2|" vendor/modules.txt
  # go1.19 refuses the Go 1.15-era vendor metadata: make every vendored module an
  # explicit requirement at the version vendor/modules.txt records.
  python3 - <<'PY'
lines = open('vendor/modules.txt').read().splitlines()
out, reqs, reps, i = [], [], [], 0
while i < len(lines):
    l = lines[i]
    if l.startswith('# '):
        p = l[2:].split()
        if p[1] == '=>':
            i += 1; continue
        path, ver = p[0], p[1]
        if len(p) >= 4 and p[2] == '=>':
            rp, rv = p[3], (p[4] if len(p) > 4 else '')
            if rp.startswith('.') or rp != path:
                reps.append(f'\t{path} {ver} => {rp} {rv}'.rstrip())
            else:
                ver, l = rv, f'# {path} {rv}'
        reqs.append((path, ver)); out += [l, '## explicit; go 1.13']
        if i + 1 < len(lines) and lines[i + 1].startswith('## '):
            i += 1
        i += 1; continue
    out.append(l); i += 1
open('vendor/modules.txt', 'w').write('\n'.join(out) + '\n')
src = open('go.mod').read()
head = src[:src.index('require (')].replace('go 1.15', 'go 1.17')
body = ''.join(f'\t{p} {v}\n' for p, v in reqs)
open('go.mod', 'w').write(head + 'require (\n' + body + ')\n\nreplace (\n' + '\n'.join(reps) + '\n)\n')
PY
  git init -q .
  export GOFLAGS=-mod=vendor CGO_ENABLED=0
  make generated_files
  go build -tags providerless -o "$bin.tmp" ./cmd/kube-apiserver
  mv "$bin.tmp" "$bin"
} >"$log" 2>&1 || { echo "kube-apiserver build failed; see $log" >&2; exit 1; }
echo "$bin"
