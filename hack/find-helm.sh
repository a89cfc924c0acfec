# Sourced by hack/render-deploy.sh and hack/render-bundle.sh (after testenv-versions.env):
# find_helm SCRIPT sets $helm to $HELM, else the helm hack/install-testenv.sh builds, else
# helm on the PATH; otherwise it stops naming SCRIPT and the command that builds it.
find_helm() {
  helm=${HELM:-}
  [ -n "$helm" ] && return
  local bin=${PGOP_TESTENV_BIN_DIR:-${PGOP_CACHE_DIR:-$HOME/.cache/pgop}/testenv/$KUBERNETES_VERSION/bin}
  if [ -x "$bin/helm" ]; then
    helm=$bin/helm
  elif command -v helm >/dev/null; then
    helm=$(command -v helm)
  else
    echo "$1: helm not found in $bin or on PATH; build it with hack/install-testenv.sh (or set HELM)" >&2
    exit 1
  fi
}
