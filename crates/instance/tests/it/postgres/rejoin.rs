use super::common::{Node, TestResult, eventually, free_port};
use pgop_instance::{DataState, PgRole, Rejoin, Upstream};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

/// When pg_rewind cannot work (here: the "new primary" is another cluster altogether), the
/// former primary is cloned afresh from the new one and streams from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_former_primary_that_cannot_rewind_is_recloned() -> TestResult {
    let old = Node::new("rj-1");
    let new = Node::new("rj-2");
    old.instance.bootstrap_primary().await?;
    new.instance.bootstrap_primary().await?;
    new.app()
        .await?
        .batch_execute("CREATE TABLE only_on_new (id int); INSERT INTO only_on_new VALUES (1)")
        .await?;
    new.instance.ensure_slots(&["rj-1".to_string()]).await?;

    let how = old.instance.demote(&new.upstream()).await?;
    assert_eq!(how, Rejoin::Recloned);
    eventually("the re-cloned standby streaming", WAIT, || async {
        let s = old.instance.status().await;
        (s.role == PgRole::Replica && s.streaming && old.count("only_on_new").await == Some(1))
            .then_some(())
    })
    .await;
    assert_eq!(
        old.instance.status().await.system_identifier,
        new.instance.status().await.system_identifier
    );
    Ok(())
}

/// A rejoin towards a primary that does not answer keeps the data: nothing is wiped for a
/// clone that could not happen, and the instance can still start on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejoin_towards_an_unreachable_primary_keeps_the_data() -> TestResult {
    let node = Node::new("rj-3");
    node.instance.bootstrap_primary().await?;
    node.app()
        .await?
        .batch_execute("CREATE TABLE precious (id int); INSERT INTO precious VALUES (1)")
        .await?;
    let nowhere = Upstream {
        host: "127.0.0.1".into(),
        port: free_port(),
        ..node.upstream()
    };
    assert!(node.instance.demote(&nowhere).await.is_err());
    assert_eq!(node.instance.data_state(), DataState::Ready);
    node.instance.start_as(pgop_instance::Mode::Primary).await?;
    assert_eq!(node.count("precious").await, Some(1));
    Ok(())
}

