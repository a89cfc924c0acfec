//! The replica-cluster benchmark: `cargo bench -p pgop --bench replica` prints a table of
//! - replication delay from site A to a replica cluster in site B, by streaming, while
//!   `pgbench -c 4 -j 2` writes to site A for `PGOP_BENCH_REPLICA_SECONDS` (default 60):
//!   every 500 ms a row is committed on A, and the time until it is visible on B's
//!   designated primary is one sample (median, 95th percentile, max); with the bytes of
//!   WAL B had not replayed at that moment;
//! - the same delay for a replica cluster that follows site A's store alone (an S3 server,
//!   one base backup, no connection): what site A has not archived yet is not on B;
//! - promotion after a site loss: site A stopped whole (operator, node with every
//!   PostgreSQL, control plane), then `spec.replica.enabled: false` on B -> the first write
//!   accepted through B's `-rw`, over `PGOP_BENCH_REPLICA_PROMOTIONS` fresh pairs of sites
//!   (default 3).
//!
//! Everything is real: two API servers, two operators, two local nodes, PostgreSQL 15,
//! `pgbench`. Run it on an otherwise idle machine; the figures are wall-clock times here.

#[path = "../tests/it/common/mod.rs"]
mod common;
#[path = "support/measure.rs"]
mod measure;

use common::*;
use measure::{env_number, secs};
use serde_json::json;
use std::time::{Duration, Instant};

const PGBENCH: &str = "/usr/lib/postgresql/15/bin/pgbench";

/// Site A with cluster `db` (one instance) and site B with a replica cluster `db` of
/// `instances` following it, streaming; returns them, site A's primary's address and its
/// application password.
async fn sites(round: usize, instances: i32) -> Result<(Env, Env, String, String)> {
    let a = start(&format!("bench-a{round}")).await?;
    let b = start(&format!("bench-b{round}")).await?;
    let (password, _) = sites::source(&a, "db", json!({})).await?;
    let source = sites::follow(&a, &b, "db", instances).await?;
    Ok((a, b, source, password))
}

fn percentile(v: &[Duration], p: f64) -> Duration {
    let mut s = v.to_vec();
    s.sort();
    let at = ((s.len() as f64 - 1.0) * p).round() as usize;
    s.get(at).copied().unwrap_or_default()
}

