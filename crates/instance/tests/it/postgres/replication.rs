use super::common::{Node, TestResult, eventually, names};
use pgop_instance::PgRole;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

/// A primary and two standbys: both stream through their own slot, and rows written on the
/// primary (by the application user, over TCP with its password) appear on both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_and_two_standbys_stream_through_slots() -> TestResult {
    let primary = Node::new("rep-1");
    let s1 = Node::new("rep-2");
    let s2 = Node::new("rep-3");
    primary.instance.bootstrap_primary().await?;
    primary
        .instance
        .ensure_slots(&names(&["rep-2", "rep-3"]))
        .await?;
    s1.instance.bootstrap_standby(&primary.upstream()).await?;
    s2.instance.bootstrap_standby(&primary.upstream()).await?;

    let status = eventually("two streaming standbys", WAIT, || async {
        let status = primary.instance.status().await;
        let streaming = status
            .replication
            .iter()
            .filter(|r| r.state == "streaming")
            .count();
        (streaming == 2).then_some(status)
    })
    .await;
    assert_eq!(status.role, PgRole::Primary);
    assert_eq!(status.timeline, Some(1));
    let slots = primary
        .superuser()
        .await
        .query(
            "SELECT slot_name::text FROM pg_replication_slots WHERE active ORDER BY 1",
            &[],
        )
        .await?;
    let slots: Vec<String> = slots.iter().map(|r| r.get(0)).collect();
    assert_eq!(slots, ["pgop_rep_2", "pgop_rep_3"]);

    // The standbys stream with the replication password from a password file outside
    // PGDATA: no file in PGDATA, which base backups and clones copy, holds it.
    let password = super::common::credentials().replication_password;
    for standby in [&s1, &s2] {
        let passfile = standby.socket_dir().join("pgop-replication.pgpass");
        let meta = std::fs::metadata(&passfile)?;
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
            0o600
        );
        assert!(std::fs::read_to_string(&passfile)?.contains(&password));
        for file in files_under(&standby.pgdata()) {
            // PostgreSQL removes temporary files while this reads.
            let bytes = match std::fs::read(&file) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                read => read?,
            };
            assert!(
                !bytes
                    .windows(password.len())
                    .any(|w| w == password.as_bytes()),
                "{} holds the replication password",
                file.display()
            );
        }
    }
    assert!(
        !primary
            .socket_dir()
            .join("pgop-replication.pgpass")
            .exists(),
        "a primary keeps no replication password file"
    );

    let app = primary.app().await?;
    app.batch_execute(
        "CREATE TABLE t (id int primary key); INSERT INTO t SELECT generate_series(1, 100)",
    )
    .await?;
    for standby in [&s1, &s2] {
        eventually("the rows on a standby", WAIT, || async {
            (standby.count("t").await == Some(100)).then_some(())
        })
        .await;
        let status = standby.instance.status().await;
        assert_eq!(status.role, PgRole::Replica);
        assert!(status.streaming);
        assert_eq!(
            status.system_identifier,
            primary.instance.status().await.system_identifier
        );
        assert!(standby.instance.ready().await);
        // A standby refuses writes.
        assert!(
            standby
                .app()
                .await?
                .batch_execute("INSERT INTO t VALUES (0)")
                .await
                .is_err()
        );
    }
    eventually(
        "the replay lag of both standbys on /pg/status",
        WAIT,
        || async {
            let status = primary.instance.status().await;
            let lags = status
                .replication
                .iter()
                .filter(|r| r.replay_lag_bytes.is_some());
            (lags.count() == 2).then_some(())
        },
    )
    .await;
    Ok(())
}

/// Every regular file under `dir`.
fn files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            match entry.file_type() {
                Ok(t) if t.is_dir() => stack.push(path),
                Ok(t) if t.is_file() => out.push(path),
                _ => {}
            }
        }
    }
    out
}
