#!/bin/sh
# The command `make run-local` runs inside the test cluster (the launcher
# sets KUBECONFIG and applied the CRDs and the kubernetes sample Proxy):
# the operator, and once the sample is Ready, how to lease it. Ctrl-C (or
# SIGTERM) stops the operator; the launcher then stops the cluster.
# Usage: run-local.sh KUBECTL DISCOVERY_ADDR OPERATOR [ARGS...]
set -eu
kubectl=$1
discovery=$2
shift 2
"$@" &
op=$!
w=
trap 'kill -TERM $op $w 2>/dev/null || true; wait $op; exit 0' TERM INT
"$kubectl" wait --for=condition=Ready --timeout=600s proxy/proxy-kubernetes-sample >/dev/null 2>&1 &
w=$!
if wait $w; then
	ip=$("$kubectl" get proxy proxy-kubernetes-sample -o 'jsonpath={.status.ip}')
	cat <<MSG
The sample Proxy is Ready: a Squid Pod at $ip:3128. In another terminal:
  export KUBECONFIG=$KUBECONFIG
  $(dirname "$kubectl")/kubectl get px
  curl -s -X POST http://$discovery/v1/leases
The lease's proxy.url is the proxy to crawl through (curl -x URL ...); docs/api.md has the rest.
MSG
else
	echo "run-local: the sample Proxy is not Ready after 10 minutes; see kubectl describe px proxy-kubernetes-sample" >&2
fi
wait $op
