#!/usr/bin/env bash
# make release VERSION=vX.Y.Z — see docs/operations.md, "Upgrades and rollbacks".
#
#  1. refuse unless VERSION is vX.Y.Z[-pre], the tree is clean, the tag is new and the branch is main
#     (RELEASE_BRANCH);
#  2. run the checks: make $RELEASE_CHECKS (default: test test-upgrade, what CI runs without e2e,
#     and the upgrade from the previous release);
#  3. move CHANGELOG's [Unreleased] under the version, set the image tag deploy/ names
#     (make deploy-image-tag), commit "Release vX.Y.Z" and tag it vX.Y.Z (annotated);
#  4. build the images from the tagged commit (make images IMAGE_TAG=vX.Y.Z VERSION=vX.Y.Z);
#  5. record the tag's commit in hack/release/previous, in a second commit: a commit cannot
#     name its own hash, so the file names the release from the commit after it.
#
# DRY_RUN=1 runs 1 and prints the rest without running the checks, changing a file, committing,
# tagging or building (the CHANGELOG and previous-release edits are printed). Nothing is pushed:
# push main and the tag yourself once you have looked at them.
set -euo pipefail

: "${VERSION:?make release VERSION=vX.Y.Z}"
: "${MAKE:=make}"
: "${GO:=go}"
: "${RELEASE_CHECKS:=test test-upgrade}"
: "${RELEASE_BRANCH:=main}"
DRY_RUN=${DRY_RUN:-}
TOOL=(${GO} run ./hack/release)

"${TOOL[@]}" check-version "${VERSION}"
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
  echo "release: the working tree has changes; commit or stash them first" >&2
  exit 1
fi
if git rev-parse -q --verify "refs/tags/${VERSION}" >/dev/null; then
  echo "release: tag ${VERSION} exists already" >&2
  exit 1
fi
branch=$(git rev-parse --abbrev-ref HEAD)
if [ "${branch}" != "${RELEASE_BRANCH}" ]; then
  echo "release: on branch ${branch}, not ${RELEASE_BRANCH} (RELEASE_BRANCH= to release from another)" >&2
  exit 1
fi

if [ -n "${DRY_RUN}" ]; then
  echo "== dry run: would run make ${RELEASE_CHECKS}"
  "${TOOL[@]}" changelog -file CHANGELOG.md -version "${VERSION}" -dry-run | sed -n '1,/^## \[[0-9]/p'
  echo "== would run: make deploy-image-tag IMAGE_TAG=${VERSION}; git commit -m 'Release ${VERSION}'; git tag -a ${VERSION}"
  echo "== would run: make images IMAGE_TAG=${VERSION} VERSION=${VERSION}"
  "${TOOL[@]}" set-previous -file hack/release/previous -commit "$(git rev-parse HEAD)" -version "${VERSION}" -dry-run
  echo "== (the commit above is today's HEAD; the real one is the release commit)"
  exit 0
fi

echo "== checks: make ${RELEASE_CHECKS}"
# shellcheck disable=SC2086 # RELEASE_CHECKS is a list of targets.
${MAKE} ${RELEASE_CHECKS}

echo "== CHANGELOG, image tag, release commit and tag ${VERSION}"
"${TOOL[@]}" changelog -file CHANGELOG.md -version "${VERSION}"
${MAKE} deploy-image-tag IMAGE_TAG="${VERSION}"
git add CHANGELOG.md deploy/base/kustomization.yaml deploy/helm/csi-volmgr/Chart.yaml
git commit -q -m "Release ${VERSION}"
git tag -a "${VERSION}" -m "csi-volmgr ${VERSION}"
release_commit=$(git rev-parse "${VERSION}^{commit}")

echo "== images of ${VERSION}"
${MAKE} images IMAGE_TAG="${VERSION}" VERSION="${VERSION}"

echo "== hack/release/previous names ${VERSION}"
"${TOOL[@]}" set-previous -file hack/release/previous -commit "${release_commit}" -version "${VERSION}"
git add hack/release/previous
git commit -q -m "hack/release/previous: ${VERSION} (${release_commit:0:12}) is the release make test-upgrade starts from"
echo "released ${VERSION} at ${release_commit}; images in bin/images. Push main and the tag: git push origin ${RELEASE_BRANCH} ${VERSION}"
