#!/usr/bin/env bash
# Builds the real Kubernetes binaries that testenv runs from the Go module proxy: the control
# plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl) and, for the
# real-node tier, kubelet, kube-proxy, crictl, CoreDNS (with the plugins the nodes' Corefile
# uses: hack/coredns-minimal/main.go) and Helm.
#
#   hack/install-testenv.sh          build what is missing, print the bin directory
#
# Versions come from hack/testenv-versions.env. Binaries go to
#   ${PGOP_TESTENV_BIN_DIR:-${PGOP_CACHE_DIR:-$HOME/.cache/pgop}/testenv/<k8s-version>/bin}
# Idempotent: a binary that is already there (and prints the pinned version) is not rebuilt.
# Nothing is written inside the checkout.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=testenv-versions.env
. "$here/testenv-versions.env"

cache=${PGOP_CACHE_DIR:-$HOME/.cache/pgop}
bin=${PGOP_TESTENV_BIN_DIR:-$cache/testenv/$KUBERNETES_VERSION/bin}
work=$cache/testenv/build
mkdir -p "$bin" "$work"

# -dwarf=false: the compiler writes no debug information, which `-ldflags -s -w` (below) would
# drop at link time anyway; stack traces keep their files and lines (8% less CPU, measured
# on etcd: docs/testenv.md).
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=mod -gcflags=all=-dwarf=false"
# The compiler and linker collect garbage less often (the heap may grow to five times what
# is live instead of twice; a few GB at most here): 8% less CPU for these builds, 10% for
# the Kubernetes binaries (docs/testenv.md).
export GOGC=${GOGC:-400}
export GOPATH=${GOPATH:-$(go env GOPATH)}

log() { printf '[install-testenv %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

command -v go >/dev/null || { log "go is not installed (need Go >= 1.25; Debian: apt-get install golang, or https://go.dev/dl)"; exit 1; }

have() { # have NAME EXPECTED-SUBSTRING-OF-VERSION-OUTPUT
  local out
  [ -x "$bin/$1" ] || return 1
  out=$("$bin/$1" --version 2>&1 || "$bin/$1" version --client 2>&1 || true)
  [[ $out == *"$2"* ]]
}

# --- etcd -------------------------------------------------------------------------------
if have etcd "$ETCD_VERSION"; then
  log "etcd v$ETCD_VERSION already built"
else
  log "building etcd v$ETCD_VERSION (own throwaway module: go install refuses replace directives)"
  d=$work/etcd-$ETCD_VERSION
  rm -rf "$d" && mkdir -p "$d" && cd "$d"
  go mod init pgop.local/testenv-etcd >/dev/null 2>&1
  go get "go.etcd.io/etcd/server/v3@v$ETCD_VERSION"
  go build -trimpath -ldflags "-s -w" -o "$bin/etcd.tmp" go.etcd.io/etcd/server/v3
  mv "$bin/etcd.tmp" "$bin/etcd"
  log "etcd built: $("$bin/etcd" --version | head -1)"
fi

# --- Kubernetes -------------------------------------------------------------------------
k8s_cmds=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy)
missing=()
for c in "${k8s_cmds[@]}"; do
  have "$c" "v$KUBERNETES_VERSION" || missing+=("$c")
