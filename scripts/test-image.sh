#!/usr/bin/env bash
# npm run test:image: builds the Dockerfile with ../shared/tools/container-image.sh (podman, vfs,
# no registry: the base is the script's local node:24-bookworm-slim stand-in, pinned by its
# local digest), checks its size, smoke-runs it (`serve --tls-self-signed`, GET /readyz), then
# runs it again as uid 1000 on a read-only bind mount of its root filesystem with tmpfs only at
# /tmp and the cache, as the Deployment does. Needs root and ~12 GB of disk; not part of npm test.
#   IMAGE_TAG (localhost/portcullis:test)  MAX_IMAGE_BYTES (250000000)  KEEP_IMAGE=1 keeps it
set -euo pipefail
cd "$(dirname "$0")/.."
tool=${CONTAINER_IMAGE_TOOL:-../shared/tools/container-image.sh}
tag=${IMAGE_TAG:-localhost/portcullis:test}
max=${MAX_IMAGE_BYTES:-250000000}
pm() { podman --storage-driver "${STORAGE_DRIVER:-vfs}" "$@"; }
t0=$SECONDS
bash "$tool" base
base=docker.io/library/node:24-bookworm-slim
digest=$(pm image inspect --format '{{.Digest}}' "$base")
echo "test:image: base $base@$digest (local stand-in)"
bash "$tool" build . "$tag" --build-arg "NODE_IMAGE=$base@$digest" --build-arg "REVISION=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
size=$(pm image inspect --format '{{.Size}}' "$tag")
echo "test:image: $tag is $size bytes ($((size / 1000000)) MB; limit $((max / 1000000)) MB)"
((size <= max)) || { echo "FAIL: image larger than $max bytes" >&2; exit 1; }
user=$(pm image inspect --format '{{.Config.User}}' "$tag")
[[ $user == 1000:1000 ]] || { echo "FAIL: image user is '$user', not 1000:1000" >&2; exit 1; }
bash "$tool" smoke "$tag"

# Read-only root: the image's filesystem bind-mounted read-only, private mounts (unshare), no
# write access anywhere but the two tmpfs. Policies must load (TypeScript ones are transpiled
# into the cache), so the built-in config's readyWhenAllPoliciesLoaded makes /readyz meaningful.
ctr=$(buildah --storage-driver "${STORAGE_DRIVER:-vfs}" from --pull=never --quiet "$tag")
cleanup() { buildah --storage-driver "${STORAGE_DRIVER:-vfs}" rm "$ctr" >/dev/null 2>&1 || true; }
trap cleanup EXIT
rootfs=$(buildah --storage-driver "${STORAGE_DRIVER:-vfs}" mount "$ctr")
port=18600; while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 1)); done
log=$(mktemp)
unshare --mount --propagation private bash -c '
  set -euo pipefail
  r=$(mktemp -d)
  mount --bind "$1" "$r" && mount -o remount,bind,ro "$r"
  mount -t proc proc "$r/proc"; mount --rbind /dev "$r/dev"
  mount -t tmpfs -o mode=1777 tmpfs "$r/tmp"; mount -t tmpfs -o uid=1000,gid=1000,mode=0700 tmpfs "$r/var/cache/portcullis"
  if chroot --userspec=1000:1000 "$r" /usr/local/bin/node -e "require(\"fs\").writeFileSync(\"/app/x\", \"\")" 2>/dev/null; then
    echo "FAIL: /app is writable" >&2; exit 1; fi
  # Not `cd && chroot ... &`: that backgrounds a subshell, and $! (killed below) would be the
  # subshell, leaving the server running after the test (it did).
  cd "$r"
  chroot --userspec=1000:1000 "$r" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin NODE_ENV=production \
    PORTCULLIS_CACHE=/var/cache/portcullis HOME=/tmp sh -c "cd /app && exec node host/bin/portcullis.js serve --tls-self-signed --port $2" >"$3" 2>&1 &
  pid=$!
  code=000
  for _ in $(seq 1 120); do
    code=$(curl -sk -o /dev/null -w "%{http_code}" --max-time 3 "https://127.0.0.1:$2/readyz" || true)
    [[ $code == 200 ]] && break
    kill -0 $pid 2>/dev/null || break
    sleep 1
  done
  kill -TERM $pid 2>/dev/null || true; wait $pid || true
  if pgrep -f "portcullis.js serve --tls-self-signed --port $2\$" >/dev/null; then echo "FAIL: the read-only run did not stop on SIGTERM" >&2; exit 1; fi
  [[ $code == 200 ]] || { echo "FAIL: read-only run: /readyz answered $code" >&2; tail -n 30 "$3" >&2; exit 1; }
  grep -q "\"msg\":\"ready\"" "$3" || { echo "FAIL: no ready line" >&2; exit 1; }
  echo "test:image: read-only root, uid 1000: /readyz 200; $(grep -o "\"msg\":\"ready\"[^}]*" "$3")"
' readonly-run "$rootfs" "$port" "$log"
echo "PASS test:image in $((SECONDS - t0)) s; image $size bytes"
[[ ${KEEP_IMAGE:-0} == 1 ]] || { cleanup; trap - EXIT; pm rmi "$tag" >/dev/null; pm image prune -f >/dev/null; echo "test:image: removed $tag and dangling build layers"; }
