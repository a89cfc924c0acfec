//! Backups: the PostgresBackup controller and the cluster's backup schedule.

pub mod schedule;
