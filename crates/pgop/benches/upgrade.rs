//! The major-upgrade benchmark: `cargo bench -p pgop --bench upgrade` upgrades
//! three-instance clusters from PostgreSQL 15 to 18 in place while a writer commits through
//! `-rw`, and prints a table of
//! - the write downtime: the longest time without an acknowledged commit;
//! - raise -> Completed: from the patch of `spec.postgresVersion` to every instance ready on
//!   18 (with a store, the base backup before is part of it);
//! - Pods stopped -> primary on 18: from the first status showing `Stopping` to the first
//!   showing `Cloning` (pg_upgrade and the first start of 18);
//!
//! for `--copy` (no store) at two data sizes and `--link` (an S3 store, so a base backup
//! first) at the larger size, and the ratios between them in the same run.
//!
//! Everything is real: API server, operator, local node, PostgreSQL 15 and 18, the S3
//! server. Run it on an otherwise idle machine; the figures are wall-clock times here.

#[path = "../tests/it/common/mod.rs"]
mod common;
#[path = "support/measure.rs"]
mod measure;

use common::*;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::PostParams;
use measure::secs;
use pgop_api::cluster::MajorUpgradePhase;
use pgop_testenv::s3::{ACCESS_KEY, BUCKET, S3Server, SECRET_KEY};
use serde_json::json;
use std::time::{Duration, Instant};

const UPGRADE_TIMEOUT: Duration = Duration::from_secs(900);

struct Run {
    what: String,
    rows: i64,
    downtime: Duration,
    total: Duration,
    offline: Duration,
}

/// One cluster of three on 15 with `rows` rows, upgraded to 18 under a writer.
async fn upgrade_once(env: &Env, name: &str, rows: i64, store: Option<&str>) -> Result<Run> {
    let mut spec = json!({"replicas": 3, "storage": {"size": "2Gi"}});
    if let Some(endpoint) = store {
        spec["backup"] = json!({"store": {"s3": {
            "bucket": BUCKET, "endpoint": endpoint, "region": "us-east-1",
            "path": name, "credentialsSecret": {"name": "s3"}}}});
    }
    env.create(name, spec).await?;
    env.wait_ready(name, 3).await?;
    let password = env.password(name).await?;
    write_through_rw(
        env,
        name,
        &password,
        &format!(
            "create table acked(id bigint primary key);
             create table data (id bigint primary key, payload text);
             insert into data select i, repeat(md5(i::text), 2) from generate_series(1, {rows}) i"
        ),
    )
    .await?;
    let writer = Writer::start(env, name, &password);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let raised = Instant::now();
    env.patch(name, json!({"spec": {"postgresVersion": 18}}))
        .await?;
    let api = env.clusters_v1beta1();
    let mut stopping = None;
    let mut cloning = None;
    let deadline = Instant::now() + UPGRADE_TIMEOUT;
    loop {
        let phase = api
            .get(name)
            .await?
            .status
            .and_then(|s| s.major_upgrade)
            .map(|u| u.phase);
        match phase {
            Some(MajorUpgradePhase::Stopping | MajorUpgradePhase::Upgrading) => {
                stopping.get_or_insert_with(Instant::now);
            }
            Some(MajorUpgradePhase::Cloning) => {
                stopping.get_or_insert_with(Instant::now);
                cloning.get_or_insert_with(Instant::now);
            }
            Some(MajorUpgradePhase::Completed) => break,
            Some(MajorUpgradePhase::Failed) => {
                return Err(format!("{name}: the upgrade failed").into());
            }
            _ => {}
        }
        if Instant::now() > deadline {
            return Err(format!("{name}: no Completed within {UPGRADE_TIMEOUT:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let total = raised.elapsed();
    // A few commits on 18 before the writer stops, so the gap ends with one.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (acked, longest) = writer.stop_timed().await?;
    let primary = env.current_primary(name).await?;
    let c = connect(&env.pod_ip(&primary).await?, &password).await?;
    let stored: std::collections::HashSet<i64> = c
        .query("select id from acked", &[])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let lost = acked.iter().filter(|id| !stored.contains(id)).count();
    if lost > 0 {
        return Err(format!("{name}: {lost} acknowledged commits lost").into());
    }
    let count: i64 = c.query_one("select count(*) from data", &[]).await?.get(0);
    if count != rows {
        return Err(format!("{name}: {count} rows after the upgrade, {rows} before").into());
    }
    let offline = match (stopping, cloning) {
        (Some(s), Some(c)) => c.duration_since(s),
        _ => Duration::ZERO,
    };
    Ok(Run {
        what: if store.is_some() { "--link" } else { "--copy" }.to_string(),
        rows,
        downtime: longest.unwrap_or_default(),
        total,
        offline,
    })
}

#[tokio::main]
async fn main() -> Result {
    if pgop_instance::Binaries::for_major(18, None).is_err() {
        return Err("PostgreSQL 18 is not installed: run hack/install-postgres18.sh".into());
    }
    let env = start("bench-upgrade").await?;
    let s3 = S3Server::start(&env.plane.dir().join("s3-bench-upgrade"))?;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "s3"},
        "stringData": {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY},
    }))?;
    Api::<Secret>::namespaced(env.client.clone(), env.n())
        .create(&PostParams::default(), &secret)
        .await?;
    let (small, large) = (50_000, 500_000);
    let runs = vec![
        upgrade_once(&env, "copy-small", small, None).await?,
        upgrade_once(&env, "copy-large", large, None).await?,
        upgrade_once(&env, "link-large", large, Some(&s3.endpoint())).await?,
    ];
    env.stop().await?;

    println!();
    println!(
        "| mode | rows | write downtime | raise -> Completed | Pods stopped -> primary on 18 |"
    );
    println!("|---|---|---|---|---|");
    for r in &runs {
        println!(
            "| {} | {} | {} | {} | {} |",
            r.what,
            r.rows,
            secs(r.downtime),
            secs(r.total),
            secs(r.offline)
        );
    }
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(0.001);
    println!();
    println!(
        "downtime ratios: copy {large} rows / copy {small} rows = {:.2}; link / copy at {large} rows = {:.2}",
        ratio(runs[1].downtime, runs[0].downtime),
        ratio(runs[2].downtime, runs[1].downtime)
    );
    Ok(())
}
