//! A standby's data directory: pg_basebackup from the primary, streaming WAL through this
//! instance's replication slot (created by the primary's manager). It must never leave a
//! partial copy that looks complete: the caller holds the bootstrap marker around it.

use super::{Error, run};
use crate::pg::{Binaries, RunAs, Upstream, binaries, sql};
use std::path::Path;

/// Copies the primary into the (empty) PGDATA.
pub async fn base_backup(
    binaries: &Binaries,
    run_as: Option<RunAs>,
    pgdata: &Path,
    upstream: &Upstream,
    instance: &str,
) -> Result<(), Error> {
    let mut cmd = binaries::command(binaries, "pg_basebackup", run_as);
    cmd.arg("--pgdata")
        .arg(pgdata)
        .arg("--dbname")
        .arg(upstream.conninfo_without_password(instance, None))
        .args(["--wal-method=stream", "--checkpoint=fast", "--no-password"])
        .arg("--slot")
        .arg(sql::slot_name(instance))
        .env("PGPASSWORD", &upstream.password);
    run("pg_basebackup", cmd).await.map(|_| ())
}
