//! `logical.rs` (logical backups and their restores) on PostgreSQL 18
//! (`hack/install-postgres18.sh`): the same scenarios compiled again as this target, whose
//! name makes `common::pg::binaries` pick 18 (checked by `logical.rs`'s
//! `the_binaries_are_those_of_this_targets_major`).

#[path = "logical.rs"]
mod scenarios;
