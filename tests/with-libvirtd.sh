#!/usr/bin/env bash
# Runs a command with a libvirtd answering on qemu:///system. Test
# binaries run side by side (tests/runner), and several use libvirt (kvm,
# faults, kvm_memory): the kvm harness starts its own libvirtd only when
# none answers and stops it when it ends, which is safe one process at a
# time only. So when none answers, this starts virtlogd and libvirtd for
# the whole run and stops them at the end. Without libvirt installed the
# command runs as it is (the kvm tests then fail naming what is missing).
set -euo pipefail
answers() { virsh -c qemu:///system -q version >/dev/null 2>&1; }
if ! command -v virsh >/dev/null || [ ! -x /usr/sbin/libvirtd ] || answers; then
  exec "$@"
fi
dir=$(mktemp -d /tmp/epo-libvirtd.XXXXXX)
pids=()
stop() {
  # The pids were read at start: each daemon removes its pid file as it
  # exits.
  [ ${#pids[@]} -gt 0 ] && kill "${pids[@]}" 2>/dev/null
  for _ in $(seq 1 50); do
    alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.2
  done
  rm -rf "$dir"
}
trap stop EXIT
/usr/sbin/virtlogd -d -p "$dir/virtlogd.pid"
/usr/sbin/libvirtd -d -p "$dir/libvirtd.pid"
for _ in $(seq 1 75); do answers && break; sleep 0.2; done
for p in libvirtd virtlogd; do
  [ -s "$dir/$p.pid" ] && pids+=("$(cat "$dir/$p.pid")")
done
answers || { echo "with-libvirtd: libvirtd did not answer within 15 s" >&2; exit 1; }
"$@"
