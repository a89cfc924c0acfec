#!/usr/bin/env bash
# Makes room for a build of the whole suite before it starts, so that a machine whose
# caches have grown over many runs does not fail half-way with "No space left on device".
# .ci/run calls it; a developer can too.
#
#   hack/free-disk.sh [GIB]     (default: PGOP_DISK_NEED_GIB, or 30)
#
# It deletes only caches that a build recreates, cheapest first, and stops as soon as
# GIB GiB are free on the file system of ~/.cache/pgop:
#   1. Cargo's incremental-compilation state in every target directory under the cache
#      (CI builds each revision once, so it never pays for itself there);
#   2. the target directories under the cache other than the one in use
#      (CARGO_TARGET_DIR, default ~/.cache/pgop/target);
#   3. Go's build cache (the control-plane binaries already built are kept);
#   4. the target directory in use: the next build starts cold (about 15 minutes more).
# It never touches the checkout, the installed binaries, images or PostgreSQL.
set -euo pipefail

cache=${PGOP_CACHE_DIR:-$HOME/.cache/pgop}
target=${CARGO_TARGET_DIR:-$cache/target}
need=${1:-${PGOP_DISK_NEED_GIB:-30}}
case $need in '' | *[!0-9]*) echo "hack/free-disk.sh: GIB must be a whole number, got '$need'" >&2; exit 2 ;; esac
mkdir -p "$cache"

free_gib() { df -P -k "$cache" | awk 'NR == 2 { print int($4 / 1048576) }'; }
enough() { [ "$(free_gib)" -ge "$need" ]; }
report() { echo "free-disk: $(free_gib) GiB free on $(df -P "$cache" | awk 'NR == 2 { print $6 }') (want $need) $*"; }

report "before"
enough && exit 0

for t in "$cache"/target*; do
  [ -d "$t" ] || continue
  find "$t" -mindepth 2 -maxdepth 2 -name incremental -type d -exec rm -rf {} +
done
report "after removing incremental-compilation state"
enough && exit 0

# The real nodes' unpacked images (pgop_testenv::real_nodes::template): made again in
# seconds by the first test that starts nodes.
if [ -d "$cache/containerd-templates" ]; then
  rm -rf "$cache/containerd-templates"
  report "after removing the nodes' image templates"
  enough && exit 0
fi

for t in "$cache"/target*; do
  [ -d "$t" ] || continue
  [ "$(realpath "$t")" = "$(realpath -m "$target")" ] && continue
  rm -rf "$t"
  report "after removing $t"
  enough && exit 0
done

if command -v go >/dev/null; then
  go clean -cache
  report "after go clean -cache"
  enough && exit 0
fi

if [ -d "$target" ]; then
  rm -rf "$target"
  report "after removing the target directory in use ($target); this build starts cold"
  enough && exit 0
fi

df -h "$cache" /tmp
echo "free-disk: still less than $need GiB free after removing every cache it may remove; the build may run out of space" >&2
exit 0
