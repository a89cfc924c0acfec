#!/usr/bin/env bash
# Packages `kubectl pgop` for krew: a reproducible archive
# kubectl-pgop_<version>_linux_amd64.tar.gz holding the pgop binary as `kubectl-pgop` and
# a LICENSE note, and pgop.yaml, the krew plugin manifest for it (deploy/krew/pgop.yaml.in
# with the version, the download URI and the archive's sha256 filled in), both in
# ~/.cache/pgop/plugin (outside the checkout) or --out DIR.
#
#   hack/package-plugin.sh [--binary PATH | --profile release|dev] [--release-url URL]
#                          [--homepage URL] [--out DIR]
#
#   --binary PATH       package this pgop binary (Linux x86-64); else cargo builds one
#   --profile P         the cargo profile to build: release (the default) or dev
#   --release-url URL   where the archive will be published (the manifest's uri is
#                       URL/<archive name>); also PGOP_RELEASE_URL. pgop has no release
#                       location: without either, a placeholder under https://example.invalid
#                       is written, and such a manifest installs only with --archive
#   --homepage URL      the manifest's spec.homepage; also PGOP_HOMEPAGE; left out if unset
#   --out DIR           where to write both; also PGOP_PLUGIN_DIR
#
# Then: kubectl krew install --manifest=DIR/pgop.yaml --archive=DIR/<archive> (offline),
# or, once the archive is at URL, kubectl krew install --manifest=DIR/pgop.yaml.
# docs/kubectl.md, "Installing with krew"; tested by crates/pgop/tests/it/kubectl_krew.rs.
#
# The same binary gives the same archive, byte for byte (names sorted, fixed mtime, owner
# and modes, gzip without a name or time stamp), so its sha256 is stable.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

binary=
profile=release
release_url=${PGOP_RELEASE_URL:-}
homepage=${PGOP_HOMEPAGE:-}
out=${PGOP_PLUGIN_DIR:-${PGOP_CACHE_DIR:-$HOME/.cache/pgop}/plugin}
# usage STATUS: this header, without the shebang and the comment marks.
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}" >&2; exit "$1"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) binary=${2:?--binary needs a path}; shift 2 ;;
    --profile) profile=${2:?--profile needs release or dev}; shift 2 ;;
    --release-url) release_url=${2:?--release-url needs a URL}; shift 2 ;;
    --homepage) homepage=${2:?--homepage needs a URL}; shift 2 ;;
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "package-plugin: unknown argument $1" >&2; usage 2 ;;
  esac
done

if [ -z "$binary" ]; then
  case "$profile" in
    release) dir=release ;;
    dev) dir=debug ;;
    *) echo "package-plugin: --profile must be release or dev, not $profile" >&2; exit 2 ;;
  esac
  target=${CARGO_TARGET_DIR:-${PGOP_CACHE_DIR:-$HOME/.cache/pgop}/target}
  echo "building pgop ($profile profile) into $target" >&2
  (cd "$repo" && CARGO_TARGET_DIR="$target" cargo build --locked -p pgop --profile "$profile" >&2)
  binary=$target/$dir/pgop
fi
[ -f "$binary" ] && [ -x "$binary" ] || { echo "package-plugin: $binary is not an executable file" >&2; exit 1; }
# The manifest says linux/amd64: an ELF (7f 45 4c 46) for x86-64 (e_machine 0x3e).
elf=$(od -An -tx1 -N4 "$binary" | tr -d ' \n')
machine=$(od -An -tx1 -j18 -N2 "$binary" | tr -d ' \n')
if [ "$elf" != 7f454c46 ] || [ "$machine" != 3e00 ]; then
  echo "package-plugin: $binary is not a Linux x86-64 executable (the manifest's only platform is linux/amd64)" >&2
  exit 1
fi

