#!/usr/bin/env bash
# Builds the Go program in hack/NAME/ (its go.mod and go.sum are the pins) with Go from
# the Go module proxy into ~/.cache/pgop/NAME/bin/NAME (outside the checkout), once.
# Idempotent: does nothing when the binary was built from the same main.go, go.mod and
# go.sum. The build's module and build caches stay under ~/.cache/pgop/NAME and are
# removed afterwards, leaving the binary. Used by hack/install-bundle-validate.sh and
# hack/install-otlp-check.sh.
#
#   hack/build-go-tool.sh NAME PINNED-MODULE [CHECK]
#
# PINNED-MODULE is the module named in the log line; CHECK, a shell command run with the
# new binary's path as $1 that must succeed before the binary counts as installed.
set -euo pipefail
name=$1
pinned=$2
check=${3:-}
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/$name" && pwd)
root=${PGOP_CACHE_DIR:-$HOME/.cache/pgop}/$name
# The version is the source: a change of main.go, go.mod or go.sum rebuilds.
version=$(cat "$src/go.mod" "$src/go.sum" "$src/main.go" | sha256sum | cut -c1-16)
if [ -x "$root/bin/$name" ] && [ "$(cat "$root/version" 2>/dev/null)" = "$version" ]; then
  echo "$name $version already installed in $root/bin"
  exit 0
fi
command -v go >/dev/null || { echo "build-go-tool: Go is needed to build $name" >&2; exit 1; }
echo "installing $name ($(awk -v m="$pinned" '$1 == m { print $1 " " $2 } $1 == "require" && $2 == m { print $2 " " $3 }' "$src/go.mod")) into $root (go build, once)"
mkdir -p "$root/bin"
rm -f "$root/version"
export GOMODCACHE="$root/mod" GOCACHE="$root/go-build"
# -mod=readonly: go.mod and go.sum are the pins, and the build never rewrites them.
export GOFLAGS="-mod=readonly -gcflags=all=-dwarf=false" GOTOOLCHAIN=local  # no debug information: -s -w drops it (hack/install-testenv.sh)
# Less garbage collection in the compiler and linker, as in hack/install-testenv.sh.
export GOGC=${GOGC:-400}
(cd "$src" && go build -trimpath -ldflags="-s -w" -o "$root/bin/$name.tmp" .)
mv "$root/bin/$name.tmp" "$root/bin/$name"
go clean -modcache
rm -rf "$GOCACHE"
if [ -n "$check" ]; then
  bash -c "$check" _ "$root/bin/$name" >/dev/null
fi
echo "$version" >"$root/version"
echo "$name $version installed in $root/bin"
