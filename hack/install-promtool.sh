#!/usr/bin/env bash
# Installs promtool (Prometheus's rule checker and rule unit-test runner), built with Go
# from the Go module proxy, into ~/.cache/pgop/promtool (outside the checkout), once.
# Idempotent: does nothing when the pinned version is already there.
#
#   hack/install-promtool.sh
#   ~/.cache/pgop/promtool/bin/promtool test rules deploy/monitoring/tests/*.yaml
#
# crates/pgop/tests/it/monitoring_rules.rs finds it there (or through PGOP_PROMTOOL) and
# checks deploy/monitoring/prometheusrule.yaml with it. Needs Go (hack/test.sh's other
# builds need it too).
#
# Built with the tag remove_all_sd: Prometheus's service discoveries (the cloud SDKs) are
# left out, which pgop's uses (check rules, test rules) never reach. Measured on two shared
# cores, downloads included: 2 minutes and a 52 MB binary, against 10 minutes and 85 MB
# with them; about 1.8 GB of module and build caches meanwhile, removed afterwards.
set -euo pipefail
root=${PGOP_CACHE_DIR:-$HOME/.cache/pgop}/promtool
# The Go module version of a Prometheus 3 release (Prometheus tags v3.X.Y as v0.3XX.Y).
version=v0.316.0
tags=remove_all_sd
if [ -x "$root/bin/promtool" ] && [ "$(cat "$root/version" 2>/dev/null)" = "$version $tags" ]; then
  echo "promtool $version already installed in $root/bin"
  exit 0
fi
command -v go >/dev/null || { echo "install-promtool: Go is needed to build promtool (go install)" >&2; exit 1; }
echo "installing promtool (github.com/prometheus/prometheus $version) into $root (go install, a few minutes once)"
mkdir -p "$root"
rm -f "$root/version"
# The module and build caches of this build stay under $root, so that neither the
# checkout nor the user's Go caches are touched; both go afterwards (about 2 GB), leaving
# the binary.
export GOBIN="$root/bin" GOMODCACHE="$root/mod" GOCACHE="$root/go-build"
export GOFLAGS="-mod=mod -gcflags=all=-dwarf=false" GOTOOLCHAIN=local  # no debug information: -s -w drops it (hack/install-testenv.sh)
# Less garbage collection in the compiler and linker, as in hack/install-testenv.sh.
export GOGC=${GOGC:-400}
go install -trimpath -ldflags="-s -w" -tags "$tags" "github.com/prometheus/prometheus/cmd/promtool@$version"
go clean -modcache
rm -rf "$GOCACHE"
"$root/bin/promtool" --version >/dev/null
echo "$version $tags" >"$root/version"
echo "promtool $version installed in $root/bin"
