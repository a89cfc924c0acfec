//! Scenarios against real PostgreSQL servers on loopback ports (no Kubernetes): each test
//! names what a user would notice, and leaves no server or directory behind.
//!
//! Nothing here may change process-wide state: these tests run in parallel threads of one
//! process. The reaper's tests (a child subreaper, a reaper `waitpid`ing every
//! unregistered child of the process) have their own binary, `tests/reaper.rs`.
//! `postgres18` runs the same scenarios on PostgreSQL 18.

mod bootstrap;
pub mod common;
mod config;
mod durability;
mod failover;
mod metrics;
mod rejoin;
mod replication;
