# The manager image: `make docker-build IMG=...`. Without a Docker engine
# or registry access, `make image` builds the same image (user,
# entrypoint, layout) as an OCI layout from Debian's packages.
#
# The base images are build arguments, so the same file builds from a
# local mirror: --build-arg BUILD_IMAGE=... --build-arg RUNTIME_IMAGE=...
ARG BUILD_IMAGE=docker.io/library/rust:1.95-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot
#
# Build stage: a release build of the operator and of its libvirt helper
# (the kvm provider; the only binary linked against libvirt's client
# library), then every shared library either loads is copied out by
# `make runtime-libs`.
FROM ${BUILD_IMAGE} AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends libvirt-dev pkg-config \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The commit `--version` and the startup line report (.git is not in the
# build context); `make docker-build` passes the checkout's.
ARG EPO_COMMIT=unknown
ENV EPO_COMMIT=${EPO_COMMIT}
# The release profile keeps line tables for profiling; the image leaves
# them out (about 95 MB of file a Pod never reads; not loaded at run time).
RUN CARGO_PROFILE_RELEASE_STRIP=debuginfo cargo build --release --locked --bin egress-proxies-operator --bin egress-proxies-libvirt \
 && make runtime-libs BIN=target/release/egress-proxies-operator DEST=/runtime \
 && make runtime-libs BIN=target/release/egress-proxies-libvirt DEST=/runtime

# Runtime: distroless (no shell, no package manager) of the same Debian
# release, plus exactly the libraries above. Runs as 65532 (distroless's
# nonroot) and needs no writable path but /tmp, which the Deployment mounts
# as an emptyDir, so the root filesystem can be read-only.
FROM ${RUNTIME_IMAGE}
COPY --from=build /runtime/ /
COPY --from=build /src/target/release/egress-proxies-operator /usr/local/bin/egress-proxies-operator
# The kvm provider's libvirt helper, started beside the operator for each
# libvirt operation; the operator's own process never loads libvirt.
COPY --from=build /src/target/release/egress-proxies-libvirt /usr/local/bin/egress-proxies-libvirt
# libvirt's client looks under $HOME for its config and cache.
ENV HOME=/tmp
USER 65532:65532
EXPOSE 8090 8443 8081
ENTRYPOINT ["/usr/local/bin/egress-proxies-operator"]
