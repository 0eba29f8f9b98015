#!/usr/bin/env bash
# What the test suites need from outside npm: Debian's docker-registry (the CNCF distribution
# registry) for the OCI tests, and etcd + kubectl + a kube-apiserver for the end-to-end tests
# (the apiserver is built once from Debian's source package by scripts/kube-apiserver.sh).
set -euo pipefail
missing=()
command -v docker-registry >/dev/null || missing+=(docker-registry)
command -v etcd >/dev/null || missing+=(etcd-server)
command -v kubectl >/dev/null || missing+=(kubernetes-client)
command -v htpasswd >/dev/null || missing+=(apache2-utils)
command -v ip >/dev/null || missing+=(iproute2)   # the deploy e2e runs its "pods" in a network namespace
if ((${#missing[@]})); then
  if [[ $(id -u) != 0 ]]; then
    echo "test-deps: missing ${missing[*]}; install them (apt-get install ${missing[*]}) or run as root" >&2
    exit 1
  fi
  echo "test-deps: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi
here=$(cd "$(dirname "$0")/.." && pwd)
if [[ ! -x $here/../shared/tools/local-apiserver.sh ]]; then
  echo "test-deps: ../shared/tools/local-apiserver.sh not found; the end-to-end tests need ../shared/tools beside the checkout" >&2
  exit 1
fi
# Our own copy of the apiserver recipe (the same reflect2 fix as the shared one): ~10 min once, then cached.
"$here/scripts/kube-apiserver.sh" >/dev/null
