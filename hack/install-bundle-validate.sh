#!/usr/bin/env bash
# Builds bundle-validate (hack/bundle-validate/: operator-sdk's bundle validation library,
# github.com/operator-framework/api, pinned in its go.mod) with Go from the Go module proxy
# into ~/.cache/pgop/bundle-validate (outside the checkout), once.
# Idempotent: does nothing when the binary was built from the same source and go.sum.
#
#   hack/install-bundle-validate.sh
#   ~/.cache/pgop/bundle-validate/bin/bundle-validate --k8s-version 1.34 bundle/
#
# crates/operator/tests/olm_bundle.rs finds it there (or through PGOP_BUNDLE_VALIDATE)
# and checks bundle/ with it. Why not operator-sdk itself: the Go module proxy does not
# serve github.com/operator-framework/operator-sdk (docs/olm.md).
#
# Measured on two shared cores beside other builds, downloads included: 3 minutes and a
# 38 MB binary (docs/olm.md); the module and build caches (about 1.4 GB) are removed
# afterwards, leaving the binary.
set -euo pipefail
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/bundle-validate" && pwd)
root=${PGOP_CACHE_DIR:-$HOME/.cache/pgop}/bundle-validate
# The version is the source: a change of main.go, go.mod or go.sum rebuilds.
version=$(cat "$src/go.mod" "$src/go.sum" "$src/main.go" | sha256sum | cut -c1-16)
if [ -x "$root/bin/bundle-validate" ] && [ "$(cat "$root/version" 2>/dev/null)" = "$version" ]; then
  echo "bundle-validate $version already installed in $root/bin"
  exit 0
fi
command -v go >/dev/null || { echo "install-bundle-validate: Go is needed to build bundle-validate" >&2; exit 1; }
echo "installing bundle-validate ($(awk '$1 == "github.com/operator-framework/api" { print $1 " " $2 }' "$src/go.mod")) into $root (go build, a few minutes once)"
mkdir -p "$root/bin"
rm -f "$root/version"
# The module and build caches of this build stay under $root, so that neither the
# checkout nor the user's Go caches are touched; both go afterwards.
export GOMODCACHE="$root/mod" GOCACHE="$root/go-build"
# -mod=readonly: go.mod and go.sum are the pins, and the build never rewrites them.
export GOFLAGS=-mod=readonly GOTOOLCHAIN=local
(cd "$src" && go build -trimpath -ldflags="-s -w" -o "$root/bin/bundle-validate.tmp" .)
mv "$root/bin/bundle-validate.tmp" "$root/bin/bundle-validate"
go clean -modcache
rm -rf "$GOCACHE"
"$root/bin/bundle-validate" -h >/dev/null 2>&1
echo "$version" >"$root/version"
echo "bundle-validate $version installed in $root/bin"
