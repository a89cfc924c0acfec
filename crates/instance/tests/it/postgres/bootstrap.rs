use super::common::{Node, TestResult, eventually, names};
use pgop_instance::DataState;
use pgop_instance::instance::Error;
use std::time::{Duration, Instant};

/// Generous: PostgreSQL starts, clones and restarts here, on machines as small and as
/// loaded as CI's (2 cores shared with other test binaries).
const WAIT: Duration = Duration::from_secs(60);

/// A clone interrupted half-way (the manager dies during pg_basebackup) is recognised as
/// incomplete, refused as a data directory, and redone from scratch on the next bootstrap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_clone_is_detected_and_redone() -> TestResult {
    let primary = Node::new("clone-1");
    let standby = Node::new("clone-2");
    primary.instance.bootstrap_primary().await?;
    primary.instance.ensure_slots(&names(&["clone-2"])).await?;
    primary
        .app()
        .await?
        .batch_execute("CREATE TABLE big AS SELECT g AS id, repeat(md5(g::text), 40) AS pad FROM generate_series(1, 100000) g")
        .await?;

    let pgdata = standby.instance.options().layout.pgdata.clone();
    let upstream = primary.upstream();
    let clone = standby.instance.bootstrap_standby(&upstream);
    let copying = async {
        loop {
            if std::fs::read_dir(&pgdata).is_ok_and(|mut d| d.next().is_some()) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::select! {
        result = clone => panic!("the clone finished before it could be interrupted: {result:?}"),
        () = copying => {}
    }
    // The clone future is dropped here: pg_basebackup is killed mid-copy.
    assert_eq!(standby.instance.data_state(), DataState::Incomplete);
    match standby.instance.start().await {
        Err(Error::DataNotReady(DataState::Incomplete)) => {}
        other => panic!("an incomplete data directory must not start: {other:?}"),
    }
    assert!(standby.instance.pid().is_none());

    standby.instance.bootstrap_standby(&upstream).await?;
    assert_eq!(standby.instance.data_state(), DataState::Ready);
    eventually("the copied table on the standby", WAIT, || async {
        (standby.count("big").await == Some(100_000)).then_some(())
    })
    .await;
    assert!(standby.instance.status().await.streaming);
    Ok(())
}

/// A crashed postmaster is restarted by the supervisor; shutdown (SIGTERM of the manager)
/// stops PostgreSQL cleanly even while a client holds a session open: the shutdown is fast
/// (the session is ended, a smart shutdown would wait for it), and the stop ladder bounds it
/// in any case (fast, then immediate after the stop timeout, then SIGKILL). The bound below
/// is that ladder with room for a loaded machine, not a speed target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_postmaster_restarts_and_shutdown_is_clean_within_the_timeout() -> TestResult {
    let node = Node::with_stop_timeout("stop-1", Duration::from_secs(2));
    node.instance.bootstrap_primary().await?;
    let first = node.instance.pid().expect("running");
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(first as i32, libc::SIGKILL) };
    let second = eventually("a restarted postmaster answering", WAIT, || async {
        let pid = node.instance.pid().filter(|pid| *pid != first)?;
        node.instance.endpoint().connect().await.ok()?;
        Some(pid)
    })
    .await;
    assert_ne!(first, second);
    assert_eq!(node.instance.restarts(), 1);

    let _session = node.app().await?;
    let started = Instant::now();
    node.instance.shutdown().await?;
    let took = started.elapsed();
    assert!(took < Duration::from_secs(30), "shutdown took {took:?}");
    assert!(node.instance.pid().is_none());
    // SAFETY: as above; signal 0 only checks that the process group exists.
    let alive = unsafe { libc::kill(-(second as i32), 0) } == 0;
    assert!(!alive, "no PostgreSQL process may outlive the shutdown");
    let pgdata = &node.instance.options().layout.pgdata;
    assert!(
        !pgdata.join("postmaster.pid").exists(),
        "a clean shutdown removes postmaster.pid"
    );
    Ok(())
}

/// A postmaster that stops answering (SIGSTOP) fails `/healthz` and `/readyz`, and passes
/// again once it answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wedged_postgres_fails_the_liveness_probe() -> TestResult {
    let node = Node::new("wedge-1");
    node.instance.bootstrap_primary().await?;
    let http = super::common::Http::serve(&node).await;
    assert_eq!(http.get(pgop_api::constants::PATH_HEALTHZ).await.0, 200);
    let pid = node.instance.pid().expect("running") as i32;
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let (healthz, readyz) = (
        http.get(pgop_api::constants::PATH_HEALTHZ).await.0,
        http.get(pgop_api::constants::PATH_READYZ).await.0,
    );
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    assert_eq!((healthz, readyz), (503, 503));
    eventually("healthy again", WAIT, || async {
        (http.get(pgop_api::constants::PATH_HEALTHZ).await.0 == 200).then_some(())
    })
    .await;
    Ok(())
}
