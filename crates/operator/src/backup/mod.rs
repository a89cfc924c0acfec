//! Backups: the PostgresBackup controller, the cluster's schedule and the backup facts of
//! its status.

pub mod cluster;
pub mod controller;
pub mod schedule;
