#!/usr/bin/env bash
# Installs krew (the kubectl plugin manager) and validate-krew-manifest (krew's manifest
# checker), built with Go from the Go module proxy, into ~/.cache/pgop/krew (outside the
# checkout), once. Idempotent: does nothing when the pinned version is already there.
#
#   hack/install-krew.sh
#   ~/.cache/pgop/krew/bin/validate-krew-manifest -manifest pgop.yaml
#   KREW_ROOT=$(mktemp -d) ~/.cache/pgop/krew/bin/krew install --manifest=pgop.yaml --archive=ARCHIVE
#
# crates/pgop/tests/it/kubectl_krew.rs finds them there (or through PGOP_KREW and
# PGOP_VALIDATE_KREW_MANIFEST) and installs the archive and manifest of
# hack/package-plugin.sh with them (docs/kubectl.md, "Installing with krew").
# Needs Go (hack/test.sh's other builds need it too).
#
# sigs.k8s.io/krew v0.4.4: the Go module proxy refuses v0.4.5. Measured on two shared
# cores, from nothing, downloads included: 64 seconds, binaries of 13 MB (krew) and 8 MB;
# the module and build caches are removed afterwards, leaving the two binaries.
set -euo pipefail
root=${PGOP_CACHE_DIR:-$HOME/.cache/pgop}/krew
version=v0.4.4
if [ -x "$root/bin/krew" ] && [ -x "$root/bin/validate-krew-manifest" ] &&
  [ "$(cat "$root/version" 2>/dev/null)" = "$version" ]; then
  echo "krew $version already installed in $root/bin"
  exit 0
fi
command -v go >/dev/null || { echo "install-krew: Go is needed to build krew (go install)" >&2; exit 1; }
echo "installing krew and validate-krew-manifest (sigs.k8s.io/krew $version) into $root (go install, a few minutes once)"
mkdir -p "$root"
rm -f "$root/version"
# The module and build caches of this build stay under $root, so that neither the
# checkout nor the user's Go caches are touched; both go afterwards, leaving the binaries.
export GOBIN="$root/bin" GOMODCACHE="$root/mod" GOCACHE="$root/go-build"
export GOFLAGS="-mod=mod -gcflags=all=-dwarf=false" GOTOOLCHAIN=local  # no debug information: -s -w drops it (hack/install-testenv.sh)
# Less garbage collection in the compiler and linker, as in hack/install-testenv.sh.
export GOGC=${GOGC:-400}
# Without the release build's version stamp (-X .../internal/version.gitTag), on purpose:
# krew then counts as a development build and never runs its upgrade check, which asks
# GitHub for the latest release (KREW_NO_UPGRADE_CHECK turns it off too, but
# validate-krew-manifest runs krew with an environment of its own, without it). So
# `krew version` says "unknown"; $root/version says which krew this is.
go install -trimpath -ldflags="-s -w" \
  "sigs.k8s.io/krew/cmd/krew@$version" \
  "sigs.k8s.io/krew/cmd/validate-krew-manifest@$version"
go clean -modcache
rm -rf "$GOCACHE"
# `krew version` in a throwaway KREW_ROOT (krew creates its directories in it), with no
# upgrade check (which would ask GitHub), its bin directory on the PATH (else krew warns).
check=$(mktemp -d)
KREW_ROOT="$check" KREW_NO_UPGRADE_CHECK=1 PATH="$check/bin:$PATH" "$root/bin/krew" version >/dev/null
rm -rf "$check"
test -x "$root/bin/validate-krew-manifest"
echo "$version" >"$root/version"
echo "krew $version installed in $root/bin"
