# egress-proxies-operator: the targets users of operator projects expect.
# `make help` lists them.

CARGO ?= cargo
KUBECTL ?= kubectl
# The image `docker-build` builds and `deploy` installs.
IMG ?= example.com/egress-proxies-operator:0.1.0
TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)
BIN := $(TARGET_DIR)/debug/egress-proxies-operator
BENCH_PROFILE ?= --release
# make run and run-local: the providers file; make kvm-ssh-secret: where the Secret goes.
PROVIDERS ?= config/samples/providers-dev.yaml
KVM_SSH_NAMESPACE ?= egress-proxies-operator-system
KVM_SSH_KEY ?= $(HOME)/.ssh/proxy-operator_ed25519
KVM_KNOWN_HOSTS ?= $(HOME)/.ssh/kvm_known_hosts
# make run-local: the cluster's state and the operator's addresses;
# OPERATOR_BIN= a prebuilt operator (else it is built); CLUSTER_BIN= a
# prebuilt test cluster's bin directory (with -o test-cluster).
RUN_LOCAL_DIR ?= $(TARGET_DIR)/run-local
RUN_LOCAL_PROBE_ADDR ?= 127.0.0.1:8081
RUN_LOCAL_DISCOVERY_ADDR ?= 127.0.0.1:8090
RUN_LOCAL_METRICS_ADDR ?= 127.0.0.1:8443
OPERATOR_BIN ?=
# The test cluster: upstream programs built from the Go modules pinned under
# tests/cluster/go, plus our launcher and node agent.
GO ?= go
# make test: how many test binaries run at once.
TEST_JOBS ?= 4
CLUSTER_BIN := $(abspath $(TARGET_DIR))/test-cluster/bin
K8S_VERSION := v1.37.2
K8S_VERSION_VARS := gitVersion=$(K8S_VERSION) gitMajor=1 gitMinor=37 gitTreeState=clean
K8S_LDFLAGS := -s -w $(foreach v,$(K8S_VERSION_VARS),-X k8s.io/component-base/version.$(v) -X k8s.io/client-go/pkg/version.$(v))
K8S_TOOLS := kube-apiserver kube-controller-manager kube-scheduler kubectl
# Each program is rebuilt only when what it is built from changes: the
# pinned module files, the build flags and the Go version, hashed into the
# name of a stamp beside the binaries (the content, not the files' times,
# so a fresh clone sharing CARGO_TARGET_DIR, as .ci/run does, reuses them).
go_stamp = $(CLUSTER_BIN)/.$(1)-$(shell { cat tests/cluster/go/$(1)/go.mod tests/cluster/go/$(1)/go.sum; echo '$(2)'; $(GO) env GOVERSION; } 2>/dev/null | sha256sum | cut -c1-16)
K8S_STAMP := $(call go_stamp,kubernetes,$(K8S_LDFLAGS) $(K8S_TOOLS))
ETCD_STAMP := $(call go_stamp,etcd,-s -w)
HELM_STAMP := $(call go_stamp,helm,-s -w)
JAEGER_STAMP := $(call go_stamp,jaeger,-s -w)

.PHONY: all build test lint fmt crds manifests check-crds openapi test-e2e run run-local \
	check-config test-cluster runtime-libs install uninstall render deploy undeploy image image-push docker-build kvm-ssh-secret help \
	bench-lease bench-lease-memory bench-gateway bench-scale bench-topology bench-idle build-profiling fuzz-api test-faults kvm-guest

all: build

help: ## List the targets.
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

##@ Development

build: ## Build the operator, crdgen and the test cluster's launcher.
	$(CARGO) build --bins --workspace

test: lint check-crds test-cluster crawler-venv image ## Every test tier that runs on this machine (the CI command): lint, CRD drift, the test cluster's build, the image (make image), then every workspace test binary, the doc tests and the API fuzz run side by side (tests/runner: TEST_JOBS at a time, longest first; a table of where the time went at the end).
	tests/with-libvirtd.sh $(CARGO) run --quiet -p test-runner -- --jobs $(TEST_JOBS) \
		--also 'fuzz-api=CARGO="$(CARGO)" tests/fuzz-api.sh' --also 'doctests=$(CARGO) test --workspace --doc' -- --workspace

