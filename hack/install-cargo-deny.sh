#!/usr/bin/env bash
# Installs cargo-deny (from crates.io), which checks the dependency tree's licences,
# banned crates and sources against deny.toml, into ~/.cache/pgop/cargo-deny (outside the
# checkout), once. Idempotent: does nothing when the pinned version is already there.
#
#   hack/install-cargo-deny.sh
#   hack/check-dependencies.sh
#
# hack/check-dependencies.sh runs it (licences, bans, sources, and the advisories from an
# offline snapshot of the RustSec database).
set -euo pipefail
root=${PGOP_CACHE_DIR:-$HOME/.cache/pgop}/cargo-deny
# 0.20.2 needs rustc >= 1.88.
version=0.20.2
if [ -x "$root/bin/cargo-deny" ] && [ "$("$root/bin/cargo-deny" --version 2>/dev/null)" = "cargo-deny $version" ]; then
  echo "cargo-deny $version already installed in $root/bin"
  exit 0
fi
echo "installing cargo-deny $version into $root (cargo install, a few minutes once)"
# Its own target directory, removed afterwards, so that the build lands neither in the
# checkout nor in the workspace's target directory.
export CARGO_TARGET_DIR="$root/target"
# cargo-deny's own release profile links with fat LTO in one codegen unit: the build took
# 7 minutes of a cold CI run. A check of this tree's graph takes seconds either way, so
# its build is made quick instead: no LTO, 16 codegen units, no optimisation. Measured
# (session 32, idle machine): 66 CPU seconds to build and a 2 s check, against 147 and
# 1 s at opt-level 1.
CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
  CARGO_PROFILE_RELEASE_OPT_LEVEL=0 cargo install "cargo-deny@$version" --locked --root "$root"
rm -rf "$CARGO_TARGET_DIR"
