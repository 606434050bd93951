#!/usr/bin/env bash
# Regenerates go.mod/go.sum of the kube-apiserver wrapper module for one k8s.io/kubernetes release:
# every staging module that k/k resolves with "=> ./staging/src/..." is replaced by its published
# v0.X.Y tag, read from k/k's own go.mod on the module proxy.
set -euo pipefail
cd "$(dirname "$0")"
KUBE_VERSION="${1:?usage: pin.sh v1.X.Y}"
STAGING_VERSION="v0.${KUBE_VERSION#v1.}"
KK_GOMOD="$(go mod download -json "k8s.io/kubernetes@${KUBE_VERSION}" | sed -n 's/^\s*"GoMod": "\(.*\)",$/\1/p')"
rm -f go.mod go.sum
go mod init miles.local/tools/k8s/apiserver
go mod edit -go="$(sed -n 's/^go \(.*\)$/\1/p' "$KK_GOMOD")"
sed -n 's/^godebug \(.*\)$/\1/p' "$KK_GOMOD" | while read -r kv; do go mod edit -godebug="$kv"; done
for m in $(sed -n 's#^\s*\(k8s.io/[^ ]*\) => ./staging/src/.*#\1#p' "$KK_GOMOD"); do
  go mod edit -replace="${m}=${m}@${STAGING_VERSION}"
done
go get -tool "k8s.io/kubernetes/cmd/kube-apiserver@${KUBE_VERSION}"
go mod tidy