/// A standby that replayed more of the old timeline than the instance promoted (it was
/// ahead when the primary died) can never follow the new primary: the manager reads the
/// new primary's timeline history, sees that the standby is past the fork, and rewinds it.
/// A standby that stopped before the fork is only behind and follows as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_past_the_fork_of_the_new_timeline_is_seen_diverged_and_rewound() -> TestResult {
    use pgop_instance::pg::timeline::{StandbyPosition, diverged};
    let nodes = [
        Node::new("dv-1"),
        Node::new("dv-2"),
        Node::new("dv-3"),
        Node::new("dv-4"),
    ];
    let [old, promoted, ahead, behind] = &nodes;
    old.instance.bootstrap_primary().await?;
    old.instance
        .ensure_slots(&["dv-2".into(), "dv-3".into(), "dv-4".into()])
        .await?;
    for standby in [promoted, ahead, behind] {
        standby.instance.bootstrap_standby(&old.upstream()).await?;
    }
    let app = old.app().await?;
    app.batch_execute("CREATE TABLE t (id int primary key)")
        .await?;
    // Each standby stops receiving in turn: `behind` first, then `promoted`; `ahead` gets
    // everything.
    let mut nowhere = old.upstream();
    nowhere.port = free_port();
    let mut receiving = vec![promoted, ahead, behind];
    for (stopped, rows) in [(behind, 100), (promoted, 200)] {
        app.batch_execute(&format!(
            "INSERT INTO t SELECT generate_series({}, {rows})",
            rows - 99
        ))
        .await?;
        for standby in &receiving {
            eventually("the rows on the standbys still receiving", WAIT, || async {
                (standby.count("t").await == Some(rows)).then_some(())
            })
            .await;
        }
        stopped.instance.follow(&nowhere).await?;
        eventually("the standby no longer streams", WAIT, || async {
            (!stopped.instance.status().await.streaming).then_some(())
        })
        .await;
        receiving.retain(|n| !std::ptr::eq(*n, stopped));
    }
    app.batch_execute("INSERT INTO t SELECT generate_series(201, 300)")
        .await?;
    eventually(
        "the last rows on the standby still streaming",
        WAIT,
        || async { (ahead.count("t").await == Some(300)).then_some(()) },
    )
    .await;
    assert_eq!(promoted.count("t").await, Some(200));
    assert_eq!(behind.count("t").await, Some(100));
    drop(app);
    old.instance.kill().await?;

    promoted.instance.promote().await?;
    promoted
        .instance
        .ensure_slots(&["dv-3".into(), "dv-4".into()])
        .await?;
    let timeline = promoted
        .upstream()
        .timeline()
        .await?
        .ok_or("the promoted instance reads as a primary")?;
    assert_eq!(timeline.timeline, 2);
    assert_eq!(timeline.history.len(), 1, "{timeline:?}");
    let position = |s: &pgop_instance::PgStatus| -> Result<StandbyPosition, String> {
        Ok(StandbyPosition {
            timeline: s
                .timeline
                .and_then(|t| u32::try_from(t).ok())
                .ok_or("no timeline")?,
            replayed: s
                .replayed_lsn
                .as_deref()
                .and_then(pgop_api::instance_status::parse_lsn)
                .ok_or("no replay position")?,
        })
    };
    let ahead_at = position(&ahead.instance.status().await)?;
    let behind_at = position(&behind.instance.status().await)?;
    assert!(diverged(&timeline, ahead_at), "{timeline:?} {ahead_at:?}");
    assert!(
        !diverged(&timeline, behind_at),
        "{timeline:?} {behind_at:?}"
    );

    // Told to follow, the one behind streams on the new timeline; the one ahead cannot.
    behind.instance.follow(&promoted.upstream()).await?;
    ahead.instance.follow(&promoted.upstream()).await?;
    promoted
        .app()
        .await?
        .batch_execute("INSERT INTO t SELECT generate_series(1001, 1010)")
        .await?;
    eventually(
        "the standby behind the fork streams on timeline 2",
        WAIT,
        || async {
            let s = behind.instance.status().await;
            (s.streaming && s.timeline == Some(2) && behind.count("t").await == Some(210))
                .then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let s = ahead.instance.status().await;
    assert!(!s.streaming, "a diverged standby cannot stream: {s:?}");
    assert!(diverged(&timeline, position(&s)?));

    // The rewind: the rows only it had are gone, the new timeline's are there.
    let how = ahead.instance.demote(&promoted.upstream()).await?;
    assert_eq!(how, Rejoin::Rewound);
    eventually(
        "the rewound standby streams on timeline 2",
        WAIT,
        || async {
            let s = ahead.instance.status().await;
            (s.streaming && s.timeline == Some(2) && ahead.count("t").await == Some(210))
                .then_some(())
        },
    )
    .await;
    Ok(())
}

/// A standby whose primary has removed WAL it needs to become consistent waits in
/// "starting up" forever (standbys fetch WAL by streaming only): what a rewound former
/// primary met in CI when the new primary had recycled the segment of their last common
/// checkpoint. Here the standby's data is a copy of the primary's taken without its WAL,
/// after which the primary moves on and recycles it; the start is cloned afresh instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_whose_primary_removed_the_wal_it_needs_is_cloned_afresh() -> TestResult {
    let primary = Node::new("wg-1");
    let standby = Node::new("wg-2");
    primary.instance.bootstrap_primary().await?;
    let upstream = primary.upstream();
    let backup = pgop_instance::pg::binaries::command(
        &super::common::binaries(),
        "pg_basebackup",
        super::common::run_as(),
    )
    .arg("--pgdata")
    .arg(standby.pgdata())
    .arg("--dbname")
    .arg(upstream.conninfo_without_password("wg-2", None))
    .args(["--wal-method=none", "--checkpoint=fast", "--no-password"])
    .env("PGPASSWORD", &upstream.password)
    .output()
    .await?;
    assert!(
        backup.status.success(),
        "pg_basebackup: {}",
        String::from_utf8_lossy(&backup.stderr)
    );
    move_wal_on(&primary).await?;
    // Its slot made only now, as a new primary makes its standbys' slots after its
    // promotion: it keeps WAL from here on, not what the standby needs.
    primary.instance.ensure_slots(&["wg-2".to_string()]).await?;
    standby
        .instance
        .start_as(pgop_instance::Mode::Standby {
            upstream: primary.upstream(),
        })
        .await?;
    wait_recloned(&standby).await;
    Ok(())
}

