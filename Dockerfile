# Portcullis host image: Node 24, the host, and the built example policies.
#   docker build -t portcullis .
#   docker run -p 8443:8443 portcullis serve --tls-self-signed
# Build stage: full dev dependencies to compile the example policies (asc, componentize-qjs).
FROM node:24-bookworm-slim AS build
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
RUN node scripts/build-policies.ts --force && npm prune --omit=dev --ignore-scripts

FROM node:24-bookworm-slim
ENV NODE_ENV=production PORTCULLIS_CACHE=/var/cache/portcullis
WORKDIR /app
COPY --from=build /app /app
RUN mkdir -p /var/cache/portcullis && chown node:node /var/cache/portcullis
USER node
EXPOSE 8443
ENTRYPOINT ["node", "host/bin/portcullis.js"]
CMD ["serve"]
