use super::common::{Http, Node, TempDir, TestResult, eventually};
use pgop_api::constants::PATH_METRICS;
use pgop_instance::Archiving;
use std::time::Duration;

/// The value of the sample `name{labels}` in an OpenMetrics exposition.
fn sample(text: &str, name: &str, labels: &str) -> Option<f64> {
    let series = format!("{name}{{{labels}}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.parse().ok())
}

/// WAL archiving that fails shows on `/metrics`, not only in the cluster's status: a primary
/// whose `archive_command` fails (the "pgop" it runs is `/bin/false`) reports
/// `pgop_wal_archive_failing 1` and a failed count once PostgreSQL tried to archive a WAL
/// file, next to the rest of its state and its data volume's usage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_wal_archiving_shows_in_metrics() -> TestResult {
    let node = Node::new("met-1");
    let store = TempDir::new("met-1-store");
    node.instance.set_archiving(Some(Archiving {
        store: pgop_backup::StoreConfig::local(&store.0, "it"),
        pgop_binary: "/bin/false".into(),
    }));
    node.instance.bootstrap_primary().await?;
    let http = Http::serve(&node).await;
    let labels = r#"cluster="it",instance="met-1""#;

    let client = node.superuser().await;
    client
        .batch_execute("CREATE TABLE filler AS SELECT generate_series(1, 1000) AS n")
        .await?;
    let switched: String = client
        .query_one("SELECT pg_switch_wal()::text", &[])
        .await?
        .try_get(0)?;
    println!("switched WAL at {switched}");

    let failed = eventually(
        "pg_stat_archiver to count a failure",
        Duration::from_secs(60),
        || async {
            let archiving = node.instance.status().await.archiving?;
            (archiving.failed_count > 0).then_some(archiving.failed_count)
        },
    )
    .await;

    let (code, head, text) = http.get_with_head(PATH_METRICS).await;
    assert_eq!(code, 200, "{text}");
    assert!(
        head.lines().any(|h| h.eq_ignore_ascii_case(
            "content-type: application/openmetrics-text; version=1.0.0; charset=utf-8"
        )),
        "{head}"
    );
    assert!(text.ends_with("# EOF\n"), "{text}");
    assert!(
        text.lines()
            .any(|l| l == format!("pgop_wal_archive_failing{{{labels}}} 1")),
        "{text}"
    );
    assert_eq!(
        sample(&text, "pgop_wal_archive_configured", labels),
        Some(1.0)
    );
    let failed_total = sample(&text, "pgop_wal_archive_failed_total", labels)
        .ok_or("no pgop_wal_archive_failed_total")?;
    assert!(
        failed_total >= failed as f64 && failed_total > 0.0,
        "{failed_total} < {failed}"
    );
    assert!(
        sample(
            &text,
            "pgop_wal_last_archive_failure_timestamp_seconds",
            labels
        )
        .is_some_and(|t| t > 1.7e9)
    );
    assert_eq!(sample(&text, "pgop_wal_archived_total", labels), Some(0.0));
    assert_eq!(
        sample(&text, "pgop_wal_last_archived_timestamp_seconds", labels),
        None
    );
    // The rest of a running primary's state.
    assert_eq!(sample(&text, "pgop_up", labels), Some(1.0));
    assert_eq!(
        sample(&text, "pgop_role", &format!(r#"{labels},role="primary""#)),
        Some(1.0)
    );
    assert_eq!(sample(&text, "pgop_timeline", labels), Some(1.0));
    let position = sample(&text, "pgop_wal_position_bytes", labels).ok_or("no WAL position")?;
    let switched = pgop_api::instance_status::parse_lsn(&switched).ok_or("an LSN")?;
    assert!(position >= switched as f64, "{position} < {switched}");
    // The data directory's filesystem, as statvfs sees it.
    let volume = |text: &str| -> Result<[f64; 3], String> {
        let v = |name: &str| sample(text, name, labels).ok_or(format!("no {name} in\n{text}"));
        Ok([
            v("pgop_volume_capacity_bytes")?,
            v("pgop_volume_used_bytes")?,
            v("pgop_volume_available_bytes")?,
        ])
    };
    let [capacity, used, available] = volume(&text)?;
    assert!(
        capacity > 0.0 && used > 0.0 && used <= capacity && available <= capacity - used,
        "capacity {capacity}, used {used}, available {available}"
    );

    // Once PostgreSQL is down: pgop_up 0, and no archiving series (unknown, not "fine").
    node.instance.stop().await?;
    let (code, _, text) = http.get_with_head(PATH_METRICS).await;
    assert_eq!(code, 200);
    assert_eq!(sample(&text, "pgop_up", labels), Some(0.0));
    assert_eq!(
        sample(&text, "pgop_role", &format!(r#"{labels},role="stopped""#)),
        Some(1.0)
    );
    assert!(!text.contains("pgop_wal_archive_failing{"), "{text}");
    // The volume is still known.
    assert!(volume(&text)?[0] > 0.0);
    Ok(())
}
