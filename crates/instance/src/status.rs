//! `/pg/status`: what the instance's PostgreSQL is doing, read over SQL. The JSON types
//! (`PgStatus`, `PgRole`, `StandbyReplication`, `InvalidParameter`, `parse_lsn`) are the
//! contract with the operator and move to `crates/api` as they are; this module only reads
//! and must never change the server's state.

use serde::{Deserialize, Serialize};
use tokio_postgres::Client;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to query the instance status")]
    QueryStatus(#[source] tokio_postgres::Error),
}

/// A user parameter (or `pgHba` for the pg_hba rules) the server would not accept, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InvalidParameter {
    pub name: String,
    pub value: String,
    pub reason: String,
}

/// The role PostgreSQL runs in right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PgRole {
    /// Out of recovery: accepts writes.
    Primary,
    /// In recovery: a standby.
    Replica,
    /// Not running (stopped, fenced or starting).
    Stopped,
}

/// The instance's PostgreSQL status, served as JSON on `/pg/status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PgStatus {
    pub instance: String,
    pub role: PgRole,
    /// Whether PostgreSQL answers queries.
    pub running: bool,
    /// Whether the manager stopped PostgreSQL on purpose (fencing) and keeps it stopped.
    #[serde(default)]
    pub fenced: bool,
    #[serde(default)]
    pub in_recovery: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_identifier: Option<String>,
    /// Primary: `pg_current_wal_lsn()`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_lsn: Option<String>,
    /// Standby: the last LSN received and flushed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub received_lsn: Option<String>,
    /// Standby: the last LSN replayed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replayed_lsn: Option<String>,
    /// Standby: whether the WAL receiver streams from the primary.
    #[serde(default)]
    pub streaming: bool,
    /// Primary: one entry per connected standby.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replication: Vec<StandbyReplication>,
    #[serde(default)]
    pub pending_restart: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_restart_parameters: Vec<String>,
    /// User parameters refused by the last configuration (never written).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub invalid_parameters: Vec<InvalidParameter>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postgres_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postgres_version_num: Option<i32>,
}

/// One standby as the primary sees it (`pg_stat_replication`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StandbyReplication {
    pub application_name: String,
    pub state: String,
    /// `async`, `potential`, `sync` or `quorum`.
    pub sync_state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent_lsn: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flush_lsn: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_lsn: Option<String>,
    /// Bytes between the primary's current LSN and the standby's replayed LSN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_lag_bytes: Option<i64>,
    /// `pg_stat_replication.replay_lag` in seconds (unset while the standby is idle).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_lag_seconds: Option<f64>,
}

impl PgStatus {
    /// The status of an instance whose PostgreSQL does not answer.
    pub fn stopped(instance: &str, fenced: bool) -> Self {
        Self {
            instance: instance.to_string(),
            role: PgRole::Stopped,
            running: false,
            fenced,
            in_recovery: false,
            timeline: None,
            system_identifier: None,
            current_lsn: None,
            received_lsn: None,
            replayed_lsn: None,
            streaming: false,
            replication: Vec::new(),
            pending_restart: false,
            pending_restart_parameters: Vec::new(),
            invalid_parameters: Vec::new(),
            postgres_version: None,
            postgres_version_num: None,
        }
    }

    /// The LSN that orders standbys for a failover: the most WAL received (or written).
    pub fn wal_position(&self) -> Option<u64> {
        self.received_lsn
            .as_deref()
            .or(self.current_lsn.as_deref())
            .and_then(parse_lsn)
    }
}

/// `16/B374D848` as a number.
pub fn parse_lsn(lsn: &str) -> Option<u64> {
    let (hi, lo) = lsn.split_once('/')?;
    Some((u64::from_str_radix(hi, 16).ok()? << 32) | u64::from_str_radix(lo, 16).ok()?)
}

/// Reads the status of a running server.
pub async fn query(client: &Client, instance: &str) -> Result<PgStatus, Error> {
    let e = Error::QueryStatus;
    let row = client
        .query_one(
            "SELECT pg_is_in_recovery(),
                    (SELECT system_identifier::text FROM pg_control_system()),
                    current_setting('server_version'),
                    current_setting('server_version_num')::int,
                    CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_current_wal_lsn()::text END,
                    pg_last_wal_receive_lsn()::text,
                    pg_last_wal_replay_lsn()::text,
                    CASE WHEN pg_is_in_recovery()
                         THEN COALESCE((SELECT received_tli::bigint FROM pg_stat_wal_receiver),
                                       (SELECT timeline_id::bigint FROM pg_control_checkpoint()))
                         ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint
                    END,
                    COALESCE((SELECT status = 'streaming' FROM pg_stat_wal_receiver), false),
                    ARRAY(SELECT name FROM pg_settings WHERE pending_restart ORDER BY name)",
            &[],
        )
        .await
        .map_err(e)?;
    let in_recovery: bool = row.try_get(0).map_err(e)?;
    let pending: Vec<String> = row.try_get(9).map_err(e)?;
    let mut status = PgStatus {
        instance: instance.to_string(),
        role: if in_recovery {
            PgRole::Replica
        } else {
            PgRole::Primary
        },
        running: true,
        fenced: false,
        in_recovery,
        system_identifier: row.try_get(1).map_err(e)?,
        postgres_version: row.try_get(2).map_err(e)?,
        postgres_version_num: row.try_get(3).map_err(e)?,
        current_lsn: row.try_get(4).map_err(e)?,
        received_lsn: row.try_get(5).map_err(e)?,
        replayed_lsn: row.try_get(6).map_err(e)?,
        timeline: row.try_get(7).map_err(e)?,
        streaming: row.try_get(8).map_err(e)?,
        replication: Vec::new(),
        pending_restart: !pending.is_empty(),
        pending_restart_parameters: pending,
        invalid_parameters: Vec::new(),
    };
    if !in_recovery {
        let rows = client
            .query(
                "SELECT application_name, COALESCE(state, ''), COALESCE(sync_state, ''),
                        sent_lsn::text, flush_lsn::text, replay_lsn::text,
                        pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)::bigint,
                        EXTRACT(EPOCH FROM replay_lag)::float8
                 FROM pg_stat_replication ORDER BY application_name",
                &[],
            )
            .await
            .map_err(e)?;
        for row in rows {
            status.replication.push(StandbyReplication {
                application_name: row.try_get(0).map_err(e)?,
                state: row.try_get(1).map_err(e)?,
                sync_state: row.try_get(2).map_err(e)?,
                sent_lsn: row.try_get(3).map_err(e)?,
                flush_lsn: row.try_get(4).map_err(e)?,
                replay_lsn: row.try_get(5).map_err(e)?,
                replay_lag_bytes: row.try_get(6).map_err(e)?,
                replay_lag_seconds: row.try_get(7).map_err(e)?,
            });
        }
    }
    Ok(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lsns_order_numerically() {
        assert_eq!(parse_lsn("0/3000060"), Some(0x3000060));
        assert!(parse_lsn("1/0") > parse_lsn("0/FFFFFFFF"));
        assert_eq!(parse_lsn("nonsense"), None);
    }

    #[test]
    fn status_json_is_camel_case() {
        let json = serde_json::to_value(PgStatus::stopped("demo-1", true)).expect("json");
        assert_eq!(json["role"], "stopped");
        assert_eq!(json["fenced"], true);
        assert!(json.get("pendingRestart").is_some());
    }
}
