#!/usr/bin/env bash
# make run-local: the operator against a local test API server on loopback
# whose kubelet runs each Pod with SQUID_CONF as a real squid process, so the
# kubernetes provider works end to end without a cluster. Needs squid
# (apt install squid) for Proxies to become Ready; kubectl to talk to it.
#
#   make run-local                    # in one terminal
#   export KUBECONFIG=target/run-local/kubeconfig
#   kubectl apply -f config/samples/proxy_kubernetes.yaml
#   kubectl get px -w
#
# Extra arguments go to the operator. Ctrl-C stops both.
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO=${CARGO:-cargo}
TARGET=${CARGO_TARGET_DIR:-target}
PROVIDERS=${PROVIDERS:-hack/providers-dev.yaml}
STATE=${RUN_LOCAL_DIR:-target/run-local}
API_PORT=${RUN_LOCAL_API_PORT:-6443}
PROBE_ADDR=${RUN_LOCAL_PROBE_ADDR:-127.0.0.1:8081}
DISCOVERY_ADDR=${RUN_LOCAL_DISCOVERY_ADDR:-127.0.0.1:8090}
METRICS_ADDR=${RUN_LOCAL_METRICS_ADDR:-127.0.0.1:8443}

# Prebuilt binaries may be passed in (the test of this script does).
OPERATOR_BIN=${OPERATOR_BIN:-}
APISERVER_BIN=${APISERVER_BIN:-}
if [ -z "$OPERATOR_BIN" ]; then
  $CARGO build --quiet --bin egress-proxies-operator
  OPERATOR_BIN=$TARGET/debug/egress-proxies-operator
fi
if [ -z "$APISERVER_BIN" ]; then
  $CARGO build --quiet -p test-apiserver
  APISERVER_BIN=$TARGET/debug/test-apiserver
fi
mkdir -p "$STATE"
rm -f "$STATE/kubeconfig"

"$APISERVER_BIN" --listen "127.0.0.1:$API_PORT" --kubelet \
  --crds config/crd/bases --kubeconfig-out "$STATE/kubeconfig" >"$STATE/apiserver.out" 2>"$STATE/apiserver.log" &
api=$!
op=
stop() {
  [ -n "$op" ] && kill "$op" 2>/dev/null && wait "$op" 2>/dev/null
  kill "$api" 2>/dev/null || true
  wait "$api" 2>/dev/null || true
}
trap stop EXIT
trap 'exit 130' INT TERM
for _ in $(seq 1 100); do
  grep -q ready "$STATE/apiserver.out" 2>/dev/null && break
  kill -0 "$api" 2>/dev/null || { cat "$STATE/apiserver.log" >&2; exit 1; }
  sleep 0.1
done
echo "test API server on http://127.0.0.1:$API_PORT; export KUBECONFIG=$STATE/kubeconfig" >&2
echo "discovery API on http://$DISCOVERY_ADDR, metrics on http://$METRICS_ADDR/metrics" >&2

# The operator runs in the background so the traps above can stop it and
# the API server together.
KUBECONFIG="$STATE/kubeconfig" "$OPERATOR_BIN" \
  --providers-config "$PROVIDERS" --health-probe-bind-address "$PROBE_ADDR" \
  --discovery-bind-address "$DISCOVERY_ADDR" --metrics-bind-address "$METRICS_ADDR" \
  --installation-id run-local "$@" &
op=$!
wait "$op"
