#!/usr/bin/env bash
# Builds otlp-check (hack/otlp-check/: the OpenTelemetry collector's OTLP/JSON decoder,
# go.opentelemetry.io/collector/pdata, pinned in its go.mod) with Go from the Go module
# proxy into ~/.cache/pgop/otlp-check (outside the checkout), once (hack/build-go-tool.sh;
# about 30 s and a 4 MB binary).
#
#   hack/install-otlp-check.sh
#   ~/.cache/pgop/otlp-check/bin/otlp-check < export-request.json
#
# crates/pgop/tests/it/e2e_tracing.rs finds it there (or through PGOP_OTLP_CHECK) and passes
# every body pgop exported through it: the collector's own decoder must take them.
set -euo pipefail
exec "$(dirname "${BASH_SOURCE[0]}")/build-go-tool.sh" otlp-check \
  go.opentelemetry.io/collector/pdata 'echo "{}" | "$1"'
