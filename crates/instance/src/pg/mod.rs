//! Talking to PostgreSQL: where its programs are, which OS user runs them, and SQL
//! connections over the Unix socket. Nothing here decides anything about roles or config.

pub mod binaries;
pub mod controldata;
pub mod sql;
pub mod timeline;
pub mod waldir;

pub use binaries::{Binaries, RunAs};
pub use controldata::ControlData;
pub use sql::{Endpoint, Upstream, UpstreamTls};
