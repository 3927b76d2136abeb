# syntax=docker/dockerfile:1
# Build: multi-stage, release binary; run: slim Debian, non-root.

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY migrations ./migrations
# The chat page is compiled into the binary.
COPY static ./static
COPY openapi.yaml ./openapi.yaml
RUN cargo build --release --locked --bin agent-harness

FROM debian:bookworm-slim AS runtime
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /data --shell /usr/sbin/nologin harness \
    && mkdir -p /data \
    && chown harness:harness /data
COPY --from=build /src/target/release/agent-harness /usr/local/bin/agent-harness
USER harness
WORKDIR /data
ENV HARNESS_LISTEN=0.0.0.0:8080 \
    DATABASE_URL=sqlite:///data/agent-harness.db \
    HARNESS_LOG_FORMAT=json
VOLUME ["/data"]
EXPOSE 8080
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/agent-harness"]
CMD ["serve"]