crawler-venv: ## The crawler clients the gateway's tests run (Scrapy, Playwright's Python package) in a venv under the cargo target dir; the browser is Debian's chromium.
	tests/crawler-venv.sh

lint: ## Formatting and clippy, warnings are errors.
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt: ## Format the code.
	$(CARGO) fmt --all

crds: ## Regenerate crds/*.yaml from the Rust types.
	$(CARGO) run --quiet --bin crdgen -- crds

manifests: crds ## Alias of crds (RBAC is hand-written; tests/e2e_samples.rs checks it against the code).

openapi: ## Regenerate docs/openapi.json, the discovery API's OpenAPI document as served with the default flags.
	$(CARGO) run --quiet --bin crdgen -- --openapi docs/openapi.json

check-crds: crds openapi ## Fail when the committed CRDs or docs/openapi.json differ from the generated ones.
	@git diff --exit-code -- crds/ docs/openapi.json || { echo "crds/ or docs/openapi.json is stale: run 'make crds openapi' and commit"; exit 1; }

test-e2e: test-cluster crawler-venv ## System tests only: the real binary against the real test cluster (real Squid, sshd, libvirtd; see docs/testing.md).
	$(CARGO) test --test e2e --test control_plane --test kvm --test e2e_install --test e2e_helm --test e2e_samples --test faults -- e2e_

test-faults: test-cluster ## The fault suite: the real binary against its own test cluster with faults injected (API server frozen with SIGSTOP or killed and restarted, kill -9 at chosen points on each provider, credentials revoked, watches cut; see docs/testing.md), the discovery abuse run and the secret sentinel run; prints what was injected and measured. `make test` runs them too (every workspace test).
	$(CARGO) test --test faults --test discovery_abuse -- --nocapture
	$(CARGO) test --test control_plane -- secret_sentinel --nocapture

bench-lease: ## Lease acquire+release throughput and p99 at 64 connections vs a bare axum handler (BENCH_SECS=5 per phase; BENCH_PROFILE= for a debug build; BENCH_PROXIES=N for a larger fleet).
	$(CARGO) test $(BENCH_PROFILE) --no-default-features --test bench_lease -- --ignored --nocapture

bench-gateway: ## The gateway's goals beside Squid alone: one large download's throughput, CONNECT setup p99 at 500 new connections/s, RSS with ~10,000 idle tunnels (BENCH_DOWNLOAD_MIB=1024, BENCH_RATE=500, BENCH_SECS=10, BENCH_TUNNELS=9900).
	$(CARGO) test $(BENCH_PROFILE) --no-default-features --test bench_gateway -- --ignored --nocapture --test-threads 1

bench-lease-memory: ## The lease store's memory per live lease and per released lease it remembers, the store alone in its own process (BENCH_PROXIES=10000, BENCH_LEASES=100000).
	$(CARGO) test $(BENCH_PROFILE) --no-default-features --test bench_lease_memory -- --ignored --nocapture

build-profiling: ## The release build with full debug info and frame pointers (cargo profile `profiling`), for `perf record -g` call graphs; the binary is $(TARGET_DIR)/profiling/egress-proxies-operator.
	RUSTFLAGS="$(RUSTFLAGS) -C force-frame-pointers=yes" $(CARGO) build --profile profiling --bin egress-proxies-operator

bench-idle: test-cluster ## Where the operator's idle memory goes: the release binary on the real test API server as bench-scale starts it, its RSS by kind of mapping (heap, thread stacks, the binary, each library) at bench-scale's idle reading and IDLE_SECS (default 30) later.
	$(CARGO) build --release --bin egress-proxies-operator
	IDLE_OPERATOR_BIN=$(abspath $(TARGET_DIR))/release/egress-proxies-operator $(CARGO) test --test control_plane -- idle_memory --ignored --nocapture

