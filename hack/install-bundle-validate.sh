#!/usr/bin/env bash
# Builds bundle-validate (hack/bundle-validate/: operator-sdk's bundle validation library,
# github.com/operator-framework/api, pinned in its go.mod) with Go from the Go module proxy
# into ~/.cache/pgop/bundle-validate (outside the checkout), once (hack/build-go-tool.sh).
#
#   hack/install-bundle-validate.sh
#   ~/.cache/pgop/bundle-validate/bin/bundle-validate --k8s-version 1.34 bundle/
#
# crates/operator/tests/it/olm_bundle.rs finds it there (or through PGOP_BUNDLE_VALIDATE)
# and checks bundle/ with it. Why not operator-sdk itself: the Go module proxy does not
# serve github.com/operator-framework/operator-sdk (docs/olm.md).
#
# Measured on two shared cores beside other builds, downloads included: 3 minutes and a
# 38 MB binary (docs/olm.md); the module and build caches (about 1.4 GB) are removed
# afterwards, leaving the binary.
set -euo pipefail
exec "$(dirname "${BASH_SOURCE[0]}")/build-go-tool.sh" bundle-validate \
  github.com/operator-framework/api '"$1" -h'
