//! pgop's instance manager: bootstraps, configures, supervises, replicates and reports one
//! PostgreSQL instance. Everything PostgreSQL-facing works without Kubernetes ([`Instance`]
//! takes the desired role directly); `run` adds the PostgresCluster watch on top.

pub mod bootstrap;
pub mod config;
pub mod http;
pub mod instance;
pub mod pg;
pub mod reaper;
pub mod role;
pub mod run;
pub mod status;
pub mod supervisor;
pub mod sync;

pub use bootstrap::{Credentials, DataState};
pub use config::{InvalidParameter, Layout, Mode};
pub use instance::{ConfigReport, Instance, Options, Rejoin};
pub use pg::{Binaries, Endpoint, RunAs, Upstream};
pub use status::{PgRole, PgStatus};
pub use sync::SyncSpec;

/// "failed to X: failed to Y: cause" from an error and its sources.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut msg = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    msg
}
