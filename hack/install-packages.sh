#!/usr/bin/env bash
# Installs the Debian packages pgop's demo and tests need, when they are missing.
#
#   hack/install-packages.sh demo    PostgreSQL 15 and PgBouncer (the local node runs them)
#   hack/install-packages.sh test    that, plus the real-node tier: containerd, runc, the
#                                    CNI plugins, iptables, conntrack, nftables, and buildah,
#                                    mmdebstrap and umoci to build images
#
# Needs root to install (apt-get); when something is missing and this is not root, it
# stops at once and names the one command to run.
set -euo pipefail

what=${1:-test}
pkgs=(ca-certificates python3 postgresql-15 postgresql-contrib pgbouncer)
case $what in
  demo) ;;
  test)
    pkgs+=(containerd runc containernetworking-plugins iptables iproute2 conntrack util-linux nftables
      buildah umoci mmdebstrap gcc libc6-dev binutils git
      # hack/render-bundle.sh (the OLM bundle's test renders it) reads YAML with PyYAML.
      python3-yaml)
    ;;
  *) echo "usage: $0 demo|test" >&2; exit 2 ;;
esac

need=()
for pkg in "${pkgs[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "missing Debian packages; run: sudo apt-get install -y ${need[*]}" >&2
  exit 1
fi
echo "[install-packages] apt-get install ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