/// Every 500 ms for `load`, while `pgbench -c 4 -j 2` writes to the source at `source`: a
/// row committed there, and the time until it is visible at `replica` (one sample), with
/// the bytes of WAL `replica` had not replayed when it committed. Returns the samples and
/// pgbench's tps line.
async fn delay_under_pgbench(
    source: &str,
    replica: &str,
    password: &str,
    load: Duration,
) -> Result<(Vec<Duration>, Vec<i64>, String)> {
    let on_a = connect(source, password).await?;
    on_a.batch_execute(
        "create table beat(id bigserial primary key, at timestamptz default clock_timestamp())",
    )
    .await?;
    eprintln!("pgbench -i -s 10 on site A ...");
    let init = tokio::process::Command::new(PGBENCH)
        .args(["-i", "-q", "-s", "10", "-h", source, "-U", "app", "app"])
        .env("PGPASSWORD", password)
        .env("PGSSLMODE", "require")
        .output()
        .await?;
    if !init.status.success() {
        return Err(format!("pgbench -i: {}", String::from_utf8_lossy(&init.stderr)).into());
    }
    // The replica has the table before the first sample (through a store, once the
    // segment is archived: pgbench -i fills several).
    let on_b = connect(replica, password).await?;
    let since = Instant::now();
    while on_b
        .query_opt(
            "select 1 from pg_class where relname = 'pgbench_accounts'",
            &[],
        )
        .await?
        .is_none()
    {
        if since.elapsed() > TIMEOUT {
            return Err("pgbench's tables never reached site B".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "pgbench -c 4 -j 2 -T {} on site A, sampling the delay to site B ...",
        load.as_secs()
    );
    let bench = tokio::process::Command::new(PGBENCH)
        .args([
            "-c",
            "4",
            "-j",
            "2",
            "-T",
            &load.as_secs().to_string(),
            "-h",
            source,
            "-U",
            "app",
            "app",
        ])
        .env("PGPASSWORD", password)
        .env("PGSSLMODE", "require")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let started = Instant::now();
    let mut delays = Vec::new();
    let mut behind = Vec::new();
    while started.elapsed() < load {
        let row = on_a
            .query_one(
                "insert into beat default values returning id, pg_current_wal_lsn()::text",
                &[],
            )
            .await?;
        let committed = Instant::now();
        let id: i64 = row.get(0);
        let lsn: String = row.get(1);
        let bytes: i64 = on_b
            .query_one(
                "select greatest(pg_wal_lsn_diff($1::text::pg_lsn, pg_last_wal_replay_lsn()), 0)::bigint",
                &[&lsn],
            )
            .await?
            .get(0);
        behind.push(bytes);
        loop {
            if on_b
                .query_opt("select 1 from beat where id = $1", &[&id])
                .await?
                .is_some()
            {
                break;
            }
            if committed.elapsed() > Duration::from_secs(180) {
                return Err(format!("row {id} never reached site B").into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        delays.push(committed.elapsed());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let out = bench.wait_with_output().await?;
    let tps = String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.starts_with("tps"))
        .unwrap_or("tps: unknown")
        .to_string();
    Ok((delays, behind, tps))
}

/// A row of the table for delay samples taken `how`.
fn delay_row(how: &str, delays: &[Duration], behind: &[i64], tps: &str) -> [String; 5] {
    let mut behind = behind.to_vec();
    behind.sort();
    let median_bytes = behind.get(behind.len() / 2).copied().unwrap_or_default();
    let max_bytes = behind.last().copied().unwrap_or_default();
    [
        format!("replication delay A -> B {how}, under pgbench -c 4 -j 2 ({tps})"),
        delays.len().to_string(),
        secs(percentile(delays, 0.5)),
        format!("p95 {}", secs(percentile(delays, 0.95))),
        format!(
            "max {}; WAL not replayed on B: median {} KiB, max {} KiB",
            secs(percentile(delays, 1.0)),
            median_bytes / 1024,
            max_bytes / 1024
        ),
    ]
}

#[tokio::main]
async fn main() -> Result {
    if !std::path::Path::new(PGBENCH).exists() {
        return Err(format!("{PGBENCH} is missing: apt-get install postgresql-15").into());
    }
    let load = Duration::from_secs(env_number("PGOP_BENCH_REPLICA_SECONDS", 60));
    let promotions = env_number("PGOP_BENCH_REPLICA_PROMOTIONS", 3) as usize;
    let mut rows: Vec<[String; 5]> = Vec::new();

    // 1. Replication delay under pgbench, by streaming.
    let (a, b, source, password) = sites(0, 1).await?;
    let designated = b.pod_ip(&b.current_primary("db").await?).await?;
    let (delays, behind, tps) = delay_under_pgbench(&source, &designated, &password, load).await?;
    rows.push(delay_row("by streaming", &delays, &behind, &tps));
    b.stop().await?;
    a.stop().await?;

    // 2. The same through the store alone: site A archives to an S3 server (one base
    // backup there), site B's entry names only the store.
    let a = start("bench-archive-a").await?;
    let b = start("bench-archive-b").await?;
    let s3 = pgop_testenv::s3::S3Server::start(&a.plane.dir().join("s3"))?;
    let store = sites::s3_store(&s3, &[&a, &b]).await?;
    let (password, source) = sites::source(&a, "db", json!({"backup": {"store": store}})).await?;
    sites::base_backup(&a, "db-base").await?;
    let mut entry_store = store.clone();
    entry_store["cluster"] = json!("db");
    b.create(
        "db",
        json!({"replicas": 1, "storage": {"size": "1Gi"},
            "externalClusters": [{"name": "site-a", "store": entry_store}],
            "replica": {"source": "site-a"}}),
    )
    .await?;
    b.wait_ready("db", 1).await?;
    let designated = b.pod_ip(&b.current_primary("db").await?).await?;
    let (delays, behind, tps) = delay_under_pgbench(&source, &designated, &password, load).await?;
    rows.push(delay_row(
        "through the store alone (archive)",
        &delays,
        &behind,
        &tps,
    ));
    drop(s3);
    b.stop().await?;
    a.stop().await?;

    // 3. Promotion after a site loss.
    let mut promoted = Vec::new();
    for round in 1..=promotions {
        let (a, b, _, password) = sites(round, 1).await?;
        let own = b.password("db").await?;
        a.stop().await?;
        let asked = Instant::now();
        b.patch("db", json!({"spec": {"replica": {"enabled": false}}}))
            .await?;
        let took = loop {
            let mut done = false;
            if let Some(rw) = b.rw("db") {
                for p in [&password, &own] {
                    if let Ok(c) = connect_within(&rw, p, Duration::from_millis(500)).await
                        && c.batch_execute("create table if not exists after(id int)")
                            .await
                            .is_ok()
                    {
                        done = true;
                        break;
                    }
                }
            }
            if done {
                break asked.elapsed();
            }
            if asked.elapsed() > TIMEOUT {
                return Err("no write after the promotion".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        eprintln!("round {round}: promotion -> first write {}", secs(took));
        promoted.push(took);
        b.stop().await?;
    }
    rows.push([
        "promotion after site A stopped whole (enabled: false -> first write via B's -rw)".into(),
        promoted.len().to_string(),
        secs(percentile(&promoted, 0.5)),
        format!("min {}", secs(percentile(&promoted, 0.0))),
        format!("max {}", secs(percentile(&promoted, 1.0))),
    ]);

    println!("| measure | samples | median | | |");
    println!("|---|---|---|---|---|");
    for r in rows {
        println!("| {} | {} | {} | {} | {} |", r[0], r[1], r[2], r[3], r[4]);
    }
    Ok(())
}
