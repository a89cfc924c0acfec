//! The volume benchmark: `cargo bench -p pgop --bench volumes` grows the volumes of a
//! three-instance cluster under a writer committing through `-rw`, and prints a table of
//! - resize by hand: from the patch of `spec.storage.size` to every claim's capacity, and
//!   to `VolumesResized` True (every manager reporting its grown filesystem);
//! - auto-grow: from the moment the primary's filesystem is first seen at the threshold
//!   (`statvfs` polled every 50 ms here) to every claim's capacity and to `VolumesResized`
//!   True;
//! - the writer's longest time without an acknowledged commit over each (growth is online:
//!   PostgreSQL keeps running);
//!
//! and the ratio of auto-grow's reaction to a resize by hand in the same run. Volumes are
//! the testenv class `pgop-local-sized` (a tmpfs per claim, grown online by the local node,
//! see docs/testenv.md), so the figures are pgop's own latency (operator, prober, manager)
//! plus a remount, not a cloud disk's. Run it on an otherwise idle machine.

#[path = "../tests/it/common/mod.rs"]
mod common;
#[path = "support/measure.rs"]
mod measure;

use common::*;
use measure::secs;
use pgop_api::conditions;
use serde_json::json;
use std::time::{Duration, Instant};

const NAME: &str = "grow";
const INSTANCES: [&str; 3] = ["grow-1", "grow-2", "grow-3"];

struct Row {
    what: String,
    claims: Duration,
    resized: Duration,
    gap: Duration,
}

/// Waits from `start` until every claim has `size` as its capacity, then until
/// `VolumesResized` is True naming it; both durations.
async fn follow(env: &Env, size: &str, start: Instant) -> Result<(Duration, Duration)> {
    let deadline = start + Duration::from_secs(300);
    let mut claims = None;
    loop {
        if claims.is_none() {
            let mut all = true;
            for claim in INSTANCES {
                all &= env.volume(claim).await?.1 == size;
            }
            if all {
                claims = Some(start.elapsed());
            }
        }
        if let Some(claims) = claims {
            let c = env.clusters_v1beta1().get(NAME).await?;
            let done = c.status.as_ref().is_some_and(|s| {
                conditions::find_condition(&s.conditions, conditions::VOLUMES_RESIZED)
                    .is_some_and(|c| c.status == conditions::TRUE && c.message.contains(size))
            });
            if done {
                return Ok((claims, start.elapsed()));
            }
        }
        if Instant::now() > deadline {
            return Err(format!("{size} not reached within 300 s").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The longest time between two acknowledged commits within `from..to`.
fn longest_gap(commits: &[Instant], from: Instant, to: Instant) -> Duration {
    let mut times: Vec<Instant> = commits
        .iter()
        .copied()
        .filter(|t| *t >= from && *t <= to)
        .collect();
    times.sort();
    times
        .windows(2)
        .map(|w| w[1].duration_since(w[0]))
        .max()
        .unwrap_or_default()
}

#[tokio::main]
async fn main() -> Result {
    let env = start("bench-volumes").await?;
    env.create(
        NAME,
        json!({"replicas": 3, "storage": {
            "size": "256Mi", "storageClassName": pgop_testenv::node::SIZED_STORAGE_CLASS,
        }}),
    )
    .await?;
    env.wait_ready(NAME, 3).await?;
    let password = env.password(NAME).await?;
    write_through_rw(
        &env,
        NAME,
        &password,
        "create table acked(id bigint primary key); create table filler (body text)",
    )
    .await?;
    let writer = Writer::start(&env, NAME, &password);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut spans = Vec::new();

    // By hand, three times.
    for size in ["320Mi", "384Mi", "448Mi"] {
        let start = Instant::now();
        env.patch(NAME, json!({"spec": {"storage": {"size": size}}}))
            .await?;
        let (claims, resized) = follow(&env, size, start).await?;
        spans.push((format!("by hand to {size}"), start, claims, resized));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    // Auto-grow, twice: 448Mi at 60% grows to 672Mi, then to 1008Mi.
    env.patch(
        NAME,
        json!({"spec": {"storage": {"autoGrow": {
            "thresholdPercent": 60, "increasePercent": 50, "maxSize": "2Gi"}}}}),
    )
    .await?;
    let primary = env.current_primary(NAME).await?;
    let c = connect(&env.pod_ip(&primary).await?, &password).await?;
    for (before, after) in [(448u64, "672Mi"), (672, "1008Mi")] {
        // Fill in 2 MiB steps, watching the primary's filesystem.
        let crossed = loop {
            let (_, _, size, used) = env.volume(&primary).await?;
            if size == before && used * 100 >= 60 * size {
                break Instant::now();
            }
            c.batch_execute(
                "insert into filler select repeat(md5(random()::text), 32) \
                 from generate_series(1, 2048)",
            )
            .await?;
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let (claims, resized) = follow(&env, after, crossed).await?;
        spans.push((
            format!("auto-grow {before}Mi to {after}"),
            crossed,
            claims,
            resized,
        ));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let commits: Vec<Instant> = writer
        .stop_with_times()
        .await?
        .into_iter()
        .map(|(_, at)| at)
        .collect();
    env.stop().await?;

    let rows: Vec<Row> = spans
        .into_iter()
        .map(|(what, start, claims, resized)| Row {
            what,
            claims,
            resized,
            gap: longest_gap(&commits, start, start + resized),
        })
        .collect();
    println!();
    println!(
        "| growth | -> every claim's capacity | -> VolumesResized True | longest commit gap |"
    );
    println!("|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} |",
            r.what,
            secs(r.claims),
            secs(r.resized),
            secs(r.gap)
        );
    }
    let mean = |rows: &[Row]| {
        rows.iter().map(|r| r.resized.as_secs_f64()).sum::<f64>() / rows.len().max(1) as f64
    };
    let (by_hand, auto) = rows.split_at(3);
    println!();
    println!(
        "auto-grow (threshold seen -> resized) / by hand (patch -> resized), means: {:.2} / {:.2} s = {:.2}",
        mean(auto),
        mean(by_hand),
        mean(auto) / mean(by_hand).max(0.001)
    );
    Ok(())
}
