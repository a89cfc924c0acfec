//! `backup.rs` (base backups, WAL archiving, restores and PITR) on PostgreSQL 18
//! (`hack/install-postgres18.sh`): the same scenarios compiled again as this target, whose
//! name makes `common::pg::binaries` pick 18 (checked by `backup.rs`'s
//! `the_binaries_are_those_of_this_targets_major`).

#[path = "backup.rs"]
mod scenarios;
