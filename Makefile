# egress-proxies-operator: the targets users of operator projects expect.
# `make help` lists them.

CARGO ?= cargo
KUBECTL ?= kubectl
# The image `docker-build` builds and `deploy` installs.
IMG ?= example.com/egress-proxies-operator:v0.0.1
TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)
BIN := $(TARGET_DIR)/debug/egress-proxies-operator
BENCH_PROFILE ?= --release
# make run: the providers file; make kvm-ssh-secret: where the Secret goes.
PROVIDERS ?= hack/providers-dev.yaml
KVM_SSH_NAMESPACE ?= egress-proxies-operator-system
KVM_SSH_KEY ?= $(HOME)/.ssh/proxy-operator_ed25519
KVM_KNOWN_HOSTS ?= $(HOME)/.ssh/kvm_known_hosts
# The test cluster: upstream programs built from the Go modules pinned under
# tests/cluster/go, plus our launcher and node agent.
GO ?= go
CLUSTER_BIN := $(abspath $(TARGET_DIR))/test-cluster/bin
K8S_VERSION := v1.37.2
K8S_VERSION_VARS := gitVersion=$(K8S_VERSION) gitMajor=1 gitMinor=37 gitTreeState=clean
K8S_LDFLAGS := -s -w $(foreach v,$(K8S_VERSION_VARS),-X k8s.io/component-base/version.$(v) -X k8s.io/client-go/pkg/version.$(v))
K8S_TOOLS := kube-apiserver kube-controller-manager kube-scheduler kubectl

.PHONY: all build test lint fmt crds manifests check-crds test-e2e run run-local \
	check-config test-cluster install uninstall render deploy undeploy docker-build kvm-ssh-secret help \
	bench-lease fuzz-api

all: build

help: ## List the targets.
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

##@ Development

build: ## Build the operator, crdgen and the test cluster's launcher.
	$(CARGO) build --bins --workspace

test: lint check-crds test-cluster fuzz-api ## Every test tier that runs on this machine (the CI command): lint, CRD drift, the test cluster's build, the API fuzz run, then every workspace test.
	$(CARGO) test --workspace --no-fail-fast

lint: ## Formatting and clippy, warnings are errors.
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt: ## Format the code.
	$(CARGO) fmt --all

crds: ## Regenerate config/crd/bases/*.yaml from the Rust types.
	$(CARGO) run --quiet --bin crdgen -- config/crd/bases

manifests: crds ## Alias of crds (RBAC is hand-written; tests/e2e_samples.rs checks it against the code).

check-crds: crds ## Fail when the committed CRDs differ from the generated ones.
	@git diff --exit-code -- config/crd/bases/ || { echo "config/crd/bases/ is stale: run 'make crds' and commit"; exit 1; }

test-e2e: test-cluster ## System tests only: the real binary against the real test cluster (real Squid, sshd, libvirtd; see docs/testing.md).
	$(CARGO) test --test 'e2e_*'

bench-lease: ## Lease acquire+release throughput and p99 at 64 connections vs a bare axum handler (BENCH_SECS=5 per phase; BENCH_PROFILE= for a debug build; BENCH_PROXIES=N for a larger fleet).
	$(CARGO) test $(BENCH_PROFILE) --no-default-features --test bench_lease -- --ignored --nocapture

fuzz-api: ## Fuzz the discovery/lease API from its OpenAPI document with schemathesis (bounded, ~2 min).
	CARGO="$(CARGO)" scripts/fuzz-api.sh

check-config: ## Validate a providers file: make check-config PROVIDERS=path.yaml
	$(CARGO) build --quiet --bin egress-proxies-operator
	$(BIN) --providers-config $(PROVIDERS) --check-config

run: ## Run the operator against the current kubeconfig (PROVIDERS=hack/providers-dev.yaml; ARGS=extra flags).
	$(CARGO) build --quiet --bin egress-proxies-operator
	$(BIN) --providers-config $(PROVIDERS) --health-probe-bind-address 127.0.0.1:8081 \
		--discovery-bind-address 127.0.0.1:8090 --metrics-bind-address 127.0.0.1:8443 $(ARGS)