# The version is the binary's own: `pgop --version` prints "pgop 0.1.0" ("kubectl pgop
# 0.1.0" when run as kubectl-pgop); krew wants a semantic version with a leading v.
said=$("$binary" --version 2>/dev/null | head -n1 || true)
version=${said##* }
if [[ ! "$said" =~ ^(kubectl\ )?pgop\  ]] || [[ ! "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.+-]+)?$ ]]; then
  echo "package-plugin: $binary --version said \"$said\", not \"pgop <semantic version>\": is it pgop?" >&2
  exit 1
fi
archive=kubectl-pgop_${version}_linux_amd64.tar.gz
placeholder=
if [ -z "$release_url" ]; then
  release_url=https://example.invalid/pgop/releases/v$version
  placeholder=1
fi
uri=${release_url%/}/$archive

license=$(sed -n 's/^license *= *"\(.*\)"$/\1/p' "$repo/Cargo.toml" | head -n1)
[ -n "$license" ] || { echo "package-plugin: no license in $repo/Cargo.toml" >&2; exit 1; }
case "$license" in
  Apache-2.0) license_url=https://www.apache.org/licenses/LICENSE-2.0 ;;
  *) license_url=https://spdx.org/licenses/$license.html ;;
esac

mkdir -p "$out"
stage=$(mktemp -d "${TMPDIR:-/tmp}/pgop-plugin.XXXXXX")
trap 'rm -rf "$stage"' EXIT
mkdir "$stage/archive"
cp "$binary" "$stage/archive/kubectl-pgop"
# The repository has no LICENSE file (only Cargo.toml's license field), so the archive
# carries a note naming the licence rather than a licence text of its own making.
cat >"$stage/archive/LICENSE" <<EOF
pgop (the kubectl-pgop binary in this archive) is licensed under the $license license
(SPDX identifier $license), as declared by its Cargo workspace (Cargo.toml,
[workspace.package] license). The licence text: $license_url

This note names the licence; it is not the licence text. The binary also contains
third-party Rust crates under their own licences (all allowed by the project's deny.toml).
EOF
chmod 0755 "$stage/archive/kubectl-pgop"
chmod 0644 "$stage/archive/LICENSE"
# Reproducible: the names in byte order (as --sort=name would), one fixed mtime, root:root
# by number, GNU format (no pax time records); gzip -n leaves out the name and time stamp.
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=gnu \
  -C "$stage/archive" -cf "$stage/archive.tar" LICENSE kubectl-pgop
gzip -n <"$stage/archive.tar" >"$stage/$archive"
sha256=$(sha256sum "$stage/$archive" | cut -d' ' -f1)

# sed_escape TEXT: TEXT for the replacement side of a s|...|...| command.
sed_escape() { printf '%s' "$1" | sed -e 's/[\\|&]/\\&/g'; }
# The manifest: the template without its comment lines, the fields filled in, and no
# homepage line when none was given.
{
  echo "# Generated by hack/package-plugin.sh from deploy/krew/pgop.yaml.in for $archive."
  sed -e '/^#/d' \
    -e "s|@VERSION@|v$version|" \
    -e "s|@URI@|$(sed_escape "$uri")|" \
    -e "s|@SHA256@|$sha256|" \
    -e "$(if [ -n "$homepage" ]; then echo "s|@HOMEPAGE@|$(sed_escape "$homepage")|"; else echo '/@HOMEPAGE@/d'; fi)" \
    "$repo/deploy/krew/pgop.yaml.in"
} >"$stage/pgop.yaml"
if grep -n '@[A-Z0-9]*@' "$stage/pgop.yaml" >&2; then
  echo "package-plugin: a placeholder of deploy/krew/pgop.yaml.in was left unfilled" >&2
  exit 1
fi
mv "$stage/$archive" "$out/$archive"
mv "$stage/pgop.yaml" "$out/pgop.yaml"

echo "archive:  $out/$archive" >&2
echo "sha256:   $sha256" >&2
echo "manifest: $out/pgop.yaml (uri $uri)" >&2
if [ -n "$placeholder" ]; then
  echo "the uri is a placeholder: set --release-url (or PGOP_RELEASE_URL) to where the archive is published;" >&2
  echo "until then install with: kubectl krew install --manifest=$out/pgop.yaml --archive=$out/$archive" >&2
fi
# stdout: the two paths, for scripts and tests.
echo "$out/$archive"
echo "$out/pgop.yaml"
