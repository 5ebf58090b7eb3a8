# csi-volmgr — developer entry points. `make help` lists them.
#
# Everything here needs only Go, git and make: tools are built from the Go
# module proxy into bin/ (kube-apiserver, etcd and kubectl from the separate
# module test/k8s/tools, golangci-lint at a pinned version).

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

GO              ?= go
BIN             := $(CURDIR)/bin
K8S_BIN         := $(BIN)/k8s
GOLANGCI_VERSION := v2.15.0
GOLANGCI_LINT   := $(BIN)/golangci-lint-$(GOLANGCI_VERSION)
VERSION         ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS         := -X github.com/csi-volmgr/csi-volmgr/cmd/csi-volmgr/app.version=$(VERSION)
TESTFLAGS       ?= -race -count=1 -timeout=20m
FUZZTIME        ?= 20s
BENCHTIME       ?= 1x

# Integration tests find the control plane here (controller-runtime envtest).
export KUBEBUILDER_ASSETS := $(K8S_BIN)

SANITY_PKG := ./test/sanity/...
GO_PKGS     = $$($(GO) list ./... | grep -v /test/sanity)

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} \
	  /^[a-zA-Z0-9_-]+:.*?##/ { printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2 } \
	  /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Build

.PHONY: build
build: ## Build the agent into bin/csi-volmgr.
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/csi-volmgr ./cmd/csi-volmgr

.PHONY: k8s-bins
k8s-bins: $(K8S_BIN)/kube-apiserver $(K8S_BIN)/etcd $(K8S_BIN)/kubectl ## Build kube-apiserver, etcd and kubectl for the tests (only when missing).

$(K8S_BIN)/kube-apiserver:
	cd test/k8s/tools && $(GO) build -o $@ k8s.io/kubernetes/cmd/kube-apiserver
$(K8S_BIN)/etcd:
	cd test/k8s/tools && $(GO) build -o $@ go.etcd.io/etcd/server/v3
$(K8S_BIN)/kubectl:
	cd test/k8s/tools && $(GO) build -o $@ k8s.io/kubernetes/cmd/kubectl

$(GOLANGCI_LINT):
	GOBIN=$(BIN)/.golangci $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_VERSION)
	mv $(BIN)/.golangci/golangci-lint $@ && rmdir $(BIN)/.golangci

##@ Verify and test

.PHONY: test
test: fmt-check vet lint k8s-bins test-unit test-sanity ## Everything CI runs: gofmt, vet, lint, unit+integration tests (-race), csi-sanity.

.PHONY: fmt-check
fmt-check: ## Fail if any Go file is not gofmt-clean.
	@out=$$(gofmt -l $$(git ls-files --cached --others --exclude-standard '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

.PHONY: vet
vet: ## go vet every package.
	$(GO) vet ./...

.PHONY: lint
lint: $(GOLANGCI_LINT) ## golangci-lint (config in .golangci.yml).
	$(GOLANGCI_LINT) run ./...

.PHONY: test-unit
test-unit: k8s-bins ## Unit and integration tests with -race (real kube-apiserver, real CSI test plugin).
	$(GO) test $(TESTFLAGS) $(GO_PKGS)

.PHONY: test-sanity
test-sanity: ## csi-sanity against the CSI test plugin (and csi-volmgr's front); prints the counts.
	$(GO) test $(TESTFLAGS) -v $(SANITY_PKG) 2>&1 | tee $(BIN)/sanity.log | \
	  grep -E '^(--- (PASS|FAIL)|Ran [0-9]+ of|(SUCCESS|FAIL)! -- |ok |FAIL|PASS$$)|csi-sanity counts' || true
	@! grep -qE '^(--- FAIL|FAIL)' $(BIN)/sanity.log || { echo "csi-sanity failed; full log: $(BIN)/sanity.log"; exit 1; }

.PHONY: bench
bench: k8s-bins ## Benchmarks (figures the issues ask for).
	$(GO) test -p 1 -timeout=60m -run='^$$' -bench=. -benchmem -benchtime=$(BENCHTIME) $(GO_PKGS)

.PHONY: fuzz
fuzz: ## Run every fuzz target for FUZZTIME each.
	@for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg 2>/dev/null | grep '^Fuzz' || true); do \
	    echo "== $$pkg $$f"; $(GO) test -run='^$$' -fuzz="^$$f$$" -fuzztime=$(FUZZTIME) $$pkg; \
	  done; \
	done

.PHONY: clean
clean: ## Remove build outputs (keeps bin/k8s, which is slow to rebuild).
	rm -f $(BIN)/csi-volmgr $(BIN)/sanity.log

##@ Demo

.PHONY: run
run: ## Demo (as root): the CSI test plugin and the agent in standalone mode on examples/standalone/; Ctrl-C tears the volume down and exits.
	BIN=$(BIN) GO=$(GO) LDFLAGS='$(LDFLAGS)' examples/standalone/run.sh

##@ Container image and kind (need Docker and kind; not part of `make test`)

.PHONY: image
image: ## Build the agent's container image (IMAGE, default csi-volmgr:kind) with Docker.
	docker build --build-arg VERSION=$(VERSION) -t $(or $(IMAGE),csi-volmgr:kind) .

.PHONY: kind-up
kind-up: image $(K8S_BIN)/kubectl ## Create the kind cluster, load the image, deploy deploy/kind (agent for the virtual node + hostpath driver).
	IMAGE=$(or $(IMAGE),csi-volmgr:kind) KUBECTL=$(K8S_BIN)/kubectl deploy/kind/up.sh

.PHONY: kind-e2e
kind-e2e: kind-up ## Under kind: the example pod's volume on the virtual node is published, mounted on the host, torn down.
	KUBECTL=$(K8S_BIN)/kubectl deploy/kind/e2e.sh

##@ Kubelet baseline (issue 17; separate module test/kubelet, not part of `make test`)

KUBELET_BENCH_FLAGS ?= -timeout=180m
KUBELET_BENCH_RESULTS ?= $(CURDIR)/bench-results

# The benchmark runs in a mount namespace of its own (unshare -m): its up to
# 20,000 bind mounts stay out of the host's mount table, and go with the
# namespace if the run is killed.
.PHONY: bench-kubelet
bench-kubelet: k8s-bins ## csi-volmgr beside the real kubelet's volume manager, every figure of issue 17 with ratios (about 2 hours; tables, charts and profiles into bench-results/); the harness tests first.
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/csi-volmgr ./cmd/csi-volmgr
	$(GO) build -o $(BIN)/csi-testplugin ./test/plugin/cmd/csi-testplugin
	cd test/kubelet && $(GO) build -o $(BIN)/kubelet-volumes ./cmd/kubelet-volumes
	cd test/kubelet && CSI_VOLMGR_BINARY=$(BIN)/csi-volmgr CSI_TESTPLUGIN_BINARY=$(BIN)/csi-testplugin \
	  KUBELET_VOLUMES_BINARY=$(BIN)/kubelet-volumes KUBELET_BENCH_RESULTS=$(KUBELET_BENCH_RESULTS) \
	  unshare -m --propagation private -- \
	  $(GO) test -p 1 $(KUBELET_BENCH_FLAGS) -run=. -bench=. -benchtime=1x ./bench/ 2>&1 | tee $(KUBELET_BENCH_RESULTS).log
