# docker build -t twelve-dollar-feed . && docker run -p 3000:3000 twelve-dollar-feed

# Build: the pinned dependencies, then one bundle per entry in dist/. Without the dev dependencies:
# the base image has its Node, so npm does not fetch the pinned one again.
FROM node:26.10.0-trixie-slim AS build
WORKDIR /src
COPY package.json package-lock.json .npmrc ./
RUN npm ci --omit=dev --ignore-scripts --no-audit --no-fund
COPY build.mjs app.ts seed.ts random.ts start.ts schema.sql ./
COPY server/ ./server/
RUN node build.mjs
# mimalloc, Debian's build of it, for the run stage: with it the node:http server held a connection of
# the challenge's load in about a quarter less memory than with glibc's malloc, for the same CPU
# (BENCHMARKS.md, "Memory").
RUN apt-get update && apt-get install -y --no-install-recommends libmimalloc3 \
 && cp "$(dpkg -L libmimalloc3 | grep '/libmimalloc\.so\.3$')" /usr/local/lib/libmimalloc.so.3

# Run: Debian slim with the same Node, pinned by version. Not Alpine: musl's allocator is slower
# under this load. Not distroless: its Node images can be pinned by digest only, not by version.
FROM node:26.10.0-trixie-slim
WORKDIR /app
COPY --from=build /src/dist/ ./dist/
# Litestream, for LITESTREAM_REPLICA_URL (docs/litestream.md): the static binary of the official
# image, for every platform it publishes.
COPY --from=litestream/litestream:0.5.17 /usr/local/bin/litestream /usr/local/bin/litestream
COPY --from=build /usr/local/lib/libmimalloc.so.3 /usr/local/lib/libmimalloc.so.3
ENV LD_PRELOAD=/usr/local/lib/libmimalloc.so.3

# The database and tokens.json live on the volume: seeded on the first start, kept after that.
RUN mkdir /data && chown node:node /data
VOLUME ["/data"]
ENV SQLITE_PATH=/data/feed.db HOST=0.0.0.0 PORT=3000
USER node
EXPOSE 3000

# Node asks /health itself (a slim image has no curl); the start period covers a first-start seed.
HEALTHCHECK --interval=10s --timeout=3s --start-period=90s --retries=3 \
  CMD ["node", "-e", "fetch(`http://127.0.0.1:${process.env.PORT}/health`).then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))"]

# Exec form: node is PID 1 and receives SIGTERM itself, so `docker stop` stops it cleanly.
# --max-semi-space-size=4 (MB): V8's young generation otherwise grows to its 16 MB default under a
# burst of requests and stays there; capped, idle connections on the node:http server cost 10 KB each
# instead of 14 (at 15,000) for the same CPU per request (BENCHMARKS.md, "Memory"). challenge/start.sh
# and npm start use the same flags.
CMD ["node", "--max-semi-space-size=4", "dist/start.js"]
