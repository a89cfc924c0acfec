#!/usr/bin/env bash
# Builds pgop's container images without a Docker daemon, from Debian's packages:
#
#   pgop          images/Containerfile: the release binary, PostgreSQL 15 (Debian's) and
#                 PostgreSQL 18 (hack/install-postgres18.sh's build, relocated)
#   pgop-pause    images/pause/: the pod sandbox's pause process (our own, static C)
#   pgop-coredns  images/coredns/: CoreDNS, built by hack/install-testenv.sh
#
#   hack/build-images.sh             build what changed, print the archives
#   hack/build-images.sh --refresh   also rebuild the Debian base and re-run apt (updates)
#   hack/build-images.sh --next-version[=VERSION]
#                                    also build pgop:VERSION, the same sources compiled
#                                    with PGOP_VERSION=VERSION: a binary that reports
#                                    VERSION, for upgrade tests (default VERSION: the
#                                    workspace version with its patch number + 1, and
#                                    `-next`, e.g. 0.1.1-next)
#
# The base rootfs is made by mmdebstrap (bookworm, minbase) and imported as a local
# image; buildah builds images/Containerfile on it with --build-arg BASE=..., the same
# file `docker build` takes (docs/images.md). Output, all outside the checkout:
#
#   ${PGOP_IMAGES_DIR:-${PGOP_CACHE_DIR:-$HOME/.cache/pgop}/images}/
#     pgop-<version>-<commit>.oci.tar    docker.io/library/pgop:<version>{,-<commit>}
#     pgop-<next>-<commit>.oci.tar       docker.io/library/pgop:<next>{,-<commit>} (--next-version)
#     pgop-pause-<version>.oci.tar       docker.io/library/pgop-pause:<version>
#     pgop-coredns-<version>.oci.tar     docker.io/library/pgop-coredns:<coredns version>
#     images.env                         the archives and image names, for scripts/tests
#     storage/ run/ base/ ctx/ logs/     buildah's storage, the base rootfs, build contexts
#
# The archives are OCI layouts that `ctr -n k8s.io images import FILE` takes as they are:
# the image names are full references, so the kubelet finds `pgop:0.1.0` as
# docker.io/library/pgop:0.1.0. <commit> is `git rev-parse --short HEAD`, with `-dirty`
# when crates/, images/ or Cargo.{toml,lock} have uncommitted changes.
#
# Idempotent: the base is rebuilt only when its recipe changes, an image only when its
# inputs (binary's sha256, Containerfile, base image, tags) change; skips are printed.
# Needs root (buildah and mmdebstrap run rootful here); as root, missing tools are
# installed with apt-get. CARGO_TARGET_DIR defaults to ~/.cache/pgop/target.
# PGOP_IMAGE_PROFILE=dev builds the image with the debug binary (what the tests use).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source-path=SCRIPTDIR source=testenv-versions.env
. "$repo/hack/testenv-versions.env"

cache=${PGOP_CACHE_DIR:-$HOME/.cache/pgop}
out=${PGOP_IMAGES_DIR:-$cache/images}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$cache/target}
coredns_bin=${PGOP_TESTENV_BIN_DIR:-$cache/testenv/$KUBERNETES_VERSION/bin}/coredns
storage_driver=${PGOP_IMAGES_STORAGE_DRIVER:-overlay}
profile=${PGOP_IMAGE_PROFILE:-release}

