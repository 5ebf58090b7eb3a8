# syntax=docker/dockerfile:1
# csi-volmgr: a static binary on a distroless base.
#
#   docker build -t csi-volmgr:kind --build-arg VERSION=$(git describe --tags --always --dirty) .
#
# It needs BuildKit (the default builder of Docker 23 and later).
#
# The agent runs privileged as root (Bidirectional mount propagation, the
# kubelet's directory layout); it needs no shell, no mount binary and no libc:
# it inspects the mount table itself and leaves mounting to the CSI drivers.

ARG GO_VERSION=1.26.8
ARG BASE_IMAGE=gcr.io/distroless/static-debian12:latest

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
WORKDIR /src
# Module downloads first, so that they are cached across source changes.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
# Set by BuildKit for the platform built for (docker buildx --platform).
ARG TARGETOS TARGETARCH
ARG VERSION=dev
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath \
      -ldflags "-s -w -X github.com/csi-volmgr/csi-volmgr/cmd/csi-volmgr/app.version=${VERSION}" \
      -o /out/csi-volmgr ./cmd/csi-volmgr

FROM ${BASE_IMAGE}
COPY --from=build /out/csi-volmgr /csi-volmgr
# Root: the agent creates and removes directories in the kubelet layout
# below --root-dir, which the CSI drivers (also root) mount into.
USER 0:0
ENTRYPOINT ["/csi-volmgr"]
