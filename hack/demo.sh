#!/usr/bin/env bash
# pgop's local demo: builds the control plane if it is missing, then runs `pgop dev`
# (a real etcd, kube-apiserver, kube-controller-manager and kube-scheduler on loopback
# ports) until Ctrl-C. It prints the kubeconfig to use with kubectl.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

hack/install-packages.sh demo
hack/install-testenv.sh >/dev/null
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-${PGOP_CACHE_DIR:-$HOME/.cache/pgop}/target}
cargo build --quiet -p pgop
exec "$CARGO_TARGET_DIR/debug/pgop" dev "$@"
