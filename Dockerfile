# Build stage: release binary linked against libvirt's client library.
FROM rust:1.95-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends libvirt-dev pkg-config && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY tests/apiserver ./tests/apiserver
RUN cargo build --release --locked --bin egress-proxies-operator

# Runtime: only the libraries the binary links (libvirt0), non-root, works
# with a read-only root filesystem (scratch space only under /tmp).
FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends libvirt0 ca-certificates && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/egress-proxies-operator /usr/local/bin/egress-proxies-operator
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/egress-proxies-operator"]
