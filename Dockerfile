# syntax=docker/dockerfile:1
# Build: multi-stage, release binary; run: slim Debian, a numeric non-root user.

FROM rust:1.95-bookworm AS build
WORKDIR /src
# The dependencies first, in a layer of their own: rebuilt only when a
# manifest or Cargo.lock changes, not on every change of the sources.
COPY Cargo.toml Cargo.lock ./
COPY crates/base/Cargo.toml crates/base/Cargo.toml
COPY crates/store/Cargo.toml crates/store/build.rs crates/store/
COPY crates/core/Cargo.toml crates/core/Cargo.toml
COPY crates/protocols/Cargo.toml crates/protocols/Cargo.toml
# The workspace names the bench; only its manifest is needed to build the
# service.
COPY bench/Cargo.toml bench/Cargo.toml
RUN for dir in src bench/src crates/base/src crates/store/src crates/core/src crates/protocols/src; do \
        mkdir -p "$dir" && touch "$dir/lib.rs"; \
    done \
    && echo 'fn main() {}' > src/main.rs \
    && echo 'fn main() {}' > bench/src/main.rs \
    && cargo build --release --locked --bin agent-harness \
    && rm -rf src crates/*/src target/release/agent-harness* \
        target/release/deps/agent_harness-* target/release/deps/libagent_harness-* \
        target/release/deps/harness_* target/release/deps/libharness_* \
        target/release/.fingerprint/agent-harness-* target/release/.fingerprint/harness-*
COPY src ./src
COPY crates ./crates
COPY migrations ./migrations
# The chat page is compiled into the binary.
COPY static ./static
COPY openapi.yaml ./openapi.yaml
RUN cargo build --release --locked --bin agent-harness

FROM debian:bookworm-slim AS runtime
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 harness \
    && useradd --system --uid 10001 --gid 10001 --home-dir /data --shell /usr/sbin/nologin harness \
    && mkdir -p /data \
    && chown 10001:10001 /data
COPY --from=build /src/target/release/agent-harness /usr/local/bin/agent-harness
# Numeric, so that a cluster's "run as non-root" check can verify it.
USER 10001:10001
WORKDIR /data
ENV HARNESS_LISTEN=0.0.0.0:8080 \
    DATABASE_URL=sqlite:///data/agent-harness.db \
    HARNESS_LOG_FORMAT=json
VOLUME ["/data"]
EXPOSE 8080
# The binary asks itself (`GET /readyz` on its own port): the image has no curl.
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
    CMD ["/usr/local/bin/agent-harness", "health"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/agent-harness"]
CMD ["serve"]
