# egress-proxies-operator: the targets users of operator projects expect.

CARGO ?= cargo
IMG ?= egress-proxies-operator:dev
BIN := target/debug/egress-proxies-operator
BENCH_PROFILE ?= --release

.PHONY: all build test lint fmt crds manifests check-crds test-apiserver test-e2e run check-config docker-build help bench-lease fuzz-api

all: build

help: ## List the targets.
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

build: ## Build the operator and crdgen.
	$(CARGO) build --bins

test: lint check-crds fuzz-api ## Every test tier that runs on this machine (the CI command): lint, CRD drift, the API fuzz run, then every workspace test.
	$(CARGO) test --workspace --no-fail-fast

lint: ## Formatting and clippy, warnings are errors.
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt: ## Format the code.
	$(CARGO) fmt --all

crds: ## Regenerate config/crd/bases/*.yaml from the Rust types.
	$(CARGO) run --quiet --bin crdgen -- config/crd/bases

manifests: crds ## Alias of crds.

check-crds: crds ## Fail when the committed CRDs differ from the generated ones.
	@git diff --exit-code -- config/crd/bases/ || { echo "config/crd/bases/ is stale: run 'make crds' and commit"; exit 1; }

test-e2e: ## System tests: the real binary against the test API server (and real Squid).
	$(CARGO) test --test 'e2e_*'

bench-lease: ## Lease acquire+release throughput and p99 at 64 connections vs a bare axum handler (BENCH_SECS=5 per phase; BENCH_PROFILE= for a debug build; BENCH_PROXIES=N for a larger fleet).
	$(CARGO) test $(BENCH_PROFILE) --no-default-features --test bench_lease -- --ignored --nocapture

fuzz-api: ## Fuzz the discovery/lease API from its OpenAPI document with schemathesis (bounded, ~2 min).
	CARGO="$(CARGO)" scripts/fuzz-api.sh

test-apiserver: ## Build the Kubernetes test API server (test support, never shipped).
	$(CARGO) build -p test-apiserver

check-config: build ## Validate a providers file: make check-config PROVIDERS=path.yaml
	$(BIN) --providers-config $(PROVIDERS) --check-config

run: build ## Run the operator against the current kubeconfig with a local providers file.
	$(BIN) --providers-config $(or $(PROVIDERS),config/samples/providers-config.yaml) --health-probe-bind-address 127.0.0.1:8081 --discovery-bind-address 127.0.0.1:8090

docker-build: ## Build the image (IMG=...).
	docker build -t $(IMG) .