/// A standby that is consistent and running, but whose primary removed WAL it still needs
/// while it could not stream (here: its replication role refused for a while, and its slot
/// made again meanwhile, as a new primary makes its standbys' slots after its promotion):
/// its WAL receiver is told so at every retry and it can never catch up. The
/// manager sees it ([`pgop_instance::Instance::upstream_wal_gone`]) and clones it afresh
/// ([`pgop_instance::Instance::reclone`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_standby_whose_primary_removed_the_wal_it_needs_is_recloned() -> TestResult {
    let primary = Node::new("wr-1");
    let standby = Node::new("wr-2");
    primary.instance.bootstrap_primary().await?;
    primary.instance.ensure_slots(&["wr-2".to_string()]).await?;
    standby
        .instance
        .bootstrap_standby(&primary.upstream())
        .await?;
    eventually("the standby streaming", WAIT, || async {
        standby.instance.status().await.streaming.then_some(())
    })
    .await;
    let su = primary.superuser().await;
    su.batch_execute("ALTER ROLE streaming_replica NOLOGIN")
        .await?;
    eventually("the standby no longer streaming", WAIT, || async {
        su.batch_execute("SELECT pg_terminate_backend(pid) FROM pg_stat_replication")
            .await
            .ok()?;
        let s = standby.instance.status().await;
        (s.role == PgRole::Replica && !s.streaming).then_some(())
    })
    .await;
    // Its slot goes (once its WAL sender has gone) and is made again below, after the WAL
    // the standby needs is removed.
    eventually("the standby's slot dropped", WAIT, || async {
        primary.instance.ensure_slots(&[]).await.ok()?;
        let left: i64 = su
            .query_one("SELECT count(*) FROM pg_replication_slots", &[])
            .await
            .ok()?
            .get(0);
        (left == 0).then_some(())
    })
    .await;
    move_wal_on(&primary).await?;
    primary.instance.ensure_slots(&["wr-2".to_string()]).await?;
    su.batch_execute("ALTER ROLE streaming_replica LOGIN")
        .await?;
    eventually("the standby told that its WAL is gone", WAIT, || async {
        standby.instance.upstream_wal_gone().then_some(())
    })
    .await;
    let stuck = standby.instance.status().await;
    assert!(
        stuck.role == PgRole::Replica && !stuck.streaming,
        "running, consistent and not streaming: {stuck:?}"
    );

    standby.instance.reclone(&primary.upstream()).await?;
    assert!(!standby.instance.upstream_wal_gone());
    wait_recloned(&standby).await;
    Ok(())
}

/// A re-clone towards an instance that is not a primary (here: nothing listens) keeps the
/// standby running on its data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclone_towards_no_primary_keeps_the_standby_running() -> TestResult {
    let primary = Node::new("wr-3");
    let standby = Node::new("wr-4");
    primary.instance.bootstrap_primary().await?;
    primary.instance.ensure_slots(&["wr-4".to_string()]).await?;
    standby
        .instance
        .bootstrap_standby(&primary.upstream())
        .await?;
    let nowhere = Upstream {
        host: "127.0.0.1".into(),
        port: free_port(),
        ..primary.upstream()
    };
    assert!(standby.instance.reclone(&nowhere).await.is_err());
    assert!(standby.instance.pid().is_some());
    assert_eq!(standby.instance.status().await.role, PgRole::Replica);
    Ok(())
}

/// Writes 4,000 rows into `moved` on `primary`, switching and recycling WAL four times
/// (`CHECKPOINT`), so that a standby that did not receive it cannot stream it any more.
async fn move_wal_on(primary: &Node) -> TestResult {
    let su = primary.superuser().await;
    let app = primary.app().await?;
    for _ in 0..4 {
        app.batch_execute(
            "CREATE TABLE IF NOT EXISTS moved (id int); \
             INSERT INTO moved SELECT generate_series(1, 1000)",
        )
        .await?;
        su.batch_execute("SELECT pg_switch_wal(); CHECKPOINT;")
            .await?;
    }
    Ok(())
}

/// Waits until `standby`, cloned afresh, streams and has the 4,000 rows of [`move_wal_on`].
async fn wait_recloned(standby: &Node) {
    eventually("the re-cloned standby streaming", WAIT, || async {
        let s = standby.instance.status().await;
        (s.role == PgRole::Replica && s.streaming && standby.count("moved").await == Some(4000))
            .then_some(())
    })
    .await;
}
