//! pgop's integration tests, one module per subject, in one test binary (one link of the
//! dependency tree instead of one per file). `hack/run-tests.py` runs each module in a
//! process of its own, several at a time, as separate binaries ran before; `cargo test -p
//! pgop --test it -- MODULE::` runs one module.
//!
//! The helpers: `common` (a control plane, the local node and the in-process operator;
//! `common::pg` and `common::pg18`, PostgreSQL servers and the S3 server), `real` (real
//! nodes, pgop installed by its chart), `monitoring` (the published monitoring assets).

mod common;
mod monitoring;
mod real;

// The PostgreSQL helpers that backup.rs and logical.rs call `super::pg`: 15 for them here,
// 18 where backup18.rs and logical18.rs compile them again (`common::pg18`).
use common::pg;

mod backup;
mod backup18;
mod dev;
mod docs_commands;
mod e2e_api_upgrade;
mod e2e_backup;
mod e2e_cluster;
mod e2e_credentials;
mod e2e_databases;
mod e2e_failover;
mod e2e_lifecycle;
mod e2e_major_upgrade;
mod e2e_monitoring;
mod e2e_pooler;
mod e2e_postgres18;
mod e2e_real_backups;
mod e2e_real_faults;
mod e2e_real_kubectl;
mod e2e_real_nodes;
mod e2e_real_postgres18;
mod e2e_real_scheduling;
mod e2e_real_upgrade;
mod e2e_replica;
mod e2e_roles;
mod e2e_rollout;
mod e2e_tls;
mod e2e_tracing;
mod e2e_volumes;
mod e2e_wal_storage;
mod instance;
mod instance_rbac;
mod kubectl_krew;
mod kubectl_plugin;
mod lease;
mod logical;
mod logical18;
mod migrate_storage;
mod monitoring_rules;
mod operator_logs;
mod postgres_build18;