# Proxies of make bench-scale; empty: the benchmark's default (1,000, or 50
# with PROVIDER=kubernetes).
N ?=
PROVIDER ?=
bench-scale: test-cluster ## The operator at fleet scale, measured apart from its load: N External Proxies (default N=1000) on a probe-target process of their own; phases of BENCH_PHASE s (30) repeated BENCH_REPEAT times (3): the operator probing, the bare probe loop in its own process, the operator inside the Pod's 500m/128Mi cgroup, lease loads with BENCH_LEASES live leases (closed loop vs the same process's bare route, open loop at BENCH_RATE pairs/s) with probes running and held; PROVIDER=kubernetes: kubernetes-provider Proxies (default 50). Writes the table into docs/performance.md.
	BENCH_N=$(N) PROVIDER=$(PROVIDER) BENCH_WRITE_DOCS=1 $(CARGO) test $(BENCH_PROFILE) --test bench_scale -- --ignored --exact bench_scale --nocapture
	$(if $(PROVIDER),,$(MAKE) bench-topology)

bench-topology: test-cluster ## The shipped topology (part of bench-scale): 2 manager replicas (leader and in-sync follower) and 2 gateway processes, BENCH_TOPOLOGY_N External Proxies (10,000) and BENCH_LEASES held leases (100,000); per-process RSS and CPU, the lease loads at the leader (closed loop vs its bare route, open loop at BENCH_RATE), through the follower, the copies' lag, each process's peak RSS; one-process column beside it. Writes the table into docs/performance.md.
	BENCH_WRITE_DOCS=1 $(CARGO) test $(BENCH_PROFILE) --test bench_topology -- --ignored --exact bench_topology --nocapture

fuzz-api: ## Fuzz the discovery/lease API from its OpenAPI document with schemathesis (bounded, ~2 min).
	CARGO="$(CARGO)" tests/fuzz-api.sh

check-config: ## Validate a providers file: make check-config PROVIDERS=path.yaml
	$(CARGO) build --quiet --bin egress-proxies-operator
	$(BIN) --providers-config $(PROVIDERS) --check-config

run: ## Run the operator against the current kubeconfig (PROVIDERS=config/samples/providers-dev.yaml; ARGS=extra flags). The discovery API and /metrics are on loopback, without a token (plain HTTP).
	$(CARGO) build --quiet --bin egress-proxies-operator
	$(BIN) --providers-config $(PROVIDERS) --health-probe-bind-address 127.0.0.1:8081 \
		--discovery-bind-address 127.0.0.1:8090 --metrics-bind-address 127.0.0.1:8443 --metrics-secure=false \
		--allow-unauthenticated-discovery $(ARGS)

run-local: test-cluster ## The quickstart: the local test cluster (real Kubernetes, Squid Pods as processes; needs root), the operator against it and the kubernetes sample Proxy; prints how to lease it once Ready. No cluster of your own needed (KUBECONFIG=target/run-local/admin.kubeconfig; ARGS=extra flags, @GATEWAY@ in them is the Pods' gateway; OPERATOR_BIN and CLUSTER_BIN= prebuilt ones, with -o test-cluster).
	$(if $(OPERATOR_BIN),,$(CARGO) build --quiet --bin egress-proxies-operator)
	$(CLUSTER_BIN)/test-cluster --dir $(RUN_LOCAL_DIR) --image ubuntu/squid --apply crds --apply config/samples/proxy_kubernetes.yaml -- \
		tests/cluster/run-local.sh $(CLUSTER_BIN)/kubectl $(RUN_LOCAL_DISCOVERY_ADDR) \
		$(or $(OPERATOR_BIN),$(BIN)) --providers-config $(PROVIDERS) --installation-id run-local \
		--health-probe-bind-address $(RUN_LOCAL_PROBE_ADDR) --discovery-bind-address $(RUN_LOCAL_DISCOVERY_ADDR) \
		--metrics-bind-address $(RUN_LOCAL_METRICS_ADDR) --metrics-secure=false --allow-unauthenticated-discovery $(ARGS)

