//! Role changes, each on an explicit request (the operator's word through the cluster
//! status, or a test): promote a standby, rewind a former primary so it can follow the new
//! one, keep the primary's replication slots in step with the standbys. It must never
//! promote, demote or fence on its own initiative.

use crate::bootstrap;
use crate::pg::{Binaries, RunAs, Upstream, binaries, sql};
use std::path::Path;
use std::time::Duration;
use tokio_postgres::Client;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to promote")]
    Promote(#[source] tokio_postgres::Error),
    #[error("failed to promote: still in recovery after {0:?}")]
    PromoteTimeout(Duration),
    #[error("failed to rewind the data directory")]
    Rewind(#[source] bootstrap::Error),
    #[error("failed to manage replication slots")]
    ManageSlots(#[source] tokio_postgres::Error),
}

/// Promotes a standby and returns once it accepts writes and has checkpointed: pg_rewind of
/// the former primary reads the new timeline from the control file, which only the first
/// checkpoint after promotion updates.
pub async fn promote(client: &Client, timeout: Duration) -> Result<(), Error> {
    let wait_seconds = i32::try_from(timeout.as_secs().max(1)).unwrap_or(i32::MAX);
    client
        .query_one("SELECT pg_promote(true, $1)", &[&wait_seconds])
        .await
        .map_err(Error::Promote)?;
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let row = client
            .query_one("SELECT pg_is_in_recovery()", &[])
            .await
            .map_err(Error::Promote)?;
        let in_recovery: bool = row.try_get(0).map_err(Error::Promote)?;
        if !in_recovery {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::PromoteTimeout(timeout));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    client
        .batch_execute("CHECKPOINT")
        .await
        .map_err(Error::Promote)
}

/// Rewinds a stopped former primary onto the new primary's timeline. pg_rewind runs crash
/// recovery first when the server did not shut down cleanly (PostgreSQL 13 and later).
pub async fn rewind(
    binaries: &Binaries,
    run_as: Option<RunAs>,
    pgdata: &Path,
    upstream: &Upstream,
    instance: &str,
) -> Result<(), Error> {
    let mut cmd = binaries::command(binaries, "pg_rewind", run_as);
    cmd.arg("--target-pgdata")
        .arg(pgdata)
        .arg("--source-server")
        .arg(upstream.conninfo_without_password(instance, Some("postgres")))
        .env("PGPASSWORD", &upstream.password);
    bootstrap::run("pg_rewind", cmd)
        .await
        .map(|_| ())
        .map_err(Error::Rewind)
}

/// Creates a physical slot (reserving WAL now) for each standby, and drops pgop's slots of
/// instances that are gone. Slots in use are never dropped.
pub async fn ensure_slots(client: &Client, standbys: &[String]) -> Result<(), Error> {
    let wanted: Vec<String> = standbys.iter().map(|s| sql::slot_name(s)).collect();
    let rows = client
        .query(
            "SELECT slot_name::text, active FROM pg_replication_slots WHERE slot_type = 'physical'",
            &[],
        )
        .await
        .map_err(Error::ManageSlots)?;
    let mut existing = Vec::new();
    for row in rows {
        let name: String = row.try_get(0).map_err(Error::ManageSlots)?;
        let active: bool = row.try_get(1).map_err(Error::ManageSlots)?;
        if name.starts_with("pgop_") && !active && !wanted.contains(&name) {
            client
                .query("SELECT pg_drop_replication_slot($1)", &[&name])
                .await
                .map_err(Error::ManageSlots)?;
        }
        existing.push(name);
    }
    for slot in wanted.iter().filter(|s| !existing.contains(s)) {
        client
            .query(
                "SELECT pg_create_physical_replication_slot($1, true)",
                &[slot],
            )
            .await
            .map_err(Error::ManageSlots)?;
    }
    Ok(())
}
