//! `logical.rs` (logical backups and their restores) on PostgreSQL 18
//! (`hack/install-postgres18.sh`): the same scenarios compiled again in this module, with
//! `common::pg18` as their `pg`, which picks 18 (checked by `logical.rs`'s
//! `the_binaries_are_of_the_major_this_module_names`).

use crate::common::pg18 as pg;

#[allow(clippy::duplicate_mod)] // logical.rs again, on purpose
#[path = "logical.rs"]
mod scenarios;
