# Multi-stage build: compile in the Rust image, run from a small Debian image
# as a non-root user. TLS roots are compiled in (rustls + webpki roots).
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY assets ./assets
COPY config.yaml ./
# Targets Cargo.toml names must exist for the manifest to parse.
COPY tests ./tests
COPY benches ./benches
RUN cargo build --release --locked --bin corral --bin mock-upstream

FROM debian:bookworm-slim
RUN useradd --system --uid 10001 --no-create-home corral
COPY --from=build /src/target/release/corral /usr/local/bin/corral
COPY --from=build /src/target/release/mock-upstream /usr/local/bin/mock-upstream
COPY config.yaml /etc/corral/config.yaml
USER corral
ENV CORRAL_LISTEN=0.0.0.0:8080
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD ["corral", "--config", "/etc/corral/config.yaml", "--healthcheck"]
ENTRYPOINT ["corral", "--config", "/etc/corral/config.yaml"]
