//! `backup.rs` (base backups, WAL archiving, restores and PITR) on PostgreSQL 18
//! (`hack/install-postgres18.sh`): the same scenarios compiled again in this module, with
//! `common::pg18` as their `pg`, which picks 18 (checked by `backup.rs`'s
//! `the_binaries_are_of_the_major_this_module_names`).

use crate::common::pg18 as pg;

#[allow(clippy::duplicate_mod)] // backup.rs again, on purpose
#[path = "backup.rs"]
mod scenarios;
