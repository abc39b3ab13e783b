#!/usr/bin/env bash
# Builds the kvm test guest from Debian packages only: a Debian kernel, an
# initramfs holding busybox-static, Squid (the host's, from Debian's
# `squid`) with the shared libraries it links, and tests/kvm_guest/init;
# packed with systemd-boot-efi's stub into a unified kernel image at
# EFI/BOOT/BOOTX64.EFI on a FAT disk (no partition table, as the iPXE stand-in
# disk), converted to qcow2: what the kvm provider boots with firmware uefi.
#
# Usage: build-guest.sh OUT_DIR   (prints the path of guest.qcow2)
# The result is cached in OUT_DIR/<key>/ where key hashes the package
# versions and the files of this directory: a second run builds nothing.
# Needs: apt-get (packages are fetched with `apt-get download`), dpkg-deb,
# gzip, objcopy (binutils), mtools, qemu-img, squid installed.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: build-guest.sh OUT_DIR}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"

fail() { echo "build-guest: $*" >&2; exit 1; }
for tool in apt-get apt-cache dpkg-deb dpkg-query gzip objcopy mformat mmd mcopy qemu-img ldd; do
  command -v "$tool" >/dev/null || fail "$tool is not installed"
done
[ -x /usr/sbin/squid ] || fail "squid is not installed (Debian package squid)"

candidate() { apt-cache policy "$1" | awk '/Candidate:/ {print $2}'; }
kpkg="$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')"
[ -n "$kpkg" ] || fail "apt knows no linux-image-amd64 (run apt-get update)"
kver="$(candidate "$kpkg")"
bbver="$(candidate busybox-static)"
sbver="$(candidate systemd-boot-efi)"
sqver="$(dpkg-query -W -f '${Version}' squid)"
[ -n "$kver" ] && [ -n "$bbver" ] && [ -n "$sbver" ] || fail "apt has no candidate for $kpkg, busybox-static or systemd-boot-efi"

key="$( (echo "$kpkg $kver busybox $bbver stub $sbver squid $sqver"; cat "$here"/build-guest.sh "$here"/init "$here"/udhcpc.script "$here"/cloud-config.awk) | sha256sum | cut -c1-16)"
dest="$out/$key"
if [ -f "$dest/guest.qcow2" ]; then
  echo "$dest/guest.qcow2"
  exit 0
fi

work="$(mktemp -d "$out/build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
cd "$work"
# apt-get download writes into the current directory; as root it warns
# that _apt cannot write here, which is harmless.
apt-get download -q "$kpkg=$kver" "busybox-static=$bbver" "systemd-boot-efi=$sbver" >apt.log 2>&1 \
  || { cat apt.log >&2; fail "apt-get download failed"; }
