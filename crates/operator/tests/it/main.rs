//! The operator's integration tests, one module per subject, in one test binary (one link
//! of the dependency tree instead of one per file). `hack/run-tests.py` runs each module in
//! a process of its own, several at a time; `cargo test -p pgop-operator --test it --
//! MODULE::` runs one module. `common`: the helpers they share.

mod common;

mod cluster;
mod conversion;
mod helm_chart;
mod idempotence;
mod invalid_spec;
mod leader;
mod metrics;
mod olm_bundle;
mod rbac;
mod rbac_minimal;
mod selector;
mod webhook;
