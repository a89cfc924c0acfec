//! Backups end to end: a real API server, the operator, the local node, real PostgreSQL and
//! a real S3 server (`s3s-fs`). A cluster with base and logical schedules every minute
//! produces PostgresBackups (base ones taken on a standby, logical ones on the primary),
//! `lastBackupTime` and `lastLogicalBackupTime`; a second cluster bootstraps from the first
//! one's backup to a point in time between two transactions; the store going down shows as
//! ContinuousArchiving=False, and once it is back the archive catches up without a gap.

use crate::common;

use common::*;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use pgop_api::backup::{BackupMethod, BackupPhase, PostgresBackup};
use pgop_api::conditions;
use pgop_testenv::s3::{ACCESS_KEY, BUCKET, S3Server, SECRET_KEY};
use serde_json::json;
use std::time::Duration;

fn store(endpoint: &str) -> serde_json::Value {
    json!({"s3": {
        "bucket": BUCKET, "endpoint": endpoint, "region": "us-east-1", "path": "e2e",
        "credentialsSecret": {"name": "s3"},
    }})
}

async fn completed_backups(env: &Env, cluster: &str) -> Result<Vec<PostgresBackup>> {
    Ok(completed(env, cluster)
        .await?
        .into_iter()
        .filter(|b| b.spec.method.unwrap_or_default() == BackupMethod::BaseBackup)
        .collect())
}

async fn completed(env: &Env, cluster: &str) -> Result<Vec<PostgresBackup>> {
    let api: Api<PostgresBackup> = Api::namespaced(env.client.clone(), env.n());
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|b| b.spec.cluster.name == cluster)
        .filter(|b| b.status.as_ref().and_then(|s| s.phase) == Some(BackupPhase::Completed))
        .collect())
}

