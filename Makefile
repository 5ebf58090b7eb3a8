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
VERSION         ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo v0.0.0-dev)
GIT_COMMIT      := $(shell git rev-parse HEAD 2>/dev/null)
GIT_TREE_STATE  := $(if $(shell git status --porcelain --untracked-files=no 2>/dev/null),dirty,clean)
# The commit's date, not the build's: two builds of one commit are the same.
BUILD_DATE      := $(shell TZ=UTC git log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ 2>/dev/null || echo 1970-01-01T00:00:00Z)
BUILDINFO       := github.com/csi-volmgr/csi-volmgr/volumemanager/buildinfo
LDFLAGS         := -X $(BUILDINFO).gitVersion=$(VERSION) -X $(BUILDINFO).gitCommit=$(GIT_COMMIT) \
                   -X $(BUILDINFO).gitTreeState=$(GIT_TREE_STATE) -X $(BUILDINFO).buildDate=$(BUILD_DATE)
TESTFLAGS       ?= -race -count=1 -timeout=20m
FUZZTIME        ?= 20s
FUZZFLAGS       ?=
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
test: fmt-check vet lint k8s-bins test-unit test-sanity test-kubelet test-helm ## Everything CI runs: gofmt, vet, lint, unit+integration tests (-race), csi-sanity, the kubelet's code beside ours, the Helm chart.

