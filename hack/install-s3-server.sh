#!/usr/bin/env bash
# Installs the S3-compatible server the backup tests start on loopback (s3s-fs, from
# crates.io) into ~/.cache/pgop/s3s-fs (outside the checkout), once. Idempotent.
#
#   hack/install-s3-server.sh
#
# The tests find it there (or on PATH, or through PGOP_S3_SERVER).
set -euo pipefail
root=${PGOP_CACHE_DIR:-$HOME/.cache/pgop}/s3s-fs
version=0.14.1
if [ -x "$root/bin/s3s-fs" ] && "$root/bin/s3s-fs" --version 2>/dev/null | grep -q "$version"; then
  echo "s3s-fs $version already installed in $root/bin"
  exit 0
fi
echo "installing s3s-fs $version into $root (cargo install, a few minutes once)"
CARGO_TARGET_DIR="$root/target" cargo install "s3s-fs@$version" --features binary --locked --root "$root"
rm -rf "$root/target"
