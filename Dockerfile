# Multi-stage build: compile in the Rust image, run from a small Debian image
# as a non-root user. TLS roots are compiled in (rustls + webpki roots).
# The default target ships only the gateway; `--target mock-upstream` builds an
# image of the fake provider for demos and load tests.
FROM rust:1.95-slim-bookworm AS source
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
# jemalloc's built-in options (background purging) are set here.
COPY .cargo ./.cargo
COPY src ./src
COPY crates ./crates
COPY assets ./assets
COPY pricing ./pricing
COPY prompts ./prompts
COPY config.yaml ./
# Targets Cargo.toml names must exist for the manifest to parse.
COPY tests ./tests

FROM source AS build
# jemalloc (the gateway's allocator) is built from C source: its build runs make.
RUN apt-get update && apt-get install -y --no-install-recommends make \
    && rm -rf /var/lib/apt/lists/*
RUN cargo build --release --locked -p corral --bin corral

FROM source AS build-mock
RUN cargo build --release --locked -p mock-upstream --bin mock-upstream

FROM debian:bookworm-slim AS mock-upstream
RUN useradd --system --uid 10001 --no-create-home mock
COPY --from=build-mock /src/target/release/mock-upstream /usr/local/bin/mock-upstream
USER mock
EXPOSE 9090
ENTRYPOINT ["mock-upstream", "--listen", "0.0.0.0:9090"]

FROM debian:bookworm-slim AS corral
RUN useradd --system --uid 10001 --no-create-home corral
COPY --from=build /src/target/release/corral /usr/local/bin/corral
COPY config.yaml /etc/corral/config.yaml
# The price snapshot compiled into the binary is genai-prices data (MIT): its notice ships with it.
COPY pricing/LICENSE.genai-prices /usr/share/doc/corral/LICENSE.genai-prices
USER corral
ENV CORRAL_LISTEN=0.0.0.0:8080
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD ["corral", "--config", "/etc/corral/config.yaml", "--healthcheck"]
ENTRYPOINT ["corral", "--config", "/etc/corral/config.yaml"]