test-cluster: $(K8S_STAMP) $(ETCD_STAMP) $(HELM_STAMP) $(JAEGER_STAMP) ## Build etcd, the Kubernetes control plane, kubectl, helm and Jaeger (the trace backend the tests export spans to) from tests/cluster/go (cold: ~10 min on 2 cores; a no-op while the pinned modules are unchanged, also in a fresh clone that shares CARGO_TARGET_DIR), and our launcher.
	$(CARGO) build -p test-cluster
	@ln -sf ../../debug/test-cluster $(CLUSTER_BIN)/test-cluster

$(K8S_STAMP):
	@mkdir -p $(CLUSTER_BIN) && rm -f $(CLUSTER_BIN)/.kubernetes-*
	cd tests/cluster/go/kubernetes && $(GO) build -trimpath -ldflags '$(K8S_LDFLAGS)' -o $(CLUSTER_BIN)/ $(addprefix k8s.io/kubernetes/cmd/,$(K8S_TOOLS))
	@touch $@

$(ETCD_STAMP):
	@mkdir -p $(CLUSTER_BIN) && rm -f $(CLUSTER_BIN)/.etcd-*
	cd tests/cluster/go/etcd && $(GO) build -trimpath -ldflags '-s -w' -o $(CLUSTER_BIN)/etcd go.etcd.io/etcd/server/v3
	@touch $@

$(HELM_STAMP):
	@mkdir -p $(CLUSTER_BIN) && rm -f $(CLUSTER_BIN)/.helm-*
	cd tests/cluster/go/helm && $(GO) build -trimpath -ldflags '-s -w' -o $(CLUSTER_BIN)/helm helm.sh/helm/v4/cmd/helm
	@touch $@

$(JAEGER_STAMP):
	@mkdir -p $(CLUSTER_BIN) && rm -f $(CLUSTER_BIN)/.jaeger-*
	cd tests/cluster/go/jaeger && $(GO) build -trimpath -ldflags '-s -w' -o $(CLUSTER_BIN)/jaeger github.com/jaegertracing/jaeger/cmd/jaeger
	@touch $@

##@ Deployment

install: ## Install the CRDs into the current cluster.
	$(KUBECTL) apply --server-side -k crds

uninstall: ## Remove the CRDs (and with them every Proxy and ProviderHealth); none installed is fine.
	$(KUBECTL) delete --ignore-not-found -k crds