done
if [ ${#missing[@]} -eq 0 ]; then
  log "kubernetes v$KUBERNETES_VERSION already built"
else
  d=$work/kubernetes-$KUBERNETES_VERSION
  mkdir -p "$d" && cd "$d"
  if [ ! -f go.mod ] || ! grep -q "k8s.io/kubernetes v$KUBERNETES_VERSION" go.mod; then
    log "preparing a Go module for k8s.io/kubernetes v$KUBERNETES_VERSION"
    rm -f go.mod go.sum
    go mod init pgop.local/testenv-kubernetes >/dev/null 2>&1
    # k8s.io/kubernetes points its staging modules at ./staging/src/...; outside its own
    # repository those must be pinned to their published versions. The list is the set of
    # staging modules that the release's own go.mod requires and replaces (the two sample
    # modules, sample-cli-plugin and sample-controller, are not required and not published
    # for every release, so they are left out).
    modfile=$(go mod download -json "k8s.io/kubernetes@v$KUBERNETES_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
    [ -f "$modfile" ] || { log "could not download the go.mod of k8s.io/kubernetes v$KUBERNETES_VERSION"; exit 1; }
    staging=$(awk '/=> \.\/staging\/src\//{print $1}' "$modfile")
    required=$(awk '/^require \(/{r=1;next} r&&/^\)/{r=0} r{print $1}' "$modfile")
    n=0
    for m in $staging; do
      if grep -qx "$m" <<<"$required"; then
        go mod edit -replace "$m=$m@v$KUBERNETES_STAGING_VERSION"
        n=$((n + 1))
      fi
    done
    go mod edit -require "k8s.io/kubernetes@v$KUBERNETES_VERSION"
    log "pinned $n staging modules to v$KUBERNETES_STAGING_VERSION"
  fi
  log "resolving dependencies (downloads a few hundred MB into the Go module cache on a cold machine)"
  for c in "${k8s_cmds[@]}"; do
    go get "k8s.io/kubernetes/cmd/$c@v$KUBERNETES_VERSION"
  done
  # The same version stamps that Kubernetes' own hack/lib/version.sh sets.
  minor=$(cut -d. -f2 <<<"$KUBERNETES_VERSION")
  ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $p.gitVersion=v$KUBERNETES_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    ld+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  # One go build for all of them: the packages they share are compiled once and the
  # binaries linked side by side (one at a time, each link left a core idle).
  log "building ${missing[*]} v$KUBERNETES_VERSION (a cold build takes several minutes)"
  packages=()
  for c in "${missing[@]}"; do packages+=("k8s.io/kubernetes/cmd/$c"); done
  out=$bin/.build
  rm -rf "$out" && mkdir -p "$out"
  go build -trimpath -ldflags "$ld" -o "$out/" "${packages[@]}"
  for c in "${missing[@]}"; do mv "$out/$c" "$bin/$c"; done
  rmdir "$out"
  log "kubernetes built: $("$bin/kube-apiserver" --version)"
fi

# --- the real-node tier's other tools -----------------------------------------------------
# go_tool NAME VERSION MODULE PACKAGE [LDFLAGS]: builds PACKAGE of MODULE@vVERSION in its own
# throwaway module (so that each tool keeps its own dependency versions).
go_tool() {
  local name=$1 version=$2 module=$3 package=$4 ldflags=${5:-}
  local d=$work/$name-$version
  rm -rf "$d" && mkdir -p "$d" && cd "$d"
  go mod init "pgop.local/testenv-$name" >/dev/null 2>&1
  go get "$module@v$version"
  go build -trimpath -ldflags "-s -w $ldflags" -o "$bin/$name.tmp" "$package"
  mv "$bin/$name.tmp" "$bin/$name"
  printf '%s\n' "$version" >"$bin/.$name.version"
}
built() { [ -x "$bin/$1" ] && [ "$(cat "$bin/.$1.version" 2>/dev/null)" = "$2" ]; }

if built crictl "$CRI_TOOLS_VERSION"; then
  log "crictl v$CRI_TOOLS_VERSION already built"
else
  log "building crictl v$CRI_TOOLS_VERSION"
  go_tool crictl "$CRI_TOOLS_VERSION" sigs.k8s.io/cri-tools sigs.k8s.io/cri-tools/cmd/crictl \
    "-X sigs.k8s.io/cri-tools/pkg/version.Version=v$CRI_TOOLS_VERSION"
fi
# CoreDNS with the plugins the nodes' Corefile uses (hack/coredns-minimal/main.go).
if built coredns "$COREDNS_VERSION-minimal"; then
  log "coredns v$COREDNS_VERSION (minimal) already built"
else
  log "building coredns v$COREDNS_VERSION with the plugins of the nodes' Corefile"
  d=$work/coredns-$COREDNS_VERSION
  rm -rf "$d" && mkdir -p "$d" && cd "$d"
  go mod init pgop.local/testenv-coredns >/dev/null 2>&1
  cp "$here/coredns-minimal/main.go" .
  go get "github.com/coredns/coredns@v$COREDNS_VERSION"
  go mod tidy
  go build -trimpath -ldflags "-s -w" -o "$bin/coredns.tmp" .
  mv "$bin/coredns.tmp" "$bin/coredns"
  printf '%s\n' "$COREDNS_VERSION-minimal" >"$bin/.coredns.version"
fi
if built helm "$HELM_VERSION"; then
  log "helm v$HELM_VERSION already built"
else
  log "building helm v$HELM_VERSION"
  go_tool helm "$HELM_VERSION" helm.sh/helm/v3 helm.sh/helm/v3/cmd/helm \
    "-X helm.sh/helm/v3/internal/version.version=v$HELM_VERSION"
fi

echo "$bin"
