#!/usr/bin/env bash
# Builds the manager image as an OCI image layout without a container
# engine or a registry (`make image`): the same user, entrypoint, layout
# and environment as the Dockerfile's runtime stage, on a base equivalent
# to distroless cc-debian12 assembled from Debian's packages.
#
#   config/image/build-image.sh BIN OUT TAG
#
# BIN: the release binary, with the libvirt helper (egress-proxies-libvirt)
# beside it (their line tables are stripped here, as the Dockerfile's
# build does); OUT: the OCI layout directory written (the
# image is OUT:TAG, e.g. `skopeo copy oci:OUT:TAG docker://…` pushes it);
# TAG: the image tag. Needs umoci, dpkg-deb, apt-get (to download the base
# packages into OUT's work directory), objcopy and ldd.
set -euo pipefail

bin=${1:?usage: build-image.sh BIN OUT TAG}
out=${2:?usage: build-image.sh BIN OUT TAG}
tag=${3:?usage: build-image.sh BIN OUT TAG}
here=$(cd "$(dirname "$0")/../.." && pwd)
for tool in umoci dpkg-deb apt-get objcopy ldd; do
  command -v "$tool" >/dev/null || { echo "build-image.sh: $tool is missing (apt-get install umoci binutils)" >&2; exit 1; }
done

work="$out.work"
rm -rf "$work" "$out"
mkdir -p "$work/debs" "$work/rootfs"
rootfs="$work/rootfs"

# The base, as distroless cc has it: Debian's base files, the network
# service names, time zones and the CA bundle (gcp's and the probes' TLS
# use the bundled roots, but a user's --probe-ca-file or a library may
# look for the system's). The C runtime comes with the binary's libraries.
(cd "$work/debs" && apt-get download -q -o APT::Sandbox::User=root base-files netbase tzdata ca-certificates >/dev/null)
for deb in "$work"/debs/*.deb; do dpkg-deb -x "$deb" "$rootfs"; done
# What ca-certificates' maintainer script would write.
mkdir -p "$rootfs/etc/ssl/certs"
find "$rootfs/usr/share/ca-certificates" -name '*.crt' | sort | xargs cat >"$rootfs/etc/ssl/certs/ca-certificates.crt"
rm -rf "$rootfs/usr/share/doc" "$rootfs/usr/share/man" "$rootfs/usr/share/lintian" \
  "$rootfs/usr/share/info" "$rootfs/usr/share/common-licenses" "$rootfs/usr/share/ca-certificates" \
  "$rootfs/usr/sbin" "$rootfs/usr/bin"
# distroless's users: root, nobody and nonroot (65532), the one it runs as.
cat >"$rootfs/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
EOF
cat >"$rootfs/etc/group" <<'EOF'
root:x:0:
nobody:x:65534:
nonroot:x:65532:
EOF
mkdir -p "$rootfs/tmp" "$rootfs/home/nonroot" "$rootfs/root" "$rootfs/usr/local/bin"
chmod 1777 "$rootfs/tmp"
chown 65532:65532 "$rootfs/home/nonroot"
chmod 0700 "$rootfs/root"

# Every library the binaries load, under the same paths (make
# runtime-libs), and the binaries without their line tables: the operator
# and, beside it, the kvm provider's libvirt helper (the only one that
# loads libvirt's client library).
helper="$(dirname "$bin")/egress-proxies-libvirt"
[ -x "$helper" ] || { echo "build-image.sh: $helper is missing (cargo build --release --bins)" >&2; exit 1; }
for b in "$bin" "$helper"; do
  make -s -C "$here" runtime-libs BIN="$b" DEST="$rootfs"
done
objcopy --strip-debug "$bin" "$rootfs/usr/local/bin/egress-proxies-operator"
objcopy --strip-debug "$helper" "$rootfs/usr/local/bin/egress-proxies-libvirt"

# One layer with the whole root filesystem, then the Dockerfile's config.
umoci init --layout "$out"
umoci new --image "$out:$tag"
umoci unpack --image "$out:$tag" "$work/bundle" >/dev/null
cp -a "$rootfs/." "$work/bundle/rootfs/"
umoci repack --image "$out:$tag" --history.created_by "config/image/build-image.sh" "$work/bundle"
commit=$("$bin" --version | sed -n 's/.*(commit \([^)]*\)).*/\1/p')
umoci config --image "$out:$tag" \
  --os linux --architecture amd64 \
  --config.user 65532:65532 \
  --config.entrypoint /usr/local/bin/egress-proxies-operator \
  --config.env HOME=/tmp \
  --config.env PATH=/usr/local/bin \
  --config.env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
  --config.exposedports 8090/tcp --config.exposedports 8443/tcp --config.exposedports 8081/tcp \
  --config.label org.opencontainers.image.title=egress-proxies-operator \
  --config.label "org.opencontainers.image.version=$tag" \
  --config.label "org.opencontainers.image.revision=${commit:-unknown}" \
  --history.created_by "config/image/build-image.sh (config)"
umoci gc --layout "$out"
unpacked=$(du -sb "$rootfs" | cut -f1)
rm -rf "$work"

packed=$(du -sb "$out/blobs" | cut -f1)
echo "built $out:$tag (commit ${commit:-unknown}): $((unpacked / 1048576)) MiB unpacked, $((packed / 1048576)) MiB compressed" >&2
