//! `/pg/status`: what the instance's PostgreSQL is doing, read over SQL. The JSON types are
//! the contract with the operator and live in `pgop_api::instance_status`; this module only
//! reads and must never change the server's state.
use tokio_postgres::Client;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to query the instance status")]
    QueryStatus(#[source] tokio_postgres::Error),
}

pub use pgop_api::instance_status::{
    ArchiveStatus, InvalidParameter, PgRole, PgStatus, SourceRefusal, StandbyReplication,
    UpstreamState, parse_lsn,
};

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
                    ARRAY(SELECT name FROM pg_settings WHERE pending_restart ORDER BY name),
                    ARRAY(SELECT s.name FROM pg_settings s
                          JOIN LATERAL (SELECT f.setting FROM pg_file_settings f
                                        WHERE f.name = s.name ORDER BY f.seqno DESC LIMIT 1) f ON true
                          WHERE s.pending_restart
                            AND s.name IN ('max_connections', 'max_worker_processes',
                                           'max_wal_senders', 'max_prepared_transactions',
                                           'max_locks_per_transaction')
                            AND f.setting ~ '^[0-9]+$'
                            AND f.setting::bigint < s.setting::bigint
                          ORDER BY s.name),
                    to_char(pg_postmaster_start_time() AT TIME ZONE 'UTC',
                            'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')",
            &[],
        )
        .await
        .map_err(e)?;
    let in_recovery: bool = row.try_get(0).map_err(e)?;
    let pending: Vec<String> = row.try_get(9).map_err(e)?;
    let decreases: Vec<String> = row.try_get(10).map_err(e)?;
    let mut status = PgStatus {
        instance: instance.to_string(),
        // Set by the manager (`Instance::status`), not by PostgreSQL.
        manager_version: None,
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
        pending_restart_decreases: decreases,
        applied_generation: None,
        invalid_parameters: Vec::new(),
        roles: Vec::new(),
        databases: Vec::new(),
        archiving: Some(archiving(client).await?),
        volume: None,
        wal_volume: None,
        bootstrap_error: None,
        postmaster_start_time: row.try_get(11).map_err(e)?,
        last_error: None,
        restart_refused: None,
        major_upgrade_error: None,
        down: None,
        upstream: None,
    };
    if in_recovery {
        status.upstream = Some(upstream(client).await?);
    }
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

/// How a server in recovery follows its upstream: its WAL receiver, the upstream's end of
/// WAL as last reported, and how far replay is behind it.
async fn upstream(client: &Client) -> Result<UpstreamState, Error> {
    let e = Error::QueryStatus;
    let row = client
        .query_one(
            "SELECT r.status, r.latest_end_lsn::text,
                    GREATEST(pg_wal_lsn_diff(r.latest_end_lsn, pg_last_wal_replay_lsn()), 0)::bigint,
                    CASE WHEN r.latest_end_lsn IS NULL THEN NULL
                         WHEN pg_last_wal_replay_lsn() >= r.latest_end_lsn THEN 0
                         ELSE EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp())
                    END::float8,
                    to_char(r.last_msg_receipt_time AT TIME ZONE 'UTC',
                            'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),
                    EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp())::float8
             FROM (SELECT 1) AS one LEFT JOIN pg_stat_wal_receiver AS r ON true",
            &[],
        )
        .await
        .map_err(e)?;
    Ok(UpstreamState {
        receiver: row.try_get(0).map_err(e)?,
        end_lsn: row.try_get(1).map_err(e)?,
        lag_bytes: row.try_get(2).map_err(e)?,
        lag_seconds: row.try_get(3).map_err(e)?,
        last_message_at: row.try_get(4).map_err(e)?,
        replayed_commit_age_seconds: row.try_get(5).map_err(e)?,
        restored_wal: None,
        restored_at: None,
        refusal: None,
    })
}

/// `pg_stat_archiver`, and whether archiving is configured.
pub async fn archiving(client: &Client) -> Result<ArchiveStatus, Error> {
    let e = Error::QueryStatus;
    let row = client
        .query_one(
            "SELECT current_setting('archive_mode') <> 'off' AND current_setting('archive_command') <> '',
                    archived_count, last_archived_wal,
                    to_char(last_archived_time AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),
                    failed_count, last_failed_wal,
                    to_char(last_failed_time AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),
                    last_failed_time IS NOT NULL
                      AND (last_archived_time IS NULL OR last_failed_time > last_archived_time)
             FROM pg_stat_archiver",
            &[],
        )
        .await
        .map_err(e)?;
    Ok(ArchiveStatus {
        configured: row.try_get(0).map_err(e)?,
        archived_count: row.try_get(1).map_err(e)?,
        last_archived_wal: row.try_get(2).map_err(e)?,
        last_archived_time: row.try_get(3).map_err(e)?,
        failed_count: row.try_get(4).map_err(e)?,
        last_failed_wal: row.try_get(5).map_err(e)?,
        last_failed_time: row.try_get(6).map_err(e)?,
        failing: row.try_get(7).map_err(e)?,
    })
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

    #[test]
    fn status_json_without_archiving_still_parses() {
        let old = r#"{"instance":"demo-1","role":"primary","running":true}"#;
        let status: PgStatus = serde_json::from_str(old).expect("old JSON");
        assert_eq!(status.archiving, None);
    }
}
