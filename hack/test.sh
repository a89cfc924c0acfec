#!/usr/bin/env bash
# Runs pgop's whole test suite: unit tests, integration tests against a real Kubernetes
# control plane (built first by hack/install-testenv.sh if it is missing), backup tests
# against a real S3 server (hack/install-s3-server.sh installs it), the alert rules' tests
# with promtool (hack/install-promtool.sh), the OLM bundle's with operator-sdk's validation
# library (hack/install-bundle-validate.sh), the exported traces with the OpenTelemetry
# collector's decoder (hack/install-otlp-check.sh), the kubectl plugin's krew packaging with krew
# (hack/install-krew.sh), and the real-node tier
# (containerd + kubelet + kube-proxy nodes running the images of hack/build-images.sh),
# on PostgreSQL 15 (Debian's packages) and 18 (hack/install-postgres18.sh).
# Missing Debian packages are installed by hack/install-packages.sh. Needs root.
#
#   hack/test.sh [extra cargo test arguments]
#
# It runs with --no-fail-fast: a failing test binary does not keep the others from
# running, and cargo names every failed target at the end.
#
# The Cargo target directory defaults to ~/.cache/pgop/target (outside the checkout,
# so clean clones reuse the build); set CARGO_TARGET_DIR to change it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The real-node tier runs containers (namespaces, cgroups, mounts): root only.
if [ "$(id -u)" != 0 ]; then
  echo "hack/test.sh needs root (the real-node tests run containerd, kubelets and runc): sudo hack/test.sh" >&2
  exit 1
fi
hack/install-packages.sh test
# PostgreSQL 18 (Debian bookworm packages 15): built once from Debian's source into
# /var/cache/pgop/postgresql/18 (several minutes the first time).
hack/install-postgres18.sh >/dev/null
hack/install-testenv.sh >/dev/null
# The backup tests start a real S3 server (s3s-fs), installed once into
# ~/.cache/pgop/s3s-fs (a few minutes the first time).
hack/install-s3-server.sh >/dev/null
# Four tools only one module each uses are not installed here: hack/run-tests.py installs
# the ones the selected modules need in the background at the lowest CPU priority, and
# starts each such module once its tool is there (on a machine without them, they build
# while the other tests run): promtool for the alert rules' tests (crates/pgop/tests/it/
# monitoring_rules.rs, hack/install-promtool.sh), operator-sdk's validation library for the
# OLM bundle's (crates/operator/tests/it/olm_bundle.rs, hack/install-bundle-validate.sh), the
# OpenTelemetry collector's OTLP/JSON decoder for the traces' (crates/pgop/tests/it/
# e2e_tracing.rs, hack/install-otlp-check.sh), and krew for the kubectl plugin's packaging
# (crates/pgop/tests/it/kubectl_krew.rs, hack/install-krew.sh).
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-${PGOP_CACHE_DIR:-$HOME/.cache/pgop}/target}
# The images the real-node tests import into their nodes (docs/images.md), with the
# debug build of pgop, which the tests build anyway (a release build from nothing takes
# about 25 minutes on 2 cores), and a second pgop image whose binary reports the next
# version, for the upgrade tests (e2e_real_upgrade).
PGOP_IMAGE_PROFILE=${PGOP_IMAGE_PROFILE:-dev} hack/build-images.sh --next-version >/dev/null
# The tests run three processes at a time, a module of an integration-test binary or a
# unit-test binary each (hack/run-tests.py: most wait on PostgreSQL, the API server and
# timers; at two the machine was busy 75% of the time), a real-node module counting as
# two; longest first; every process runs whatever the others do, and the failures are
# listed at the end as cargo lists them. PGOP_TEST_JOBS=1 runs them one after the other.
exec python3 hack/run-tests.py "$@"
