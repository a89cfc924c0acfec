#!/usr/bin/env bash
# Regenerates pgop's OLM bundle, bundle/, from the same sources as the chart (docs/olm.md):
#   bundle/manifests/pgop.clusterserviceversion.yaml
#       <- hack/olm/csv.yaml (descriptions, descriptors, install modes), with
#          the Deployment, its RBAC (as clusterPermissions) and the webhooks
#          (as webhookdefinitions) from `helm template` of charts/pgop with
#          webhook.certDir set to the directory OLM mounts its certificate in;
#          the version from Cargo.toml's [workspace.package]; minKubeVersion from
#          hack/testenv-versions.env; alm-examples from examples/; the CRDs' field
#          descriptions from charts/pgop/crds/crds.yaml
#   bundle/manifests/database.example.com_*.yaml <- charts/pgop/crds/crds.yaml (`pgop crd`),
#                                                   one file per CRD
#   bundle/manifests/pgop-operator-metrics_v1_service.yaml <- the chart's metrics Service
#   bundle/metadata/annotations.yaml, bundle/bundle.Dockerfile <- package pgop, channel candidate
#
#   hack/render-bundle.sh            regenerate bundle/
#   hack/render-bundle.sh --out DIR  render into DIR instead (crates/operator/tests/it/olm_bundle.rs
#                                    compares that with bundle/)
#
# No cargo: the CRDs are the chart's (hack/render-deploy.sh writes them from `pgop crd`).
# helm: $HELM, else the one hack/install-testenv.sh builds, else helm on PATH.
# python3 with PyYAML (import yaml) writes the files.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=testenv-versions.env
. "$root/hack/testenv-versions.env"

usage() { sed -n '2,22p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }

out=$root/bundle
case "${1:-}" in
  "") [ $# -eq 0 ] || usage ;;
  --out) [ $# -eq 2 ] || usage; out=$2 ;;
  *) usage ;;
esac

# shellcheck source=find-helm.sh
. "$root/hack/find-helm.sh"
find_helm render-bundle
if ! python3 -c 'import yaml' 2>/dev/null; then
  echo "render-bundle: python3 with PyYAML is needed (python3 -m pip install pyyaml)" >&2
  exit 1
fi

# The pgop version: [workspace.package] version in Cargo.toml.
version=$(awk '
  /^\[/ { section = $0; next }
  section == "[workspace.package]" && $1 == "version" { gsub(/"/, "", $3); print $3; exit }
' "$root/Cargo.toml")
[ -n "$version" ] || { echo "render-bundle: no version in Cargo.toml's [workspace.package]" >&2; exit 1; }
# minKubeVersion: the Kubernetes minor testenv runs, the one pgop is tested on.
kube_version=${KUBERNETES_VERSION%.*}.0

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# A namespace of its own, which render_bundle.py then refuses to find in the bundle: OLM
# installs into the namespace of its OperatorGroup.
namespace=pgop-bundle-render
"$helm" template pgop "$root/charts/pgop" --namespace "$namespace" \
  --set webhook.certDir=/tmp/k8s-webhook-server/serving-certs >"$work/chart.yaml"
python3 "$root/hack/olm/render_bundle.py" --root "$root" --helm "$work/chart.yaml" \
  --namespace "$namespace" --version "$version" --kube-version "$kube_version" --out "$work/bundle"

# Replace the output directory's generated files only when all of them were written.
mkdir -p "$out"
rm -rf "$out/manifests" "$out/metadata" "$out/bundle.Dockerfile"
cp -R "$work/bundle/." "$out/"
echo "render-bundle: wrote $out (pgop $version, minKubeVersion $kube_version)"
