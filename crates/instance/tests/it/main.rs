//! The instance manager's integration tests against real PostgreSQL (no Kubernetes), in one
//! test binary (one link of the dependency tree instead of one per file):
//! `postgres` (scenarios on 15) and `postgres18` (the same on 18), `pooler` (PgBouncer),
//! `external` (an entry of `spec.externalClusters` against a TLS-only server),
//! `upgrade` (pg_upgrade 15 to 18). `hack/run-tests.py` runs each module in a process of
//! its own; `cargo test -p pgop-instance --test it -- MODULE::` runs one module. The
//! reaper's tests change what belongs to the whole process and keep a binary of their own
//! (`tests/reaper.rs`).

mod external;
mod pooler;
mod postgres;
mod postgres18;
mod tls;
mod upgrade;
