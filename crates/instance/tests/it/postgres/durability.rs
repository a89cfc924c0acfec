use super::common::{Node, TestResult, eventually};
use pgop_api::cluster::DataDurability;
use pgop_instance::SyncSpec;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const WAIT: Duration = Duration::from_secs(30);
const ROUNDS: usize = 20;

/// Synchronous replication with `dataDurability: required`: a writer records every commit
/// PostgreSQL acknowledged; the primary is killed (-9) at random moments, the standby
/// promoted, and every acknowledged commit must be on the new primary. The old primary
/// rejoins through pg_rewind and becomes the next round's synchronous standby.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_acknowledged_commit_is_lost_when_the_primary_is_killed_with_required_durability()
-> TestResult {
    let spec = SyncSpec {
        synchronous: 1,
        durability: DataDurability::Required,
    };
    let nodes = [Node::new("dur-1"), Node::new("dur-2")];
    nodes[0].instance.bootstrap_primary().await?;
    nodes[0]
        .instance
        .ensure_slots(&[nodes[1].instance.name().to_string()])
        .await?;
    nodes[0]
        .instance
        .set_synchronous(spec, &[nodes[1].instance.name().to_string()])
        .await?;
    nodes[1]
        .instance
        .bootstrap_standby(&nodes[0].upstream())
        .await?;
    nodes[1]
        .instance
        .set_synchronous(spec, &[nodes[0].instance.name().to_string()])
        .await?;
    nodes[0]
        .app()
        .await?
        .batch_execute("CREATE TABLE acked (id bigint primary key)")
        .await?;

    let mut seed = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos() as u64 | 1;
    eprintln!("seed {seed}");
    let acked: Arc<Mutex<Vec<i64>>> = Arc::default();
    let mut next_id = 0i64;
    let started = Instant::now();
    let (mut primary, mut standby) = (0usize, 1usize);
    for round in 0..ROUNDS {
        let (p, s) = (&nodes[primary], &nodes[standby]);
        eventually("the synchronous standby streaming", WAIT, || async {
            let status = p.instance.status().await;
            status
                .replication
                .iter()
                .any(|r| r.state == "streaming" && r.sync_state == "quorum")
                .then_some(())
        })
        .await;

        let app = p.app().await?;
        let acked_writer = acked.clone();
        let first_id = next_id;
        let writer = tokio::spawn(async move {
            let mut id = first_id;
            loop {
                id += 1;
                match app.execute("INSERT INTO acked VALUES ($1)", &[&id]).await {
                    Ok(_) => acked_writer.lock().expect("lock").push(id),
                    // Not acknowledged: it may or may not survive, and either is correct.
                    Err(_) => return id,
                }
            }
        });
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        tokio::time::sleep(Duration::from_millis(20 + seed % 300)).await;
        p.instance.kill().await?;
        next_id = tokio::time::timeout(WAIT, writer).await??;

        s.instance.promote().await?;
        let expected: Vec<i64> = acked.lock().expect("lock").clone();
        let client = s.instance.endpoint().connect_to("app").await?;
        let row = client
            .query_one(
                "SELECT count(*) FROM acked WHERE id = ANY($1)",
                &[&expected],
            )
            .await?;
        let found: i64 = row.get(0);
        assert_eq!(
            found,
            expected.len() as i64,
            "round {round}: {} acknowledged commits lost",
            expected.len() as i64 - found
        );

        s.instance
            .ensure_slots(&[p.instance.name().to_string()])
            .await?;
        p.instance.demote(&s.upstream()).await?;
        std::mem::swap(&mut primary, &mut standby);
    }
    let total = acked.lock().expect("lock").len();
    eprintln!(
        "{ROUNDS} rounds, {total} acknowledged commits, none lost, in {:?}",
        started.elapsed()
    );
    assert!(
        total > ROUNDS,
        "the writer must have committed in most rounds"
    );
    Ok(())
}