refresh=false
next=
for arg in "$@"; do
  case $arg in
    --refresh) refresh=true ;;
    --next-version) next=default ;;
    --next-version=*) next=${arg#--next-version=} ;;
    -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-images: unknown argument $arg (see --help)" >&2; exit 2 ;;
  esac
done

t0=$SECONDS
log() { printf '[build-images %3ss] %s\n' "$((SECONDS - t0))" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# --- tools ------------------------------------------------------------------------------
[ "$(id -u)" = 0 ] || die "needs root: buildah and mmdebstrap run rootful here (sudo $0)"
need=()
for tool in buildah:buildah mmdebstrap:mmdebstrap gcc:gcc strip:binutils patchelf:patchelf \
  /usr/lib/x86_64-linux-gnu/libc.a:libc6-dev git:git; do
  t=${tool%%:*}
  if [[ $t == /* ]]; then [ -e "$t" ] || need+=("${tool#*:}"); else
    command -v "$t" >/dev/null || need+=("${tool#*:}"); fi
done
if [ ${#need[@]} -gt 0 ]; then
  command -v apt-get >/dev/null || die "missing: ${need[*]} (install them; Debian: apt-get install ${need[*]})"
  log "installing ${need[*]} (apt-get)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}" >&2
fi
command -v cargo >/dev/null || die "cargo is not installed (need Rust >= 1.89)"

mkdir -p "$out"/{base,ctx,logs,tmp}
# buildah's big temporary files go here, not to /var/tmp.
export TMPDIR=$out/tmp
B=(buildah --root "$out/storage" --runroot "$out/run" --storage-driver "$storage_driver")

version=$(awk -F'"' '/^\[workspace.package\]/{p=1; next} /^\[/{p=0} p && /^version *=/{print $2; exit}' "$repo/Cargo.toml")
[ -n "$version" ] || die "found no [workspace.package] version in Cargo.toml"
if [ "$next" = default ]; then
  IFS=. read -r major minor patch <<<"${version%%-*}"
  next=$major.$minor.$((patch + 1))-next
fi
# The version goes into an image tag and into the binary: semantic versions only.
if [ -n "$next" ]; then
  [[ $next =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.]+)?$ ]] && [ ${#next} -le 64 ] ||
    die "--next-version must be a version like 1.2.3 or 1.2.3-rc.1 (at most 64 characters), not '$next'"
  [ "$next" != "$version" ] || die "--next-version must differ from the workspace version $version"
fi
commit=$(git -C "$repo" rev-parse --short HEAD)
if [ -n "$(git -C "$repo" status --porcelain --untracked-files=no -- Cargo.toml Cargo.lock crates images)" ]; then
  commit=$commit-dirty
fi

sha() { sha256sum | cut -c1-64; }
image_id() { "${B[@]}" inspect --type image --format '{{.FromImageID}}' "$1" 2>/dev/null || true; }

# Runs a command with its output in logs/NAME.log; on failure shows the log's tail.
logged() {
  local name=$1
  shift
  if ! "$@" >"$out/logs/$name.log" 2>&1; then
    tail -n 40 "$out/logs/$name.log" >&2
    die "$name failed (whole log: $out/logs/$name.log)"
  fi
}

# Writes IMAGE to the OCI archive FILE under every name in NAMES..., atomically.
export_archive() {
  local image=$1 file=$2 layout name
  shift 2
  layout=$(mktemp -d "$out/tmp/layout.XXXXXX")
  for name in "$@"; do
    "${B[@]}" push --quiet "$image" "oci:$layout:$name" >/dev/null
  done
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 \
    -C "$layout" -cf "$file.tmp" oci-layout index.json blobs
  mv "$file.tmp" "$file"
  rm -rf "$layout"
}

# Prints an image's size and what takes its space, into REPORT and to stderr.
report() {
  local image=$1 file=$2 report=$3 ctr mnt
  ctr=$("${B[@]}" from --pull=never "$image")
  mnt=$("${B[@]}" mount "$ctr")
  {
    printf '%s: %s unpacked, archive %s (gzip layers)\n' "$image" \
      "$(du -sh --apparent-size "$mnt" | cut -f1)" "$(du -h --apparent-size "$file" | cut -f1)"
    printf '  largest directories and files (MB):\n'
    du -am --apparent-size --max-depth=4 "$mnt" | sort -rn | sed -n '2,11p' |
      sed "s|$mnt||; s|^|    |"
    if [ -s "$mnt/var/lib/dpkg/status" ]; then
      printf '  largest Debian packages (installed size, MB):\n'
      dpkg-query --admindir="$mnt/var/lib/dpkg" -W -f '${Installed-Size} ${Package}\n' |
        sort -rn | head -n 10 | awk '{printf "    %6.1f %s\n", $1/1024, $2}'
    fi
  } >"$report"
  "${B[@]}" umount "$ctr" >/dev/null
  "${B[@]}" rm "$ctr" >/dev/null
  cat "$report" >&2
}

# build NAME ARCHIVE INPUTS-KEY BUILD-FN NAMES...: runs BUILD-FN unless ARCHIVE exists and
# was made from the same inputs; then exports and reports.
build() {
  local name=$1 archive=$2 key=$3 fn=$4
  shift 4
  local stamp=$archive.inputs report=$archive.report
  if ! $refresh && [ -f "$archive" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$key" ] &&
    [ -n "$(image_id "$1")" ]; then
    log "$name: unchanged (inputs ${key:0:12}), skipped: $(basename "$archive")"
    [ -f "$report" ] && head -n 1 "$report" | sed 's/^/    /' >&2
    return
  fi
  local t=$SECONDS
  log "$name: building ($fn)"
  "$fn" "$@"
  export_archive "$1" "$archive" "$@"
  echo "$key" >"$stamp"
  log "$name: built in $((SECONDS - t))s: $archive"
  report "$1" "$archive" "$report"
}

bud() { # bud LOGNAME CONTEXT CONTAINERFILE [buildah bud args...]
  local logname=$1 context=$2 file=$3
  shift 3
  local extra=()
  $refresh && extra+=(--no-cache)
  logged "$logname" "${B[@]}" bud --layers --network host --pull=never \
    "${extra[@]}" -f "$file" "$@" "$context"
}

# --- the pgop binary --------------------------------------------------------------------
# PGOP_IMAGE_PROFILE=dev puts the debug build in instead of the release build: the test
# suite (hack/test.sh) does, because cargo test builds that binary anyway, while a release
# build from nothing takes about 25 minutes on 2 cores. Same Containerfile, same contents.
case $profile in
  release) cargo_profile=(--release) bin_dir=release ;;
  dev) cargo_profile=() bin_dir=debug ;;
  *) die "PGOP_IMAGE_PROFILE must be release or dev, not $profile" ;;
esac
# Stripped: symbols and debug info are half of an unstripped binary and no Pod needs them.
stage_binary() { # stage_binary CONTEXT-DIR
  mkdir -p "$1"
  strip -o "$1/pgop.tmp" "$CARGO_TARGET_DIR/$bin_dir/pgop"
  if cmp -s "$1/pgop.tmp" "$1/pgop"; then
    rm "$1/pgop.tmp" # keep the mtime: buildah's cache looks at content anyway
  else
    mv "$1/pgop.tmp" "$1/pgop"
  fi
}
# The next version first: PGOP_VERSION is read by the bin crate alone (option_env!), so
# cargo recompiles only that crate, twice (a few seconds each), and the binary left in the
# target directory is the ordinary one, which `cargo test` then finds up to date.
if [ -n "$next" ]; then
  log "cargo build ${cargo_profile[*]} -p pgop --locked with PGOP_VERSION=$next"
  t=$SECONDS
  (cd "$repo" && PGOP_VERSION=$next cargo build "${cargo_profile[@]}" -p pgop --locked --quiet)
  stage_binary "$out/ctx/pgop-next"
  log "pgop binary reporting $next ready in $((SECONDS - t))s"
fi
log "cargo build ${cargo_profile[*]} -p pgop --locked (CARGO_TARGET_DIR=$CARGO_TARGET_DIR)"
t=$SECONDS
(cd "$repo" && env -u PGOP_VERSION cargo build "${cargo_profile[@]}" -p pgop --locked --quiet)
log "pgop binary ($profile profile) ready in $((SECONDS - t))s"
stage_binary "$out/ctx/pgop"

# --- PostgreSQL 18 ----------------------------------------------------------------------
# Debian bookworm packages PostgreSQL 15 only; 18 is hack/install-postgres18.sh's build from
# Debian's source (installed here first when missing), copied into the build context as
# postgresql-18/ (bin, lib, share: no headers, no static libraries) and relocated to the
# image's /usr/lib/postgresql/18: every program's and library's run path becomes relative
# ($ORIGIN/../lib, $ORIGIN), so that each finds its own libpq and not Debian's (15's).
pg18_root=${PGOP_POSTGRES_ROOT:-/var/cache/pgop/postgresql}/18
# The script returns at once when its build is installed; else it builds (5 to 8 minutes).
logged install-postgres18 "$repo/hack/install-postgres18.sh"
pg18_version=$("$pg18_root/bin/postgres" --version)
stage_postgres18() { # stage_postgres18 CONTEXT-DIR
  local dir=$1/postgresql-18 stamp=$1/postgresql-18.stamp key
  key=$(printf '%s\n' "$pg18_version" "$(readlink -f "$pg18_root")" "$(sha <"${BASH_SOURCE[0]}")" | sha)
  if [ -d "$dir" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$key" ]; then
    return
  fi
  rm -rf "$dir" "$stamp"
  mkdir -p "$dir"
  cp -a "$pg18_root/bin" "$pg18_root/share" "$dir/"
  mkdir -p "$dir/lib"
  find "$pg18_root/lib" -maxdepth 1 -type f -name '*.so*' -exec cp -a {} "$dir/lib/" \;
  find "$pg18_root/lib" -maxdepth 1 -type l -name '*.so*' -exec cp -a {} "$dir/lib/" \;
  local f
  while IFS= read -r -d '' f; do
    if head -c 4 "$f" | grep -q 'ELF'; then
      strip --strip-unneeded "$f"
      case $f in
        "$dir"/bin/*) patchelf --set-rpath '$ORIGIN/../lib' "$f" ;;
        *) patchelf --set-rpath '$ORIGIN' "$f" ;;
      esac
    fi
  done < <(find "$dir/bin" "$dir/lib" -type f -print0)
  echo "$key" >"$stamp"
}
stage_postgres18 "$out/ctx/pgop"
[ -z "$next" ] || stage_postgres18 "$out/ctx/pgop-next"
# The staged tree's content, for the images' input keys.
tree_sha() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 sha256sum) | sha; }
pg18_sha=$(tree_sha "$out/ctx/pgop/postgresql-18")
log "PostgreSQL 18 staged: $pg18_version ($(du -sh --apparent-size "$out/ctx/pgop/postgresql-18" | cut -f1))"

# --- the Debian base --------------------------------------------------------------------
suite=bookworm
mirrors=(
  "deb http://deb.debian.org/debian $suite main"
  "deb http://deb.debian.org/debian $suite-updates main"
  "deb http://deb.debian.org/debian-security $suite-security main"
)
# What debian:bookworm-slim leaves out; images/Containerfile repeats it for that base.
dpkg_excludes=(
  'path-exclude=/usr/share/man/*'
  'path-exclude=/usr/share/doc/*'
  'path-include=/usr/share/doc/*/copyright'
  'path-exclude=/usr/share/info/*'
  'path-exclude=/usr/share/locale/*'
  'path-exclude=/usr/share/lintian/*'
)
mm_args=(--variant=minbase --format=tar --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
  --aptopt='APT::Install-Recommends "false"')
for x in "${dpkg_excludes[@]}"; do mm_args+=(--dpkgopt="$x"); done
base_key=$(printf '%s\n' "$suite" "${mirrors[@]}" "${mm_args[@]}" | sha)
base_tag=localhost/pgop-base:$suite-${base_key:0:12}
base_tar=$out/base/rootfs-$suite-${base_key:0:12}.tar
if ! $refresh && [ -n "$(image_id "$base_tag")" ]; then
  log "base: $base_tag unchanged (suite and package recipe), skipped"
else
  t=$SECONDS
  if $refresh || [ ! -f "$base_tar" ]; then
    log "base: mmdebstrap $suite minbase (a minute or two, downloads ~30 MB)"
    logged mmdebstrap mmdebstrap "${mm_args[@]}" "$suite" "$base_tar.tmp" "${mirrors[@]}"
    mv "$base_tar.tmp" "$base_tar"
  fi
  mkdir -p "$out/ctx/base"
  ln -f "$base_tar" "$out/ctx/base/rootfs.tar" 2>/dev/null || cp "$base_tar" "$out/ctx/base/rootfs.tar"
  printf '%s\n' 'FROM scratch' 'ADD rootfs.tar /' 'CMD ["/bin/bash"]' >"$out/ctx/base/Containerfile"
  bud base "$out/ctx/base" "$out/ctx/base/Containerfile" -t "$base_tag"
  rm -f "$out/ctx/base/rootfs.tar"
  log "base: $base_tag made in $((SECONDS - t))s ($(du -h --apparent-size "$base_tar" | cut -f1) rootfs)"
  # Older bases' rootfs tarballs are not needed once imported.
  find "$out/base" -name 'rootfs-*.tar' ! -path "$base_tar" -delete
fi
base_id=$(image_id "$base_tag")

# --- pgop -------------------------------------------------------------------------------
pgop_names=("docker.io/library/pgop:$version" "docker.io/library/pgop:$version-$commit")
pgop_archive=$out/pgop-$version-$commit.oci.tar
pgop_key=$(printf '%s\n' "$(sha <"$out/ctx/pgop/pgop")" "$(sha <"$repo/images/Containerfile")" \
  "$base_id" "$pg18_sha" "${pgop_names[@]}" | sha)
build_pgop() {
  bud pgop "$out/ctx/pgop" "$repo/images/Containerfile" --build-arg "BASE=$base_tag" \
    "${@/#/--tag=}"
}
build pgop "$pgop_archive" "$pgop_key" build_pgop "${pgop_names[@]}"

# --- pgop, the next version (--next-version) ---------------------------------------------
next_archive=
if [ -n "$next" ]; then
  next_names=("docker.io/library/pgop:$next" "docker.io/library/pgop:$next-$commit")
  next_archive=$out/pgop-$next-$commit.oci.tar
  next_key=$(printf '%s\n' "$(sha <"$out/ctx/pgop-next/pgop")" "$(sha <"$repo/images/Containerfile")" \
    "$base_id" "$pg18_sha" "${next_names[@]}" | sha)
  build_next() {
    bud pgop-next "$out/ctx/pgop-next" "$repo/images/Containerfile" --build-arg "BASE=$base_tag" \
      "${@/#/--tag=}"
  }
  build pgop-next "$next_archive" "$next_key" build_next "${next_names[@]}"
fi

# --- pause ------------------------------------------------------------------------------
pause_names=("docker.io/library/pgop-pause:$version")
pause_archive=$out/pgop-pause-$version.oci.tar
pause_key=$(printf '%s\n' "$(sha <"$repo/images/pause/pause.c")" \
  "$(sha <"$repo/images/pause/Containerfile")" "$(gcc --version | head -n1)" \
  "${pause_names[@]}" | sha)
build_pause() {
  mkdir -p "$out/ctx/pause"
  gcc -static -Os -s -Wall -Wextra -Werror -DPAUSE_VERSION="\"$version\"" \
    -o "$out/ctx/pause/pause" "$repo/images/pause/pause.c"
  bud pause "$out/ctx/pause" "$repo/images/pause/Containerfile" "${@/#/--tag=}"
}
build pause "$pause_archive" "$pause_key" build_pause "${pause_names[@]}"

# --- CoreDNS ----------------------------------------------------------------------------
coredns_names=("docker.io/library/pgop-coredns:$COREDNS_VERSION")
coredns_archive=$out/pgop-coredns-$COREDNS_VERSION.oci.tar
if [ -x "$coredns_bin" ]; then
  mkdir -p "$out/ctx/coredns"
  cmp -s "$coredns_bin" "$out/ctx/coredns/coredns" || cp "$coredns_bin" "$out/ctx/coredns/coredns"
  coredns_key=$(printf '%s\n' "$(sha <"$out/ctx/coredns/coredns")" \
    "$(sha <"$repo/images/coredns/Containerfile")" "${coredns_names[@]}" | sha)
  build_coredns() {
    bud coredns "$out/ctx/coredns" "$repo/images/coredns/Containerfile" "${@/#/--tag=}"
  }
  build coredns "$coredns_archive" "$coredns_key" build_coredns "${coredns_names[@]}"
else
  log "coredns: $coredns_bin is missing (hack/install-testenv.sh builds it): image skipped"
  coredns_archive=
fi

# --- keep the cache small ---------------------------------------------------------------
# The three newest pgop archives stay (others may be importing an older one).
for v in "$version" ${next:+"$next"}; do
  mapfile -t old < <(find "$out" -maxdepth 1 -name "pgop-$v-*.oci.tar" -printf '%T@ %p\n' |
    sort -rn | tail -n +4 | cut -d' ' -f2-)
  for f in "${old[@]}"; do rm -f "$f" "$f.inputs" "$f.report"; done
done
"${B[@]}" rmi --prune >/dev/null 2>&1 || true

{
  echo "# written by hack/build-images.sh; import with: ctr -n k8s.io images import FILE"
  echo "PGOP_IMAGE=${pgop_names[0]}"
  echo "PGOP_IMAGE_COMMIT=${pgop_names[1]}"
  echo "PGOP_IMAGE_ARCHIVE=$pgop_archive"
  echo "PGOP_IMAGE_PROFILE=$profile"
  if [ -n "$next" ]; then
    echo "PGOP_NEXT_VERSION=$next"
    echo "PGOP_NEXT_IMAGE=${next_names[0]}"
    echo "PGOP_NEXT_IMAGE_COMMIT=${next_names[1]}"
    echo "PGOP_NEXT_IMAGE_ARCHIVE=$next_archive"
  fi
  echo "PAUSE_IMAGE=${pause_names[0]}"
  echo "PAUSE_IMAGE_ARCHIVE=$pause_archive"
  if [ -n "$coredns_archive" ]; then
    echo "COREDNS_IMAGE=${coredns_names[0]}"
    echo "COREDNS_IMAGE_ARCHIVE=$coredns_archive"
  fi
} >"$out/images.env.tmp"
mv "$out/images.env.tmp" "$out/images.env"

log "done in $((SECONDS - t0))s; archives (ctr -n k8s.io images import FILE):"
for f in "$pgop_archive" ${next_archive:+"$next_archive"} "$pause_archive" ${coredns_archive:+"$coredns_archive"}; do
  printf '%s\n' "$f"
done
