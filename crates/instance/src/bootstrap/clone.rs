//! A standby's data directory: pg_basebackup from the primary, streaming WAL through this
//! instance's replication slot (created by the primary's manager). It must never leave a
//! partial copy that looks complete: the caller holds the bootstrap marker around it.

use super::{Error, run};
use crate::pg::{Binaries, RunAs, Upstream, binaries, sql};
use std::path::Path;

/// How long a copy waits for its slot to be free: the walsender of an interrupted copy
/// (its pg_basebackup killed) holds the slot until the primary notices the closed
/// connection.
const SLOT_BUSY_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Copies the primary into the (empty) PGDATA; retried while the slot is still active for
/// a previous, interrupted copy (pg_basebackup empties PGDATA when it fails).
pub async fn base_backup(
    binaries: &Binaries,
    run_as: Option<RunAs>,
    pgdata: &Path,
    upstream: &Upstream,
    instance: &str,
) -> Result<(), Error> {
    let start = std::time::Instant::now();
    loop {
        let mut cmd = binaries::command(binaries, "pg_basebackup", run_as);
        cmd.arg("--pgdata")
            .arg(pgdata)
            .arg("--dbname")
            .arg(upstream.conninfo_without_password(instance, None))
            .args(["--wal-method=stream", "--checkpoint=fast", "--no-password"])
            .arg("--slot")
            .arg(sql::slot_name(instance))
            .env("PGPASSWORD", &upstream.password);
        match run("pg_basebackup", cmd).await {
            Err(Error::RunProgram { ref stderr, .. })
                if slot_busy(stderr) && start.elapsed() < SLOT_BUSY_WAIT =>
            {
                tracing::info!(
                    instance,
                    "the replication slot is still held by an interrupted copy; retrying"
                );
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            result => return result.map(|_| ()),
        }
    }
}

/// Copies a replica cluster's source into the (empty) PGDATA: `conninfo` is the entry's
/// ([`crate::external::Source::conninfo`]: its password in its own password file, its
/// certificates named). No slot: the source is not pgop's to create one on; the copy
/// streams its WAL alongside, over a temporary slot of pg_basebackup's own.
pub async fn base_backup_from_source(
    binaries: &Binaries,
    run_as: Option<RunAs>,
    pgdata: &Path,
    conninfo: &str,
) -> Result<(), Error> {
    let mut cmd = binaries::command(binaries, "pg_basebackup", run_as);
    cmd.arg("--pgdata")
        .arg(pgdata)
        .arg("--dbname")
        .arg(conninfo)
        .args(["--wal-method=stream", "--checkpoint=fast", "--no-password"])
        // Whatever the environment says, only the entry's files.
        .env_remove("PGPASSWORD")
        .env_remove("PGPASSFILE")
        .env_remove("PGSERVICE")
        .env_remove("PGSSLMODE");
    run("pg_basebackup", cmd).await.map(|_| ())
}

fn slot_busy(stderr: &str) -> bool {
    stderr.contains("replication slot") && stderr.contains("is active for PID")
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_slot_held_by_another_walsender_is_recognised() {
        assert!(super::slot_busy(
            "pg_basebackup: error: could not send replication command \"START_REPLICATION\": \
             ERROR:  replication slot \"pgop_clone_2\" is active for PID 14843"
        ));
        assert!(!super::slot_busy(
            "pg_basebackup: error: connection to server failed"
        ));
    }
}
