use super::common::{Node, TestResult, eventually, names};
use pgop_instance::{PgRole, Rejoin};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(30);

/// kill -9 of the primary: the most advanced standby is promoted, the other follows it,
/// writes continue, and the old primary comes back through pg_rewind as a standby and
/// catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_promotes_a_standby_and_the_old_primary_rejoins_through_rewind() -> TestResult {
    let nodes = [Node::new("fo-1"), Node::new("fo-2"), Node::new("fo-3")];
    let [old, a, b] = &nodes;
    old.instance.bootstrap_primary().await?;
    old.instance.ensure_slots(&names(&["fo-2", "fo-3"])).await?;
    a.instance.bootstrap_standby(&old.upstream()).await?;
    b.instance.bootstrap_standby(&old.upstream()).await?;
    let app = old.app().await?;
    app.batch_execute(
        "CREATE TABLE t (id int primary key); INSERT INTO t SELECT generate_series(1, 100)",
    )
    .await?;
    for standby in [a, b] {
        eventually("the rows on both standbys", WAIT, || async {
            (standby.count("t").await == Some(100)).then_some(())
        })
        .await;
    }

    old.instance.kill().await?;
    let killed = Instant::now();
    let (sa, sb) = (a.instance.status().await, b.instance.status().await);
    let (new, other) = if sa.wal_position() >= sb.wal_position() {
        (a, b)
    } else {
        (b, a)
    };
    new.instance.promote().await?;
    new.instance
        .ensure_slots(&[
            other.instance.name().to_string(),
            old.instance.name().to_string(),
        ])
        .await?;
    new.app()
        .await?
        .batch_execute("INSERT INTO t SELECT generate_series(101, 200)")
        .await?;
    eprintln!("kill -9 to writable: {:?}", killed.elapsed());
    let status = new.instance.status().await;
    assert_eq!(status.role, PgRole::Primary);
    assert_eq!(status.timeline, Some(2));

    other.instance.follow(&new.upstream()).await?;
    eventually("the other standby on the new timeline", WAIT, || async {
        let s = other.instance.status().await;
        (other.count("t").await == Some(200) && s.streaming && s.timeline == Some(2)).then_some(())
    })
    .await;

    let rejoin = old.instance.demote(&new.upstream()).await?;
    assert_eq!(rejoin, Rejoin::Rewound);
    new.app()
        .await?
        .batch_execute("INSERT INTO t SELECT generate_series(201, 300)")
        .await?;
    eventually("the old primary caught up as a standby", WAIT, || async {
        let s = old.instance.status().await;
        (old.count("t").await == Some(300) && s.role == PgRole::Replica && s.streaming)
            .then_some(())
    })
    .await;
    let streaming = eventually(
        "two standbys streaming from the new primary",
        WAIT,
        || async {
            let s = new.instance.status().await;
            let n = s
                .replication
                .iter()
                .filter(|r| r.state == "streaming")
                .count();
            (n == 2).then_some(n)
        },
    )
    .await;
    assert_eq!(streaming, 2);
    Ok(())
}
