#!/usr/bin/env bash
# Copies every shared library BINARY loads (as ldd resolves them, with the
# dynamic loader) into DEST under the same paths, so the image's runtime
# stage carries exactly what the binary links: libvirt's client library and
# its dependencies, nothing else. Used by the Dockerfile; tests/image.rs
# runs the binary against nothing but the copied set.
set -euo pipefail
bin=${1:?usage: runtime-libs.sh BINARY DEST}
dest=${2:?usage: runtime-libs.sh BINARY DEST}
mkdir -p "$dest"
out=$(ldd "$bin") || { echo "ldd $bin failed" >&2; exit 1; }
if grep -q "not found" <<<"$out"; then
  echo "unresolved libraries:" >&2; grep "not found" <<<"$out" >&2; exit 1
fi
# "libx.so.1 => /path (addr)" and the loader's "/lib64/ld-linux... (addr)".
paths=$(awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' <<<"$out" | sort -u)
for p in $paths; do
  mkdir -p "$dest$(dirname "$p")"
  # -L: the file itself, under the name the binary asks for.
  cp -L "$p" "$dest$p"
done
echo "$paths" | wc -l | xargs echo "copied libraries:" >&2
