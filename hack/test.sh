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
# The backup tests start a real S3 server (s3s-fs); without it they fail naming
# hack/install-s3-server.sh, which installs it into ~/.cache/pgop/s3s-fs.
cache=${PGOP_CACHE_DIR:-$HOME/.cache/pgop}
if [ -z "${PGOP_S3_SERVER:-}" ] && [ ! -x "$cache/s3s-fs/bin/s3s-fs" ] && ! command -v s3s-fs >/dev/null; then
  echo "hack/test.sh: the S3 server for the backup tests is missing; run hack/install-s3-server.sh" >&2
fi
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-${PGOP_CACHE_DIR:-$HOME/.cache/pgop}/target}
exec cargo test --workspace "$@"