.PHONY: fmt-check
fmt-check: ## Fail if any Go file is not gofmt-clean.
	@out=$$(gofmt -l $$(git ls-files --cached --others --exclude-standard '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

.PHONY: vet
vet: ## go vet every package.
	$(GO) vet ./...
	$(GO) vet -tags e2e ./test/cluster/... ./test/identity/...
	$(GO) vet -tags upgrade ./test/agent/...
	$(GO) vet -tags drivers ./test/drivers/...

.PHONY: lint
lint: $(GOLANGCI_LINT) ## golangci-lint (config in .golangci.yml).
	$(GOLANGCI_LINT) run ./...

.PHONY: docs
docs: ## Regenerate docs/reference (flags, metrics, HTTP endpoints, reasons) from the code; make test fails when it is stale.
	$(GO) run ./hack/docgen -out docs/reference -root .

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
	cd test/kubelet && $(GO) test -timeout=30m -run='^$$' -bench=. -benchtime=$(BENCHTIME) ./fsgroup/

# test/kubelet is the separate module that runs the kubelet's own code
# (k8s.io/kubernetes) beside csi-volmgr's; the root module never imports it.
# Its three test packages run without -race: they compare csi-volmgr's results
# with the kubelet's (file modes, metric definitions, a rendered table), with
# no concurrency of their own, and csi-volmgr's code in them runs under -race
# in test-unit. A race build would compile some 1,400 packages of
# k8s.io/kubernetes a second time, the longest step of a cold CI run; without
# it they reuse what vet and the compile step built.
KUBELET_TESTFLAGS ?= -count=1 -timeout=20m
.PHONY: test-kubelet
test-kubelet: ## Against the kubelet's own code (module test/kubelet): every package vetted and compiled (the bench harness included, not run), the fsGroup ownership change file by file, the volume metrics' names, types, help and labels.
	cd test/kubelet && $(GO) vet ./... && $(GO) test -run='^$$' ./... && $(GO) test $(KUBELET_TESTFLAGS) ./fsgroup/ ./metrics/ ./cmd/benchrender/

# deploy/helm is the separate module that tests the Helm chart through Helm's
# Go SDK; the root module never imports Helm. No separate go vet: it would
# compile Helm's dependencies once more (go test runs vet's checks).
.PHONY: test-helm
test-helm: k8s-bins ## The Helm chart deploy/helm/csi-volmgr: helm lint, helm template, server-side dry-run, equal to deploy/base (module deploy/helm).
	cd deploy/helm && $(GO) test $(TESTFLAGS) ./...

.PHONY: fuzz
fuzz: ## Run every fuzz target for FUZZTIME each (FUZZFLAGS= adds go test flags, e.g. -parallel=1).
	@for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg 2>/dev/null | grep '^Fuzz' || true); do \
	    echo "== $$pkg $$f"; $(GO) test -run='^$$' -fuzz="^$$f$$" -fuzztime=$(FUZZTIME) $(FUZZFLAGS) $$pkg; \
	  done; \
	done

.PHONY: clean
clean: ## Remove build outputs (keeps bin/k8s, which is slow to rebuild).
	rm -rf $(BIN)/csi-volmgr $(BIN)/sanity.log $(IMAGES) $(CROSS) $(IMAGEBUILD)

##@ Upgrades and releases (not part of `make test`; docs/operations.md, "Upgrades and rollbacks")

# The previous release: the commit test-upgrade builds the old agent from and
# the version it stands for (hack/release/previous, rewritten by make release).
PREVIOUS_FILE    := hack/release/previous
PREVIOUS_COMMIT   = $(shell sed -n 's/^commit //p' $(PREVIOUS_FILE))
PREVIOUS_VERSION  = $(shell sed -n 's/^version //p' $(PREVIOUS_FILE))
UPGRADE          := $(BIN)/upgrade
PREVIOUS_LDFLAGS  = -X $(BUILDINFO).gitVersion=$(PREVIOUS_VERSION) -X $(BUILDINFO).gitCommit=$(PREVIOUS_COMMIT) \
                    -X $(BUILDINFO).gitTreeState=clean -X $(BUILDINFO).buildDate=$(BUILD_DATE)
# The previous release's tree, whose Helm chart the Helm upgrade test
# installs first.
test-upgrade: export CSI_VOLMGR_PREVIOUS_SRC := $(UPGRADE)/src

.PHONY: test-upgrade
test-upgrade: k8s-bins ## Upgrade and rollback under live volumes: the agent of the previous release (hack/release/previous) replaced by HEAD's over published filesystem, block, inline and FUSE volumes, and back; the Helm chart upgraded from the previous release's; the DaemonSet's and systemd unit's restart settings (root; about 5 min).
	@test -n "$(PREVIOUS_COMMIT)" || { echo "$(PREVIOUS_FILE) names no commit"; exit 1; }
	@git cat-file -e '$(PREVIOUS_COMMIT)^{commit}' 2>/dev/null || { echo "the previous release $(PREVIOUS_COMMIT) is not in this clone (a shallow clone? git fetch --unshallow)"; exit 1; }
	rm -rf $(UPGRADE) && mkdir -p $(UPGRADE)/src
	git archive $(PREVIOUS_COMMIT) | tar -x -C $(UPGRADE)/src
	cd $(UPGRADE)/src && $(GO) build -race -buildvcs=false -ldflags '$(PREVIOUS_LDFLAGS)' -o $(UPGRADE)/csi-volmgr-previous ./cmd/csi-volmgr
	$(GO) build -race -ldflags '$(LDFLAGS)' -o $(UPGRADE)/csi-volmgr ./cmd/csi-volmgr
	CSI_VOLMGR_PREVIOUS_BINARY=$(UPGRADE)/csi-volmgr-previous CSI_VOLMGR_BINARY=$(UPGRADE)/csi-volmgr \
	  $(GO) test -tags upgrade $(TESTFLAGS) -run '^TestUpgrade' -v ./test/agent/ 2>&1 | tee $(UPGRADE)/agent.log | \
	  grep -E '^(=== RUN|--- |\s+upgrade_test|ok |FAIL|PASS$$)' || true
	@! grep -qE '^(--- FAIL|FAIL)' $(UPGRADE)/agent.log || { echo "test-upgrade failed; full log: $(UPGRADE)/agent.log"; exit 1; }
	@grep -q '^--- PASS: TestUpgradeAndRollbackUnderLiveVolumes' $(UPGRADE)/agent.log || { echo "test-upgrade ran no upgrade test; full log: $(UPGRADE)/agent.log"; exit 1; }
	cd deploy/helm && $(GO) test -tags upgrade $(TESTFLAGS) -run '^TestUpgrade' -v . 2>&1 | tee $(UPGRADE)/helm.log | \
	  grep -E '^(=== RUN|--- |\s+upgrade_test|ok |FAIL|PASS$$)'
	@grep -q '^--- PASS: TestUpgradeChartFromThePreviousRelease' $(UPGRADE)/helm.log || { echo "the Helm upgrade test did not pass; full log: $(UPGRADE)/helm.log"; exit 1; }
	$(GO) test $(TESTFLAGS) -run '^(TestAgentDaemonSetRollsOutOneNodeAtATime|TestSystemdUnit)$$' ./deploy/

# make release's checks (hack/release/release.sh): what CI runs but e2e, and
# the upgrade from the previous release.
RELEASE_CHECKS ?= test test-upgrade

.PHONY: release
release: ## Release VERSION=vX.Y.Z (clean main): make RELEASE_CHECKS (test test-upgrade), CHANGELOG's [Unreleased] under the version, deploy/'s image tag, commit and tag, make images, then hack/release/previous names it (a second commit). DRY_RUN=1 prints it all and changes nothing. Pushes nothing.
	VERSION='$(VERSION)' MAKE='$(MAKE)' GO='$(GO)' RELEASE_CHECKS='$(RELEASE_CHECKS)' DRY_RUN='$(DRY_RUN)' hack/release/release.sh

##@ End to end: a virtual node on a real control plane (root)

E2E_BINS := $(K8S_BIN)/kube-controller-manager $(K8S_BIN)/kube-scheduler $(K8S_BIN)/csi-attacher

.PHONY: e2e-bins
e2e-bins: k8s-bins $(E2E_BINS) ## Build kube-controller-manager, kube-scheduler and the external-attacher for make e2e (only when missing).

$(K8S_BIN)/kube-controller-manager:
	cd test/k8s/tools && $(GO) build -o $@ k8s.io/kubernetes/cmd/kube-controller-manager
$(K8S_BIN)/kube-scheduler:
	cd test/k8s/tools && $(GO) build -o $@ k8s.io/kubernetes/cmd/kube-scheduler
$(K8S_BIN)/csi-attacher:
	cd test/k8s/attacher && $(GO) build -o $@ github.com/kubernetes-csi/external-attacher/v4/cmd/csi-attacher

.PHONY: e2e
e2e: e2e-bins ## The example virtual-kubelet runtime with csi-volmgr on kube-apiserver, kube-controller-manager, kube-scheduler and the external-attacher (test/cluster).
	$(GO) test -tags e2e $(TESTFLAGS) ./test/cluster/... ./test/identity/...

.PHONY: e2e-bench
e2e-bench: e2e-bins ## 50 pods with an attach-required PVC on the virtual node: created→Running p50/p99 and its parts, delete→detached p50.
	$(GO) test -tags e2e -count=1 -timeout=30m -run='^$$' -bench=BenchmarkVirtualNodePods -benchtime=$(BENCHTIME) ./test/cluster/...

##@ Version skew (issue 35; not part of `make test`, see docs/operations.md)
#
# make test-skew runs the end-to-end suites (test/cluster, test/identity) once
# per supported Kubernetes minor: the control plane (kube-apiserver,
# kube-controller-manager, kube-scheduler) of each older minor is built from
# its own module test/k8s/skew/<minor> into bin/k8s-<minor>/, beside the
# current minor's etcd, kubectl and csi-attacher. The newest minor is bin/k8s.

SKEW_MINORS  ?= v1.34 v1.35 v1.36 v1.37
SKEW_NEWEST  := v1.37
SKEW_RESULTS ?= $(BIN)/skew
SKEW_FLAGS   ?= -race -count=1 -timeout=30m
# The minors whose control plane is built here (every one but the newest).
SKEW_OLDER    = $(filter-out $(SKEW_NEWEST),$(SKEW_MINORS))

# One go build per minor: the three commands share their compilation. Built
# into a temporary folder and moved, so that an interrupted build is not
# taken for a finished one. The -X flags give the binaries the version of
# their module (as Kubernetes' own build does): `--version` and the API
# server's /version say v1.34.4, not v0.0.0-master.
K8S_VERSION_PKG := k8s.io/component-base/version
$(BIN)/k8s-v%/kube-apiserver: | e2e-bins
	rm -rf $(BIN)/.k8s-v$*.tmp && mkdir -p $(BIN)/.k8s-v$*.tmp
	cd test/k8s/skew/v$* && v=$$($(GO) list -m -f '{{.Version}}' k8s.io/kubernetes) && \
	  $(GO) build -ldflags "-X $(K8S_VERSION_PKG).gitVersion=$$v -X $(K8S_VERSION_PKG).gitMajor=1 \
	    -X $(K8S_VERSION_PKG).gitMinor=$(word 2,$(subst ., ,$*))" -o $(BIN)/.k8s-v$*.tmp/ k8s.io/kubernetes/cmd/kube-apiserver \
	  k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler
	mkdir -p $(BIN)/k8s-v$*
	for b in etcd kubectl csi-attacher; do ln -sf $(K8S_BIN)/$$b $(BIN)/k8s-v$*/$$b; done
	mv $(BIN)/.k8s-v$*.tmp/kube-controller-manager $(BIN)/.k8s-v$*.tmp/kube-scheduler $(BIN)/k8s-v$*/
	mv $(BIN)/.k8s-v$*.tmp/kube-apiserver $(BIN)/k8s-v$*/ && rmdir $(BIN)/.k8s-v$*.tmp

.PHONY: skew-bins
skew-bins: e2e-bins $(foreach m,$(SKEW_OLDER),$(BIN)/k8s-$(m)/kube-apiserver) ## Build the control plane of every older minor of SKEW_MINORS into bin/k8s-<minor>/ (only when missing; one after another, several minutes and ~1 GB of modules each).

# The suites of make test-skew: the agent in-process on a real API server
# (test/e2e: publish, attach, attach limits, expansion, ownership, SELinux,
# restarts, teardown), then with kube-controller-manager, kube-scheduler and
# the external-attacher (test/cluster: scheduling, attach/detach, generic
# ephemeral volumes) and as its own Node (test/identity).
SKEW_PKGS    ?= ./test/e2e/... ./test/cluster/... ./test/identity/...

.PHONY: test-skew
test-skew: skew-bins ## The end-to-end suites (SKEW_PKGS) against the control plane of each minor of SKEW_MINORS (v1.34 v1.35 v1.36 v1.37); a summary per minor in bin/skew/summary.txt, logs in bin/skew/.
	@mkdir -p $(SKEW_RESULTS); rc=0; \
	echo "# make test-skew: commit $(GIT_COMMIT) ($(GIT_TREE_STATE)), $$(TZ=UTC date '+%F %H:%M') UTC, $$(nproc) CPUs; $(SKEW_PKGS)" \
	  > $(SKEW_RESULTS)/summary.txt; \
	for m in $(SKEW_MINORS); do \
	  dir=$(BIN)/k8s-$$m; mod=test/k8s/skew/$$m; \
	  if [ "$$m" = "$(SKEW_NEWEST)" ]; then dir=$(K8S_BIN); mod=test/k8s/tools; fi; \
	  ver=$$(cd $$mod && $(GO) list -m -f '{{.Version}}' k8s.io/kubernetes); \
	  echo "== $$m: kube-apiserver $$ver ($$dir)"; start=$$(date +%s); \
	  if CSI_VOLMGR_EXPECT_K8S_MINOR=$$m KUBEBUILDER_ASSETS=$$dir $(GO) test -tags e2e $(SKEW_FLAGS) -v $(SKEW_PKGS) > $(SKEW_RESULTS)/$$m.log 2>&1; \
	  then res=PASS; else res=FAIL; rc=1; fi; \
	  echo "$$m $$ver $$res" \
	    "tests_passed=$$(grep -c -- '^--- PASS' $(SKEW_RESULTS)/$$m.log || true)" \
	    "tests_failed=$$(grep -c -- '^--- FAIL' $(SKEW_RESULTS)/$$m.log || true)" \
	    "tests_skipped=$$(grep -c -- '^--- SKIP' $(SKEW_RESULTS)/$$m.log || true)" \
	    "subtests_passed=$$(grep -cE -- '^[[:space:]]+--- PASS' $(SKEW_RESULTS)/$$m.log || true)" \
	    "subtests_failed=$$(grep -cE -- '^[[:space:]]+--- FAIL' $(SKEW_RESULTS)/$$m.log || true)" \
	    "packages=$$(grep -cE '^(ok|FAIL)[[:space:]]+github' $(SKEW_RESULTS)/$$m.log || true)" \
	    "seconds=$$(( $$(date +%s) - start ))" | tee -a $(SKEW_RESULTS)/summary.txt; \
	  grep -E '^(--- FAIL|FAIL|ok|panic)' $(SKEW_RESULTS)/$$m.log | sed 's/^/   /' || true; \
	done; \
	echo "summary: $(SKEW_RESULTS)/summary.txt, logs: $(SKEW_RESULTS)/<minor>.log"; exit $$rc

##@ Demo

.PHONY: run
run: ## Demo (as root): the CSI test plugin and the agent in standalone mode on examples/standalone/; Ctrl-C tears the volume down and exits.
	BIN=$(BIN) GO=$(GO) LDFLAGS='$(LDFLAGS)' examples/standalone/run.sh

##@ Container images (no Docker; not part of `make test`)
#
# hack/imagebuild (go-containerregistry) puts static binaries, cross-compiled
# for each of IMAGE_PLATFORMS, on an empty base: one OCI image layout per
# image under bin/images/, holding a multi-platform index tagged IMAGE_TAG.
# The same commit gives the same digests (-trimpath, -buildvcs=false, the
# commit's date as every timestamp). deploy/kind/image/README.md says more.

IMAGE_REGISTRY   ?= ghcr.io/csi-volmgr
# The release deploy/ names (deploy/base's one images: entry, the chart's
# appVersion): what `make images` tags by default, so that a clone's
# `kubectl apply -k deploy/base` and `helm install` run what it built. The
# binaries inside say which commit they are (`csi-volmgr version`).
DEPLOY_TAG       := $(shell sed -n 's/^ *newTag: *//p' deploy/base/kustomization.yaml)
IMAGE_TAG        ?= $(DEPLOY_TAG)
IMAGE_PLATFORMS  ?= linux/amd64 linux/arm64
# The platform `make images-load` puts into Docker.
HOST_PLATFORM    ?= linux/$(shell $(GO) env GOARCH)
IMAGES           := $(BIN)/images
CROSS            := $(BIN)/cross
IMAGEBUILD       := $(BIN)/imagebuild
AGENT_IMAGE      := $(IMAGE_REGISTRY)/csi-volmgr:$(IMAGE_TAG)
TESTPLUGIN_IMAGE := $(IMAGE_REGISTRY)/csi-volmgr-testplugin:$(IMAGE_TAG)
RUNTIME_IMAGE    := $(IMAGE_REGISTRY)/csi-volmgr-example-runtime:$(IMAGE_TAG)
IMAGE_LAYOUTS    := $(IMAGES)/csi-volmgr $(IMAGES)/csi-volmgr-testplugin $(IMAGES)/csi-volmgr-example-runtime
IMAGE_BUILD       = $(IMAGEBUILD) build -created $(BUILD_DATE) \
                    -annotation org.opencontainers.image.version=$(IMAGE_TAG) \
                    -annotation org.opencontainers.image.revision=$(GIT_COMMIT) \
                    -annotation org.opencontainers.image.created=$(BUILD_DATE) \
                    -annotation org.opencontainers.image.licenses=Apache-2.0 \
                    $(foreach p,$(IMAGE_PLATFORMS),-platform $(p)=$(CROSS)/$(subst /,_,$(p)))

.PHONY: imagebuild
imagebuild:
	$(GO) build -o $(IMAGEBUILD) ./hack/imagebuild

.PHONY: images
images: imagebuild ## Build the images of the agent, the CSI test plugin and the example runtime for IMAGE_PLATFORMS (linux/amd64 linux/arm64) into OCI layouts bin/images/<name>, tagged IMAGE_TAG (default: the release deploy/ names); no Docker.
	@for p in $(IMAGE_PLATFORMS); do \
	  out=$(CROSS)/$${p/\//_}; mkdir -p $$out; echo "go build $$p -> $$out"; \
	  CGO_ENABLED=0 GOOS=$${p%/*} GOARCH=$${p#*/} $(GO) build -trimpath -buildvcs=false \
	    -ldflags '-s -w $(LDFLAGS) -X main.version=$(VERSION)' -o $$out/ \
	    ./cmd/csi-volmgr ./examples/vk-runtime ./test/plugin/cmd/csi-testplugin; \
	  mv $$out/vk-runtime $$out/csi-volmgr-example-runtime; \
	done
	@$(IMAGE_BUILD) -o $(IMAGES)/csi-volmgr -ref $(AGENT_IMAGE) -user 0:0 -entrypoint /csi-volmgr /csi-volmgr
	@$(IMAGE_BUILD) -o $(IMAGES)/csi-volmgr-testplugin -ref $(TESTPLUGIN_IMAGE) -user 0:0 -entrypoint /csi-testplugin /csi-testplugin
	@$(IMAGE_BUILD) -o $(IMAGES)/csi-volmgr-example-runtime -ref $(RUNTIME_IMAGE) -user 0:0 \
	  -entrypoint /csi-volmgr-example-runtime /csi-volmgr-example-runtime /csi-volmgr
	@if [ "$(DEPLOY_TAG)" != "$(IMAGE_TAG)" ]; then \
	  echo "note: deploy/ names csi-volmgr:$(DEPLOY_TAG); \`make deploy-image-tag IMAGE_TAG=$(IMAGE_TAG)\` names this build"; fi

.PHONY: images-load
images-load: images docker ## Put the HOST_PLATFORM image of each into Docker under its name (docker load), for kind.
	$(IMAGEBUILD) docker-tar -platform $(HOST_PLATFORM) $(IMAGE_LAYOUTS) | docker load

.PHONY: deploy-image-tag
deploy-image-tag: imagebuild ## Set the agent's tag in deploy/base's one kustomize images: entry and the Helm chart's appVersion to IMAGE_TAG (a release: IMAGE_TAG=vX.Y.Z, then commit and tag).
	$(IMAGEBUILD) image-tag -kustomization deploy/base/kustomization.yaml -image csi-volmgr -set '$(IMAGE_TAG)'
	sed -i 's/^appVersion: .*/appVersion: $(IMAGE_TAG)/' deploy/helm/csi-volmgr/Chart.yaml

##@ kind (need root; not part of `make test`)
#
# Everything is built here from Go modules and Debian packages: no image
# registry is reachable. deploy/kind/image/README.md says how, README.md (Run
# under kind) what the builds cost. Outputs are cached in bin/kind and Docker.

KIND_NODE_IMAGE ?= csi-volmgr-kind/node:v1.37.2
KIND_BUILD      := deploy/kind/image/build.sh
# deploy/kind (the bare agent for the virtual node) or deploy/kind/runtime
# (the example runtime embedding it: the virtual node's pods run).
KIND_OVERLAY    ?= deploy/kind
KIND_ENV         = KIND="$$($(KIND_BUILD) kind)" KUBECTL=$(K8S_BIN)/kubectl KIND_NODE_IMAGE=$(KIND_NODE_IMAGE) \
                   KIND_OVERLAY=$(KIND_OVERLAY) IMAGE=$(AGENT_IMAGE) TESTPLUGIN_IMAGE=$(TESTPLUGIN_IMAGE) RUNTIME_IMAGE=$(RUNTIME_IMAGE)

.PHONY: docker
docker: ## Start dockerd unless one answers (installs Debian's docker.io if missing); `make kind-down` stops only a dockerd it started.
	deploy/kind/dockerd.sh start

.PHONY: kind-image
kind-image: docker ## Build the kind node image KIND_NODE_IMAGE (Kubernetes v1.37.2) from sources; cached, long the first time.
	KIND_NODE_IMAGE=$(KIND_NODE_IMAGE) $(KIND_BUILD) node

.PHONY: kind-deploy-images
kind-deploy-images: docker ## Build the images deploy/kind uses besides ours: external-attacher, external-provisioner, a shell.
	$(KIND_BUILD) deploy-images

.PHONY: kind-up
kind-up: kind-image kind-deploy-images images-load $(K8S_BIN)/kubectl ## Create the kind cluster, load the images, deploy KIND_OVERLAY (agent for the virtual node + CSI test plugin).
	$(KIND_ENV) deploy/kind/up.sh

.PHONY: kind-e2e
kind-e2e: kind-up ## Under kind: pods of one StorageClass on the virtual node (csi-volmgr) and on a kubelet node: attached, staged, published, torn down, detached.
	$(KIND_ENV) deploy/kind/e2e.sh

.PHONY: kind-down
kind-down: ## Delete the kind cluster; stop dockerd if `make docker` started it.
	if docker info >/dev/null 2>&1; then $(KIND_ENV) deploy/kind/down.sh; fi
	deploy/kind/dockerd.sh stop

##@ Kubelet baseline (issues 17 and 24; separate module test/kubelet, not part of `make test`)

KUBELET_BENCH_FLAGS ?= -timeout=180m
# Which tests and benchmarks bench-kubelet-run runs (go test -run, -bench).
KUBELET_BENCH_TESTS ?= .
KUBELET_BENCH_BENCHES ?= .
KUBELET_BENCH_RESULTS ?= $(CURDIR)/bench-results
KUBELET_STRESS_RESULTS ?= $(CURDIR)/bench-results-stress
# The committed results file of a run and what is rendered from it: the
# table of docs/performance.md between its benchrender markers and the
# charts in docs/bench/. Named by the day and the commit measured.
BENCH_DOCS   := docs/bench
BENCH_STAMP  := $(shell TZ=UTC date +%Y-%m-%d)-$(shell git rev-parse --short=12 HEAD 2>/dev/null)
BENCH_JSON   ?= $(BENCH_DOCS)/$(BENCH_STAMP).json
STRESS_JSON  ?= $(BENCH_DOCS)/$(BENCH_STAMP)-stress.json
KUBELET_BENCH_ENV = CSI_VOLMGR_BINARY=$(BIN)/csi-volmgr CSI_TESTPLUGIN_BINARY=$(BIN)/csi-testplugin \
  KUBELET_VOLUMES_BINARY=$(BIN)/kubelet-volumes KUBELET_BENCH_COMMIT=$(GIT_COMMIT) KUBELET_BENCH_TREE_STATE=$(GIT_TREE_STATE)

.PHONY: kubelet-bench-bins
kubelet-bench-bins: k8s-bins
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/csi-volmgr ./cmd/csi-volmgr
	$(GO) build -o $(BIN)/csi-testplugin ./test/plugin/cmd/csi-testplugin
	cd test/kubelet && $(GO) build -o $(BIN)/kubelet-volumes ./cmd/kubelet-volumes

# The benchmark runs in a mount namespace of its own (unshare -m): its up to
# 20,000 bind mounts stay out of the host's mount table, and go with the
# namespace if the run is killed.
.PHONY: bench-kubelet
bench-kubelet: bench-kubelet-run ## csi-volmgr beside the real kubelet's volume manager: both at the kubelet's API budget and each at its defaults, 30/110 pods, bursts of 110 and 1,000, attach lags, a 15-min steady state at 110 and 1,000 volumes, 3 runs in alternating order (about 2 h 10 min by the estimate of `make bench-kubelet-plan`, on an otherwise idle machine); results.json into docs/bench/, the table of docs/performance.md and the charts rendered from it.
	$(MAKE) bench-kubelet-save

.PHONY: bench-kubelet-plan
bench-kubelet-plan: ## Print what make bench-kubelet runs and how long it should take on this machine, without running it.
	@cd test/kubelet && $(GO) test -count=1 -run='^TestPlan$$' -v ./bench/ | sed -n '/^plan:/,/total/p'

.PHONY: bench-kubelet-run
bench-kubelet-run: kubelet-bench-bins ## Only the measurement of make bench-kubelet (the harness tests first), into KUBELET_BENCH_RESULTS (results.json, table.md, charts, profiles, logs); KUBELET_BENCH_* in the environment change it (test/kubelet/bench/doc.go).
	rm -rf $(KUBELET_BENCH_RESULTS)
	cd test/kubelet && $(KUBELET_BENCH_ENV) KUBELET_BENCH_RESULTS=$(KUBELET_BENCH_RESULTS) \
	  unshare -m --propagation private -- \
	  $(GO) test -p 1 $(KUBELET_BENCH_FLAGS) -run='$(KUBELET_BENCH_TESTS)' -bench='$(KUBELET_BENCH_BENCHES)' -benchtime=1x ./bench/ 2>&1 | tee $(KUBELET_BENCH_RESULTS).log

.PHONY: bench-kubelet-save
bench-kubelet-save: ## Copy KUBELET_BENCH_RESULTS/results.json to BENCH_JSON (docs/bench/<day>-<commit>.json) and render docs/performance.md's table and docs/bench/*.svg from it.
	mkdir -p $(BENCH_DOCS)
	cp $(KUBELET_BENCH_RESULTS)/results.json $(BENCH_JSON)
	$(MAKE) bench-render BENCH_JSON=$(BENCH_JSON)

.PHONY: bench-render
bench-render: ## Render docs/performance.md's table, README's headline table and docs/bench/*.svg from the committed BENCH_JSON (no measurement).
	cd test/kubelet && $(GO) run ./cmd/benchrender -in $(CURDIR)/$(BENCH_JSON) -source $(BENCH_JSON) \
	  -md $(CURDIR)/docs/performance.md -svg $(CURDIR)/$(BENCH_DOCS)
	cd test/kubelet && $(GO) run ./cmd/benchrender -in $(CURDIR)/$(BENCH_JSON) -source $(BENCH_JSON) \
	  -md $(CURDIR)/README.md -name readme -headline

.PHONY: bench-kubelet-stress
bench-kubelet-stress: kubelet-bench-bins ## The stress rows, run once: bursts of 3,000, 5,000 and 10,000 pods, restart with 5,000 volumes, every column (about 1 h 15 min: the kubelet alone takes about 40 min); results into docs/bench/<day>-<commit>-stress.json and the stress table of docs/performance.md.
	rm -rf $(KUBELET_STRESS_RESULTS)
	cd test/kubelet && $(KUBELET_BENCH_ENV) KUBELET_BENCH_RESULTS=$(KUBELET_STRESS_RESULTS) \
	  KUBELET_BENCH_RUNS=1 KUBELET_BENCH_BURST=0,3000,5000,10000 KUBELET_BENCH_RESTART_AT=5000 \
	  unshare -m --propagation private -- \
	  $(GO) test -p 1 $(KUBELET_BENCH_FLAGS) -run='^$$' -bench='^BenchmarkBurst$$' -benchtime=1x ./bench/ 2>&1 | tee $(KUBELET_STRESS_RESULTS).log
	mkdir -p $(BENCH_DOCS)
	cp $(KUBELET_STRESS_RESULTS)/results.json $(STRESS_JSON)
	cd test/kubelet && $(GO) run ./cmd/benchrender -in $(CURDIR)/$(STRESS_JSON) -source $(STRESS_JSON) -name stress \
	  -md $(CURDIR)/docs/performance.md -svg $(CURDIR)/$(BENCH_DOCS)/stress

##@ Stock CSI drivers (issue 34; root; not part of `make test`, see docs/drivers.md)

# DRIVERS are the directories of test/drivers that `make drivers` runs. Each
# driver's binaries are built by its rule drivers-bins-<name> into
# bin/drivers/<name>/, from a module of its own (test/drivers/<name>/tools):
# the drivers' dependency graphs conflict with csi-volmgr's.
DRIVERS         ?= juicefs secrets-store cert-manager
DRIVERS_BIN     := $(BIN)/drivers
DRIVERS_RESULTS ?= docs/drivers/results
DRIVERS_TIMEOUT ?= 30m

.PHONY: drivers
drivers: e2e-bins $(addprefix drivers-bins-,$(DRIVERS)) ## Real CSI drivers built from their modules (DRIVERS=juicefs ...): csi-volmgr check against each node plugin, and the agent's lifecycle with it on a real control plane; results into docs/drivers/results/, the table of docs/drivers.md rendered from them and printed.
	@rc=0; for d in $(DRIVERS); do \
	  echo "== make drivers: $$d (log: $(BIN)/drivers-$$d.log)"; \
	  DRIVERS_RESULTS=$(CURDIR)/$(DRIVERS_RESULTS) DRIVERS_BIN=$(DRIVERS_BIN) \
	    $(GO) test -tags drivers -race -count=1 -timeout $(DRIVERS_TIMEOUT) -v ./test/drivers/$$d/... >$(BIN)/drivers-$$d.log 2>&1 || rc=1; \
	  grep -E '^\s*--- (PASS|FAIL|SKIP)|^(ok|FAIL)\s' $(BIN)/drivers-$$d.log || true; \
	done; \
	$(GO) run ./hack/driverstable -results $(DRIVERS_RESULTS) -doc docs/drivers.md; \
	exit $$rc

JUICEFS_BIN := $(DRIVERS_BIN)/juicefs

.PHONY: drivers-bins-juicefs
drivers-bins-juicefs: $(JUICEFS_BIN)/juicefs-csi-driver $(JUICEFS_BIN)/juicefs ## Build the JuiceFS CSI driver v0.30.1 and the juicefs client v1.3.1 into bin/drivers/juicefs (only when missing).

$(JUICEFS_BIN)/juicefs-csi-driver:
	cd test/drivers/juicefs/tools && $(GO) build -o $@ github.com/juicedata/juicefs-csi-driver/cmd
$(JUICEFS_BIN)/juicefs:
	cd test/drivers/juicefs/tools/client && $(GO) build -o $@ github.com/juicedata/juicefs

##@ Reliability (issue 16; not part of `make test`, see docs/reliability.md)

SEED     ?= 0
DURATION ?= 10m
OPS      ?= 0
KILLS    ?= 0
CHAOS_LOGS ?= $(BIN)/chaos-logs
# CHAOS_FLAGS are more flags of the chaos command, e.g. CHAOS_FLAGS=-outage-recovery=120s.
CHAOS_FLAGS ?=

.PHONY: chaos
chaos: k8s-bins ## Chaos run (root): the agent (-race), a real API server, the test plugins, nemeses at random moments. SEED= (0: from the clock, printed), DURATION=, OPS= and KILLS= (stop once both are reached).
	$(GO) build -race -o $(BIN)/csi-volmgr-race ./cmd/csi-volmgr
	$(GO) build -o $(BIN)/chaos ./test/chaos/cmd/chaos
	CSI_VOLMGR_BINARY=$(BIN)/csi-volmgr-race GORACE=halt_on_error=1 $(BIN)/chaos -seed=$(SEED) -duration=$(DURATION) \
	  -ops=$(OPS) -kills=$(KILLS) -logs=$(CHAOS_LOGS) -report=$(BIN)/chaos-report.md $(CHAOS_FLAGS)

# The tag `make images` gives the images (deploy/images_test.go checks it is
# the one deploy/ names).
.PHONY: print-image-tag
print-image-tag:
	@echo '$(IMAGE_TAG)'

# The -ldflags every build of the agent uses (cmd/csi-volmgr's version test
# builds with them).
.PHONY: print-ldflags
print-ldflags:
	@echo '$(LDFLAGS)'

##@ Driver matrix: secrets-store-csi-driver (test/drivers/secrets-store, docs/drivers.md)

SECRETS_STORE_BIN := $(BIN)/drivers/secrets-store
SECRETS_STORE_VERSION := v1.6.0

.PHONY: drivers-bins-secrets-store
drivers-bins-secrets-store: $(SECRETS_STORE_BIN)/secrets-store-csi-driver $(SECRETS_STORE_BIN)/secrets-store-e2e-provider ## Build secrets-store-csi-driver's node plugin and the matrix's provider (module test/drivers/secrets-store/tools; only when missing).

$(SECRETS_STORE_BIN)/secrets-store-csi-driver:
	cd test/drivers/secrets-store/tools && CGO_ENABLED=0 $(GO) build \
	  -ldflags "-X sigs.k8s.io/secrets-store-csi-driver/pkg/version.BuildVersion=$(SECRETS_STORE_VERSION)" \
	  -o $@ sigs.k8s.io/secrets-store-csi-driver/cmd/secrets-store-csi-driver

$(SECRETS_STORE_BIN)/secrets-store-e2e-provider:
	cd test/drivers/secrets-store/tools && $(GO) build -o $@ ./fakeprovider

##@ Driver matrix: cert-manager csi-driver (test/drivers/cert-manager, docs/drivers.md)

CERT_MANAGER_BIN := $(BIN)/drivers/cert-manager
CERT_MANAGER_CSI_VERSION := v0.12.0

.PHONY: drivers-bins-cert-manager
drivers-bins-cert-manager: $(CERT_MANAGER_BIN)/cert-manager-csi-driver ## Build cert-manager's csi-driver node plugin (module test/drivers/cert-manager/tools; only when missing).

$(CERT_MANAGER_BIN)/cert-manager-csi-driver:
	cd test/drivers/cert-manager/tools && CGO_ENABLED=0 $(GO) build \
	  -ldflags "-X github.com/cert-manager/csi-driver/internal/version.AppVersion=$(CERT_MANAGER_CSI_VERSION)" \
	  -o $@ github.com/cert-manager/csi-driver/cmd

##@ Driver matrix: TopoLVM (test/drivers/topolvm, docs/drivers.md)

# Not in DRIVERS: TopoLVM needs a kernel with device-mapper, which these machines lack; run
# `make drivers DRIVERS=topolvm` where /proc/misc lists device-mapper.

TOPOLVM_BIN := $(BIN)/drivers/topolvm

.PHONY: drivers-bins-topolvm
drivers-bins-topolvm: $(TOPOLVM_BIN)/hypertopolvm ## Build TopoLVM v0.38.0's hypertopolvm (topolvm-node, topolvm-controller, lvmd; module test/drivers/topolvm/tools; only when missing) and install Debian's lvm2 when lvm is missing.
	@command -v lvm >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq lvm2; }

# GONOSUMDB: the checksum database does not answer for github.com/topolvm here; go.sum pins it.
$(TOPOLVM_BIN)/hypertopolvm:
	cd test/drivers/topolvm/tools && GONOSUMDB=github.com/topolvm CGO_ENABLED=0 $(GO) build -o $@ github.com/topolvm/topolvm/cmd/hypertopolvm
