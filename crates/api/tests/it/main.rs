//! The API's integration tests (the CRDs against a real API server), one module per
//! subject, in one test binary. `hack/run-tests.py` runs each module in a process of its
//! own; `cargo test -p pgop-api --test it -- MODULE::` runs one module. `common`: the
//! helpers they share.

mod common;

mod crd_formats;
mod crd_validation;
mod crds_yaml;
