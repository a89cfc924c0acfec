#!/usr/bin/env bash
# Runs pgop's whole test suite: unit tests, and integration tests against a real
# Kubernetes control plane (built first by hack/install-testenv.sh if it is missing), and
# backup tests against a real S3 server (hack/install-s3-server.sh installs it).
#
#   hack/test.sh [extra cargo test arguments]
#
# It runs with --no-fail-fast: a failing test binary does not keep the others from
# running, and cargo names every failed target at the end.
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
# --no-fail-fast unless the caller already passed it (before any `--`): cargo refuses
# a flag given twice.
no_fail_fast=(--no-fail-fast)
for arg in "$@"; do
  [ "$arg" = -- ] && break
  [ "$arg" = --no-fail-fast ] && no_fail_fast=()
done
exec cargo test --workspace "${no_fail_fast[@]}" "$@"
