#!/usr/bin/env bash
# Runs pgop's whole test suite: unit tests, and integration tests against a real
# Kubernetes control plane (built first by hack/install-testenv.sh if it is missing), and
# backup tests against a real S3 server (hack/install-s3-server.sh installs it).
#
#   hack/test.sh [extra cargo test arguments]
#
# The Cargo target directory defaults to ~/.cache/pgop/target (outside the checkout,
# so clean clones reuse the build); set CARGO_TARGET_DIR to change it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

hack/install-testenv.sh >/dev/null
# The backup tests start a real S3 server (s3s-fs), installed once into
# ~/.cache/pgop/s3s-fs (a few minutes the first time).
hack/install-s3-server.sh >/dev/null
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-${PGOP_CACHE_DIR:-$HOME/.cache/pgop}/target}
exec cargo test --workspace "$@"
