#!/usr/bin/env bash
# Installs cargo-deny (from crates.io), which checks the dependency tree's licences,
# banned crates and sources against deny.toml, into ~/.cache/pgop/cargo-deny (outside the
# checkout), once. Idempotent: does nothing when the pinned version is already there.
#
#   hack/install-cargo-deny.sh
#   ~/.cache/pgop/cargo-deny/bin/cargo-deny --locked check licenses bans sources
#
# Only licenses, bans and sources are checked (.ci/run): the advisories check needs the
# RustSec advisory database, which cargo-deny clones from GitHub, and CI cannot reach
# GitHub (docs/security.md, "Not done yet").
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
cargo install "cargo-deny@$version" --locked --root "$root"
rm -rf "$CARGO_TARGET_DIR"
