//! pgop's instance manager: bootstraps, configures, supervises, replicates and reports one
//! PostgreSQL instance. Everything PostgreSQL-facing works without Kubernetes ([`Instance`]
//! takes the desired role directly); `run` adds the PostgresCluster watch on top.

pub mod backups;
pub mod bootstrap;
pub mod config;
pub mod external;
pub mod http;
pub mod instance;
pub mod lease;
pub mod metrics;
pub mod pg;
pub mod pooler;
pub mod reaper;
pub mod relay;
pub mod role;
pub mod run;
pub mod status;
pub mod supervisor;
pub mod sync;
pub mod tls;
pub mod upgrade;

pub use bootstrap::{Credentials, DataState};
pub use config::{InvalidParameter, Layout, Mode};
pub use instance::{Archiving, BackupRefused, ConfigReport, Instance, Options, Recovery, Rejoin};
pub use pg::{Binaries, Endpoint, RunAs, Upstream};
pub use status::{PgRole, PgStatus};
pub use sync::SyncSpec;

pub use pgop_api::error_chain;