# config/default with the manager image set to IMG, through a throwaway
# overlay (kubectl's kustomize cannot edit a kustomization). The tag is
# split off after the last "/", so registry ports (host:5000/x) stay; an
# image without a tag is :latest, as docker reads it.
RENDER = ( set -eu; img='$(IMG)'; last=$${img\#\#*/}; name=$$img; tag=; digest=; \
	case $$last in *@*) name=$${img%@*}; digest=$${img\#\#*@};; *:*) name=$${img%:*}; tag=$${img\#\#*:};; *) tag=latest;; esac; \
	mkdir -p $(TARGET_DIR); dir=$$(mktemp -d "$(abspath $(TARGET_DIR))/render.XXXXXX"); trap 'rm -rf "$$dir"' EXIT; \
	{ echo "apiVersion: kustomize.config.k8s.io/v1beta1"; echo "kind: Kustomization"; \
	  echo "resources:"; echo "- $$(realpath --relative-to="$$dir" config/default)"; \
	  echo "images:"; echo "- name: example.com/egress-proxies-operator"; echo "  newName: $$name"; \
	  if [ -n "$$digest" ]; then echo "  digest: $$digest"; elif [ -n "$$tag" ]; then echo "  newTag: \"$$tag\""; fi; \
	} > "$$dir/kustomization.yaml"; $(KUBECTL) kustomize "$$dir" )

render: ## Print config/default with the image set to IMG.
	@$(RENDER)

INSTALLER ?= dist/install.yaml

build-installer: ## Write INSTALLER (dist/install.yaml): config/default with the image set to IMG, one file to apply with kubectl alone (no kustomize, no Helm).
	@mkdir -p $(dir $(INSTALLER)) && $(RENDER) > $(INSTALLER).tmp && mv $(INSTALLER).tmp $(INSTALLER)
	@echo "wrote $(INSTALLER) (image $(IMG)): kubectl apply --server-side -f $(INSTALLER)"

deploy: ## Install the operator (config/default) with image IMG into the current cluster.
	@$(RENDER) | $(KUBECTL) apply --server-side -f -

undeploy: ## Remove what deploy installed, CRDs included; missing objects are fine.
	@$(RENDER) | $(KUBECTL) delete --ignore-not-found -f -

kvm-guest: ## Build (or find cached) the real Linux test guest of the kvm provider from Debian packages; prints the qcow2's path (docs/kvm-provider.md).
	@bash tests/kvm_guest/build-guest.sh target/kvm-guest

runtime-libs: ## Copy every shared library BIN loads (as ldd resolves it, with the loader) into DEST under the same paths: the image's runtime set (make runtime-libs BIN=... DEST=...).
	@set -eu; out=$$(ldd "$(BIN)") || { echo "ldd $(BIN) failed" >&2; exit 1; }; \
	if echo "$$out" | grep -q "not found"; then echo "unresolved libraries:" >&2; echo "$$out" | grep "not found" >&2; exit 1; fi; \
	paths=$$(echo "$$out" | awk '$$2 == "=>" && $$3 ~ /^\// {print $$3} $$1 ~ /^\// {print $$1}' | sort -u); \
	for p in $$paths; do mkdir -p "$(DEST)$$(dirname "$$p")"; cp -L "$$p" "$(DEST)$$p"; done; \
	echo "$$paths" | wc -l | xargs echo "copied libraries:" >&2

# make image: where the OCI image layout goes, and its tag (IMG's).
IMAGE_LAYOUT ?= $(TARGET_DIR)/image/oci
IMAGE_TAG ?= $(lastword $(subst :, ,$(IMG)))
RELEASE_BIN := $(TARGET_DIR)/release/egress-proxies-operator
# make image-push: false for a registry served over plain HTTP.
PUSH_TLS_VERIFY ?= true

image: ## Build the manager image without a Docker engine or registry: the release binaries (the operator and its libvirt helper) and the libraries they load on a distroless-like base made from Debian's packages (config/image/build-image.sh; umoci), as the OCI layout IMAGE_LAYOUT, tag IMAGE_TAG (IMG's tag).
	$(CARGO) build --release --bin egress-proxies-operator --bin egress-proxies-libvirt
	config/image/build-image.sh $(RELEASE_BIN) $(IMAGE_LAYOUT) $(IMAGE_TAG)

image-push: ## Push the image `make image` built to IMG (skopeo; PUSH_TLS_VERIFY=false for a plain-HTTP registry).
	skopeo copy --dest-tls-verify=$(PUSH_TLS_VERIFY) oci:$(IMAGE_LAYOUT):$(IMAGE_TAG) docker://$(IMG)

docker-build: ## Build the image IMG (needs a Docker engine).
	docker build --build-arg EPO_COMMIT=$$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown) -t $(IMG) .

kvm-ssh-secret: ## Create or update the kvm-ssh Secret from KVM_SSH_KEY and KVM_KNOWN_HOSTS in KVM_SSH_NAMESPACE.
	@grep -q 'PRIVATE KEY' "$(KVM_SSH_KEY)" || { echo "$(KVM_SSH_KEY) is not a private key (set KVM_SSH_KEY)"; exit 1; }
	@test -s "$(KVM_KNOWN_HOSTS)" || { echo "$(KVM_KNOWN_HOSTS) is missing or empty (set KVM_KNOWN_HOSTS; ssh-keyscan HOST >> it)"; exit 1; }
	$(KUBECTL) -n $(KVM_SSH_NAMESPACE) create secret generic kvm-ssh \
		--from-file=id_ed25519="$(KVM_SSH_KEY)" --from-file=known_hosts="$(KVM_KNOWN_HOSTS)" \
		--dry-run=client -o yaml | $(KUBECTL) apply -f -