run-local: test-cluster ## Run the operator against the local test cluster (real Kubernetes, Squid Pods as processes; needs root): no cluster of your own needed (kubeconfig in target/run-local/kubeconfig).
	CARGO="$(CARGO)" PROVIDERS="$(PROVIDERS)" scripts/run-local.sh $(ARGS)

test-cluster: $(CLUSTER_BIN)/.kubernetes $(CLUSTER_BIN)/etcd $(CLUSTER_BIN)/helm ## Build etcd, the Kubernetes control plane, kubectl and helm from tests/cluster/go (cold: ~7 min on 2 cores; a no-op when up to date), and our launcher.
	$(CARGO) build -p test-cluster
	@ln -sf ../../debug/test-cluster $(CLUSTER_BIN)/test-cluster

$(CLUSTER_BIN)/.kubernetes: tests/cluster/go/kubernetes/go.mod tests/cluster/go/kubernetes/go.sum
	@mkdir -p $(CLUSTER_BIN)
	cd tests/cluster/go/kubernetes && $(GO) build -trimpath -ldflags '$(K8S_LDFLAGS)' -o $(CLUSTER_BIN)/ $(addprefix k8s.io/kubernetes/cmd/,$(K8S_TOOLS))
	@touch $@

$(CLUSTER_BIN)/etcd: tests/cluster/go/etcd/go.mod tests/cluster/go/etcd/go.sum
	@mkdir -p $(CLUSTER_BIN)
	cd tests/cluster/go/etcd && $(GO) build -trimpath -ldflags '-s -w' -o $@ go.etcd.io/etcd/server/v3

$(CLUSTER_BIN)/helm: tests/cluster/go/helm/go.mod tests/cluster/go/helm/go.sum
	@mkdir -p $(CLUSTER_BIN)
	cd tests/cluster/go/helm && $(GO) build -trimpath -ldflags '-s -w' -o $@ helm.sh/helm/v4/cmd/helm

##@ Deployment

install: ## Install the CRDs into the current cluster.
	$(KUBECTL) apply --server-side -k config/crd

uninstall: ## Remove the CRDs (and with them every Proxy and ProviderHealth); none installed is fine.
	$(KUBECTL) delete --ignore-not-found -k config/crd

render: ## Print config/default with the image set to IMG.
	@scripts/render.sh "$(IMG)"

deploy: ## Install the operator (config/default) with image IMG into the current cluster.
	scripts/render.sh "$(IMG)" | $(KUBECTL) apply --server-side -f -

undeploy: ## Remove what deploy installed, CRDs included; missing objects are fine.
	scripts/render.sh "$(IMG)" | $(KUBECTL) delete --ignore-not-found -f -

docker-build: ## Build the image IMG (needs a Docker engine).
	docker build -t $(IMG) .

kvm-ssh-secret: ## Create or update the kvm-ssh Secret from KVM_SSH_KEY and KVM_KNOWN_HOSTS in KVM_SSH_NAMESPACE.
	@grep -q 'PRIVATE KEY' "$(KVM_SSH_KEY)" || { echo "$(KVM_SSH_KEY) is not a private key (set KVM_SSH_KEY)"; exit 1; }
	@test -s "$(KVM_KNOWN_HOSTS)" || { echo "$(KVM_KNOWN_HOSTS) is missing or empty (set KVM_KNOWN_HOSTS; ssh-keyscan HOST >> it)"; exit 1; }
	$(KUBECTL) -n $(KVM_SSH_NAMESPACE) create secret generic kvm-ssh \
		--from-file=id_ed25519="$(KVM_SSH_KEY)" --from-file=known_hosts="$(KVM_KNOWN_HOSTS)" \
		--dry-run=client -o yaml | $(KUBECTL) apply -f -
