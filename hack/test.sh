#!/usr/bin/env bash
# Runs pgop's whole test suite: unit tests, and integration tests against a real
# Kubernetes control plane (built first by hack/install-testenv.sh if it is missing).
#
#   hack/test.sh [extra cargo test arguments]
#
# The Cargo target directory defaults to ~/.cache/pgop/target (outside the checkout,
# so clean clones reuse the build); set CARGO_TARGET_DIR to change it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

hack/install-testenv.sh >/dev/null
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-${PGOP_CACHE_DIR:-$HOME/.cache/pgop}/target}
exec cargo test --workspace "$@"
