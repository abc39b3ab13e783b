#!/usr/bin/env bash
# make run-local: the operator against a real Kubernetes cluster on this
# machine (the test cluster: etcd, kube-apiserver, controller-manager and
# scheduler on loopback, plus a node agent that runs each Pod as real
# processes, Squid Pods with Debian's squid), no cluster of your own needed.
# Needs root (Pods get network namespaces on a host-only bridge), squid
# (apt install squid), and the cluster binaries (make test-cluster; the first
# build takes about 7 minutes on 2 cores).
#
#   make run-local                    # in one terminal
#   export KUBECONFIG=target/run-local/kubeconfig
#   kubectl apply -f config/samples/proxy_kubernetes.yaml
#   kubectl get px -w
#
# Extra arguments go to the operator; @GATEWAY@ in them becomes the Pods'
# gateway address on the bridge, where a server on this host is reachable
# from Squid Pods (e.g. --default-probe-url http://@GATEWAY@:8000/).
# Ctrl-C stops both.
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO=${CARGO:-cargo}
TARGET=${CARGO_TARGET_DIR:-target}
CLUSTER_BIN=${TEST_CLUSTER_BIN:-$TARGET/test-cluster/bin}
PROVIDERS=${PROVIDERS:-hack/providers-dev.yaml}
STATE=${RUN_LOCAL_DIR:-target/run-local}
PROBE_ADDR=${RUN_LOCAL_PROBE_ADDR:-127.0.0.1:8081}
DISCOVERY_ADDR=${RUN_LOCAL_DISCOVERY_ADDR:-127.0.0.1:8090}
METRICS_ADDR=${RUN_LOCAL_METRICS_ADDR:-127.0.0.1:8443}

# A prebuilt operator may be passed in (the test of this script does).
OPERATOR_BIN=${OPERATOR_BIN:-}
if [ -z "$OPERATOR_BIN" ]; then
  $CARGO build --quiet --bin egress-proxies-operator
  OPERATOR_BIN=$TARGET/debug/egress-proxies-operator
fi
[ -x "$CLUSTER_BIN/test-cluster" ] || { echo "$CLUSTER_BIN/test-cluster is missing: run make test-cluster" >&2; exit 1; }
mkdir -p "$STATE"
rm -rf "$STATE/cluster" "$STATE/kubeconfig"

"$CLUSTER_BIN/test-cluster" --dir "$STATE/cluster" --image ubuntu/squid \
  >"$STATE/cluster.out" 2>"$STATE/cluster.log" &
cluster=$!
op=
stop() {
  [ -n "$op" ] && kill "$op" 2>/dev/null && wait "$op" 2>/dev/null
  kill "$cluster" 2>/dev/null || true
  wait "$cluster" 2>/dev/null || true
}
trap stop EXIT
trap 'exit 130' INT TERM
for _ in $(seq 1 1200); do
  grep -q ready "$STATE/cluster.out" 2>/dev/null && break
  kill -0 "$cluster" 2>/dev/null || { cat "$STATE/cluster.log" >&2; exit 1; }
  sleep 0.1
done
grep -q ready "$STATE/cluster.out" || { echo "the test cluster did not start in 120 s" >&2; cat "$STATE/cluster.log" >&2; exit 1; }
cp "$STATE/cluster/admin.kubeconfig" "$STATE/kubeconfig"
export KUBECONFIG="$STATE/kubeconfig"
"$CLUSTER_BIN/kubectl" apply --server-side -f config/crd/bases >/dev/null
"$CLUSTER_BIN/kubectl" wait --for=condition=Established --timeout=60s \
  crd/proxies.crawl.example.com crd/providerhealths.crawl.example.com >/dev/null
gateway=$(sed -n 's/.*"gateway": *"\([0-9.]*\)".*/\1/p' "$STATE/cluster/cluster.json")
echo "Kubernetes $(sed -n 's/.*"version": *"\([^"]*\)".*/\1/p' "$STATE/cluster/cluster.json") on $(sed -n 's/.*"server": *"\([^"]*\)".*/\1/p' "$STATE/cluster/cluster.json"); export KUBECONFIG=$STATE/kubeconfig" >&2
echo "Pods' gateway $gateway; discovery API on http://$DISCOVERY_ADDR, metrics on http://$METRICS_ADDR/metrics" >&2

args=()
for a in "$@"; do args+=("${a//@GATEWAY@/$gateway}"); done
# The operator runs in the background so the traps above can stop it and
# the cluster together.
"$OPERATOR_BIN" \
  --providers-config "$PROVIDERS" --health-probe-bind-address "$PROBE_ADDR" \
  --discovery-bind-address "$DISCOVERY_ADDR" --metrics-bind-address "$METRICS_ADDR" \
  --installation-id run-local "${args[@]}" &
op=$!
wait "$op"