#[tokio::test]
async fn e2e_scheduled_backups_and_a_point_in_time_restore_into_a_new_cluster() -> Result {
    let _serial = SERIAL.lock().await;
    let env = start("backup").await?;
    let dir = env.plane.dir().join("s3-test");
    let s3 = S3Server::start(&dir)?;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "s3"},
        "stringData": {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY},
    }))?;
    Api::<Secret>::namespaced(env.client.clone(), env.n())
        .create(&PostParams::default(), &secret)
        .await?;

    env.create(
        "src",
        // archive_timeout 5s: a WAL file reaches the store at most 5 s after a commit.
        json!({"replicas": 2, "storage": {"size": "1Gi"},
               "postgresql": {"parameters": {"archive_timeout": "5s"}},
               "backup": {"schedule": "* * * * *", "logicalSchedule": "* * * * *",
                          "retentionDays": 7, "store": store(&s3.endpoint())}}),
    )
    .await?;
    env.wait_ready("src", 2).await?;
    let password = env.password("src").await?;
    write_through_rw(
        &env,
        "src",
        &password,
        "create table t(id int primary key, at timestamptz default now())",
    )
    .await?;
    env.wait_cluster("src", "WAL archived", TIMEOUT, |s| {
        conditions::is_true(&s.conditions, conditions::CONTINUOUS_ARCHIVING)
    })
    .await?;

    // The schedule fires within a minute; the backup is taken on the standby.
    let src = env
        .wait_cluster(
            "src",
            "a completed scheduled backup",
            Duration::from_secs(240),
            |s| {
                s.last_backup_time.is_some()
                    && s.last_logical_backup_time.is_some()
                    && conditions::is_true(&s.conditions, conditions::BACKUP_SUCCEEDED)
            },
        )
        .await?;
    let status = src.status.ok_or("no status")?;
    // A base backup goes to a ready standby, and to the primary only while no standby is
    // ready and streaming in the status (a probe that timed out on a loaded machine, say):
    // one of the scheduled backups (one a minute) is taken on the standby.
    let primary = status.current_primary.clone();
    let first = eventually(
        "a completed scheduled base backup taken on the standby",
        Duration::from_secs(240),
        || {
            let (env, primary) = (&env, &primary);
            async move {
                completed_backups(env, "src")
                    .await
                    .ok()?
                    .into_iter()
                    .find(|b| b.status.as_ref().is_some_and(|s| s.instance != *primary))
            }
        },
    )
    .await;
    let first = &first;
    let bs = first.status.clone().unwrap_or_default();
    assert!(
        bs.backup_id.is_some() && bs.begin_lsn.is_some() && bs.end_lsn.is_some(),
        "{bs:?}"
    );
    assert!(bs.instance.is_some(), "taken on an instance: {bs:?}");
    assert!(
        first
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(pgop_api::constants::ANNOTATION_SCHEDULED))
    );
    // The logical backup: pg_dump on the primary, every database listed.
    let logical = completed(&env, "src")
        .await?
        .into_iter()
        .find(|b| b.spec.method == Some(BackupMethod::Logical))
        .ok_or("no completed logical backup")?;
    let ls = logical.status.clone().unwrap_or_default();
    assert!(
        logical.name_any().starts_with("src-logical-"),
        "{}",
        logical.name_any()
    );
    assert!(
        ls.databases.iter().any(|d| d == "app") && ls.databases.iter().any(|d| d == "postgres"),
        "{ls:?}"
    );
    assert!(
        ls.backup_id.is_some() && ls.size_bytes.unwrap_or(0) > 0,
        "{ls:?}"
    );

    // Two transactions with a point in time between them, both archived.
    let primary_ip = env.pod_ip(&env.current_primary("src").await?).await?;
    let db = connect(&primary_ip, &password).await?;
    db.batch_execute("insert into t(id) select generate_series(1, 100)")
        .await?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let between: String = db
        .query_one(
            "select to_char(now() at time zone 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')",
            &[],
        )
        .await?
        .get(0);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    db.batch_execute("insert into t(id) select generate_series(101, 150)")
        .await?;
    // The application user may not switch WAL files; archive_timeout does it.
    let segment: String = db
        .query_one("select pg_walfile_name(pg_current_wal_lsn())", &[])
        .await?
        .get(0);
    wait_archived(&db, &segment).await?;

    // A new cluster from that backup, to the point in time: exactly the first 100 rows.
    env.create(
        "dst",
        json!({"replicas": 1, "storage": {"size": "1Gi"},
               "bootstrap": {"recovery": {"backup": first.metadata.name, "targetTime": between}}}),
    )
    .await?;
    let dst = env.wait_ready("dst", 1).await?;
    let source = dst
        .status
        .and_then(|s| s.recovery_source)
        .ok_or("no recovery source in the status")?;
    assert_eq!(source.cluster, "src");
    let dst_password = env.password("dst").await?;
    let dst_ip = env.pod_ip(&env.current_primary("dst").await?).await?;
    assert_eq!(count_on(&dst_ip, &dst_password, "t").await?, 100);
    // It is a primary of its own: it takes writes.
    write_through_rw(
        &env,
        "dst",
        &dst_password,
        "insert into t(id) values (1000)",
    )
    .await?;

    // The store goes down: PostgreSQL goes on, the status says so.
    let mut s3 = s3;
    s3.stop();
    db.batch_execute("insert into t(id) select generate_series(151, 160)")
        .await?;
    let failing = env
        .wait_cluster("src", "ContinuousArchiving False", TIMEOUT, |s| {
            conditions::find_condition(&s.conditions, conditions::CONTINUOUS_ARCHIVING)
                .is_some_and(|c| c.status == "False" && c.reason == "ArchivingFailing")
        })
        .await?;
    let message = failing
        .status
        .and_then(|s| {
            conditions::find_condition(&s.conditions, conditions::CONTINUOUS_ARCHIVING)
                .map(|c| c.message.clone())
        })
        .unwrap_or_default();
    assert!(message.contains("failed"), "{message}");
    db.batch_execute("insert into t(id) select generate_series(161, 170)")
        .await?;
    let during: String = db
        .query_one("select pg_walfile_name(pg_current_wal_lsn())", &[])
        .await?
        .get(0);
    // Back: archiving catches up, and the archive has every segment, none twice or torn.
    s3.resume()?;
    env.wait_cluster("src", "ContinuousArchiving True again", TIMEOUT, |s| {
        conditions::is_true(&s.conditions, conditions::CONTINUOUS_ARCHIVING)
    })
    .await?;
    wait_archived(&db, &during).await?;
    let archived = archived_segments(&s3, "e2e/src/pgop-v1/wal")?;
    let timeline = &during[..8];
    let mine: Vec<u64> = archived
        .iter()
        .filter(|n| n.starts_with(timeline))
        .filter_map(|n| segment_number(n))
        .collect();
    let (Some(first), Some(last)) = (mine.first(), mine.last()) else {
        return Err(format!("no segment of timeline {timeline} archived: {archived:?}").into());
    };
    assert_eq!(
        mine.len() as u64,
        last - first + 1,
        "a gap in the archive of timeline {timeline}: {mine:?}"
    );
    assert!(
        *last >= segment_number(&during).ok_or("segment number")?,
        "{during} is in the archive: {mine:?}"
    );
    drop(s3);
    env.stop().await
}

/// Waits until the primary `db` has archived `segment` (or a later one).
async fn wait_archived(db: &tokio_postgres::Client, segment: &str) -> Result {
    pgop_testenv::wait::until(&format!("{segment} archived"), TIMEOUT, || async {
        let row = db
            .query_one(
                "select coalesce(last_archived_wal, '') from pg_stat_archiver",
                &[],
            )
            .await
            .map_err(|e| e.to_string())?;
        let last: String = row.get(0);
        if last.as_str() >= segment {
            Ok(())
        } else {
            Err(last)
        }
    })
    .await?;
    Ok(())
}

/// The WAL segment names (24 hex digits) the S3 server holds under `prefix`, sorted.
fn archived_segments(s3: &S3Server, prefix: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut dirs = vec![s3.object_file(prefix)];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            let stem = name.split('.').next().unwrap_or_default();
            if stem.len() == 24
                && stem.chars().all(|c| c.is_ascii_hexdigit())
                && !name.contains(".backup")
            {
                out.push(stem.to_string());
            }
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// A segment's number within its timeline (16 MB segments: log * 256 + segment).
fn segment_number(name: &str) -> Option<u64> {
    let log = u64::from_str_radix(name.get(8..16)?, 16).ok()?;
    let seg = u64::from_str_radix(name.get(16..24)?, 16).ok()?;
    Some(log * 256 + seg)
}
