# Portcullis host image: Node 24, the host, its production dependencies and the built example
# policies, on a flattened Debian + Node base without npm, headers or docs. Runs as uid 1000 and
# writes only to $PORTCULLIS_CACHE (mount an emptyDir there; the root filesystem can be read-only).
#   npm run test:image                    # build + smoke-run with ../shared/tools/container-image.sh
#   podman build -t localhost/portcullis:0.1.0 .    # anywhere with registry access (deploy/ names this tag)
# The base is pinned by digest. NODE_IMAGE overrides it, e.g. for a local stand-in base:
#   --build-arg NODE_IMAGE=node:24-bookworm-slim@sha256:<digest from `podman images --digests`>
ARG NODE_IMAGE=docker.io/library/node:24-bookworm-slim@sha256:6f7b03f7c2c8e2e784dcf9295400527b9b1270fd37b7e9a7285cf83b6951452d

# Build: full dev dependencies to compile the example policies (asc, componentize-qjs).
FROM ${NODE_IMAGE} AS build
WORKDIR /app
COPY package.json package-lock.json ./
COPY host/package.json host/
COPY sdk/package.json sdk/
# The node@24 dev dependency is not needed here (the base image is Node 24): skip its script.
RUN npm ci --ignore-scripts --no-audit --no-fund
COPY wit wit
COPY sdk sdk
COPY host host
COPY policies policies
COPY scripts scripts
COPY tsconfig.json ./
RUN node scripts/build-policies.ts --force && node scripts/pack.ts --host-js

# Production dependencies only, minus jco's compiler toolchain and what only it needed.
FROM ${NODE_IMAGE} AS deps
WORKDIR /app
COPY package.json package-lock.json ./
COPY host/package.json host/
COPY sdk/package.json sdk/
COPY scripts/image-prune.ts scripts/
RUN npm ci --omit=dev --ignore-scripts --no-audit --no-fund && node scripts/image-prune.ts .

# The base without what a server never uses: npm and Node's headers, docs, perl, apt and the
# TLS/crypto libraries only apt needs (Node carries its own OpenSSL), glibc's iconv modules.
# The image can no longer install packages; /var/lib/dpkg stays for vulnerability scanners.
# Copied whole into a scratch image below: files deleted in a later layer would still ship.
FROM ${NODE_IMAGE} AS rootfs
RUN rm -rf /usr/local/include /usr/local/lib/node_modules /usr/local/bin/npm /usr/local/bin/npx /usr/local/bin/corepack \
      /usr/local/share/doc /usr/local/share/man /usr/share/doc /usr/share/man /usr/share/info /usr/share/perl* \
      /usr/bin/perl* /usr/lib/*-linux-gnu/perl* /usr/lib/*-linux-gnu/gconv \
      /usr/bin/apt* /usr/lib/apt /usr/lib/*-linux-gnu/libapt-* /etc/apt /var/lib/apt /var/cache/* /var/log/* /usr/bin/gpgv \
      /usr/bin/openssl /usr/lib/*-linux-gnu/libcrypto.so* /usr/lib/*-linux-gnu/libssl.so* /usr/lib/*-linux-gnu/ossl-modules \
      /usr/lib/*-linux-gnu/engines-3 /usr/lib/*-linux-gnu/libgnutls* /usr/lib/*-linux-gnu/libgcrypt* \
      /usr/lib/*-linux-gnu/libp11-kit* /usr/lib/*-linux-gnu/libdb-5* /usr/lib/*-linux-gnu/libunistring* \
  && node -e 'require("node:crypto").createHash("sha256")' \
  && mkdir -p /var/cache/portcullis && chown 1000:1000 /var/cache/portcullis && chmod 0700 /var/cache/portcullis

FROM scratch
ARG NODE_IMAGE
ARG VERSION=0.1.0
ARG REVISION=unknown
COPY --from=rootfs / /
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin NODE_ENV=production \
    PORTCULLIS_CACHE=/var/cache/portcullis PORTCULLIS_VERSION=${VERSION} PORTCULLIS_REVISION=${REVISION} \
    MALLOC_TRIM_THRESHOLD_=1048576
WORKDIR /app
COPY --from=deps /app/node_modules node_modules
COPY package.json ./
COPY sdk/package.json sdk/
COPY host/package.json host/config.schema.json host/
# The host compiled to JavaScript, as in its npm package: Node 24 could run the TypeScript
# sources, but stripping their types again in the main thread and in every sandbox worker cost
# ~0.4 s of each first start (10 policies: 1.53 -> 1.13 s ready, no compile cache yet).
COPY --from=build /app/.pack/stage/host/bin host/bin
COPY --from=build /app/.pack/stage/host/src host/src
COPY --from=build /app/policies/portcullis.yaml policies/
COPY --from=build /app/policies/added-by/added-by.wasm policies/added-by/
COPY --from=build /app/policies/no-delete/no-delete.wasm policies/no-delete/
COPY --from=build /app/policies/numbers/numbers.wasm policies/numbers/
COPY --from=build /app/policies/require-labels/require-labels.wasm policies/require-labels/
COPY --from=build /app/policies/resources-oversell/resources-oversell.wasm policies/resources-oversell/
COPY --from=build /app/policies/show-auth/show-auth.wasm policies/show-auth/
# The context-aware examples (policies/context.yaml, with deploy-overlays/context's RBAC): not
# served by default, as they need to read the cluster (newcomer: the comment offered them in-cluster).
COPY --from=build /app/policies/context.yaml policies/
COPY --from=build /app/policies/unique-ingress-host/unique-ingress-host.wasm policies/unique-ingress-host/
COPY --from=build /app/policies/namespace-owner/namespace-owner.wasm policies/namespace-owner/
LABEL org.opencontainers.image.title="portcullis" \
      org.opencontainers.image.description="Sandboxed WebAssembly policy runtime for Kubernetes admission control" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.base.name="${NODE_IMAGE}"
USER 1000:1000
EXPOSE 8443 9090
ENTRYPOINT ["node", "host/bin/portcullis.js"]
CMD ["serve"]