mkdir debs
for d in ./*.deb; do dpkg-deb -x "$d" debs; done

kname="${kpkg#linux-image-}"
moddir="debs/lib/modules/$kname/kernel"
[ -d "$moddir" ] || fail "no modules in $kpkg"

rootfs="$work/rootfs"
mkdir -p "$rootfs"/{bin,sbin,etc/squid/conf.d,proc,sys,dev,run,tmp,var/run,var/spool/squid,lib/modules,usr/sbin,usr/share,seed}
cp debs/bin/busybox "$rootfs/bin/busybox"
cp "$here/init" "$rootfs/init"
cp "$here/udhcpc.script" "$rootfs/etc/udhcpc.script"
cp "$here/cloud-config.awk" "$rootfs/etc/cloud-config.awk"
chmod 0755 "$rootfs/init" "$rootfs/etc/udhcpc.script"

# Modules for the domain's devices (src/provider/kvm/xml.rs): virtio NIC on
# PCI, the seed on a SATA CD-ROM (AHCI, sr, ISO 9660 with Joliet), and
# their dependencies, read from each module's own `depends=` field, in
# load order.
declare -A seen=()
order=()
modfile() { find "$moddir" -name "$1.ko" -o -name "$1.ko.xz" | head -n1; }
add_mod() {
  local m="${1//-/_}" f deps d
  [ -n "${seen[$m]:-}" ] && return 0
  seen[$m]=1
  f="$(modfile "$m")"
  [ -n "$f" ] || fail "module $m is not in $kpkg"
  deps="$(grep -a -o 'depends=[^[:cntrl:]]*' "$f" | head -n1 | cut -d= -f2 | tr ',' ' ')"
  for d in $deps; do add_mod "$d"; done
  order+=("$f")
}
for m in virtio_pci virtio_net ahci sr_mod isofs; do add_mod "$m"; done
: >"$rootfs/etc/modules"
for f in "${order[@]}"; do
  case "$f" in *.xz) xz -dc "$f" >"$rootfs/lib/modules/$(basename "${f%.xz}")";; *) cp "$f" "$rootfs/lib/modules/";; esac
  basename "${f%.xz}" >>"$rootfs/etc/modules"
done

# Squid and what it loads: its libraries (as ldd resolves them on this
# Debian host, the same release the guest's kernel comes from), error
# templates and MIME table.
cp /usr/sbin/squid "$rootfs/usr/sbin/squid"
# Squid refuses to start without unlinkd; basic_ncsa_auth checks the
# credentials of the operator's built-in setup (`cloudInit.builtin`).
mkdir -p "$rootfs/usr/lib/squid"
cp /usr/lib/squid/unlinkd /usr/lib/squid/basic_ncsa_auth "$rootfs/usr/lib/squid/"
ldd /usr/sbin/squid /usr/lib/squid/unlinkd /usr/lib/squid/basic_ncsa_auth | awk '/=> \// {print $3} /^\t\/lib/ {print $1}' | sort -u | while read -r lib; do
  mkdir -p "$rootfs$(dirname "$lib")"
  cp -L "$lib" "$rootfs$lib"
done
mkdir -p "$rootfs/lib64"
cp -L /lib64/ld-linux-x86-64.so.2 "$rootfs/lib64/"
# errors/ is a link into squid-langpack: only its language-neutral
# templates (Squid's fallback) come along.
mkdir -p "$rootfs/usr/share/squid/errors"
cp -a /usr/share/squid/mime.conf /usr/share/squid/icons "$rootfs/usr/share/squid/"
cp -rL /usr/share/squid/errors/templates "$rootfs/usr/share/squid/errors/templates"
[ -f /etc/squid/errorpage.css ] && cp /etc/squid/errorpage.css "$rootfs/etc/squid/"
printf 'root:x:0:0:root:/:/bin/sh\nproxy:x:13:13:proxy:/bin:/bin/false\n' >"$rootfs/etc/passwd"
printf 'root:x:0:\nproxy:x:13:\n' >"$rootfs/etc/group"
printf '127.0.0.1 localhost\n' >"$rootfs/etc/hosts"

# busybox's own cpio packs it (files are root's: this runs as root).
bb="$work/debs/bin/busybox"
(cd "$rootfs" && find . | LC_ALL=C sort | "$bb" cpio -o -H newc 2>/dev/null | gzip -6) >initrd.gz
printf 'ID=epo-test-guest\nNAME="egress-proxies-operator test guest"\nVERSION_ID=%s\n' "$key" >os-release
printf 'console=ttyS0,115200 panic=-1 loglevel=4' >cmdline

# A unified kernel image: systemd's EFI stub with the kernel, initramfs and
# command line as PE sections (the section addresses only need to be
# increasing and not overlap; the kernel is well under 32 MiB).
stub=debs/usr/lib/systemd/boot/efi/linuxx64.efi.stub
objcopy \
  --add-section .osrel=os-release --change-section-vma .osrel=0x20000 \
  --add-section .cmdline=cmdline --change-section-vma .cmdline=0x30000 \
  --add-section .linux="debs/boot/vmlinuz-$kname" --change-section-vma .linux=0x2000000 \
  --add-section .initrd=initrd.gz --change-section-vma .initrd=0x4000000 \
  "$stub" BOOTX64.EFI

# FAT without partition table, sized to the image plus room: 2 heads x 32
# sectors a track, as `mformat` wants a geometry.
size_mib=$(( ($(stat -c %s BOOTX64.EFI) >> 20) + 8 ))
sectors=$(( size_mib * 2048 ))
truncate -s "${size_mib}M" fat.img
mformat -i fat.img -T "$sectors" -h 2 -s 32 -v EPOGUEST ::
mmd -i fat.img ::/EFI ::/EFI/BOOT
mcopy -i fat.img BOOTX64.EFI ::/EFI/BOOT/BOOTX64.EFI
qemu-img convert -q -O qcow2 fat.img guest.qcow2

mkdir -p "$dest"
# The guest's busybox, beside the image: the tests run cloud-config.awk
# with the awk the guest runs it with.
cp "$bb" "$dest/busybox"
mv guest.qcow2 "$dest/guest.qcow2.tmp"
printf '%s %s\nbusybox-static %s\nsystemd-boot-efi %s\nsquid %s\ninitrd %s bytes\nuki %s bytes\n' \
  "$kpkg" "$kver" "$bbver" "$sbver" "$sqver" "$(stat -c %s initrd.gz)" "$(stat -c %s BOOTX64.EFI)" >"$dest/versions"
mv "$dest/guest.qcow2.tmp" "$dest/guest.qcow2"
# Builds of other versions are superseded.
find "$out" -mindepth 1 -maxdepth 1 -type d ! -name "$key" ! -name 'build.*' -exec rm -rf {} +
echo "$dest/guest.qcow2"
