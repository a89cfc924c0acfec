//! The HA benchmark: `cargo bench -p pgop --bench ha` prints a table of
//! - time from `apply` to Ready for a 1- and a 3-instance cluster;
//! - failover RTO: the primary's postmaster killed (kill -9) -> first write accepted
//!   through `-rw` by a client opening a new connection, asynchronous and synchronous
//!   (`dataDurability: required`) replication, median and max over 10 runs each;
//! - switchover: request (annotation) -> first write accepted through `-rw`;
//! - pod deletion: the primary's Pod deleted (`kubectl delete pod`, with an idle session
//!   connected to it) -> first write accepted through `-rw` by the new primary;
//! - commits lost: a writer commits through `-rw` during the synchronous failovers and
//!   every acknowledged commit is looked up on the final primary.
//!
//! Everything is real: API server, operator, local node, PostgreSQL. Run it on an
//! otherwise idle machine; the figures are wall-clock times on this machine.

#[path = "../tests/it/common/mod.rs"]
mod common;
#[path = "support/measure.rs"]
mod measure;

use common::*;
use measure::secs;
use pgop_api::constants::ANNOTATION_SWITCHOVER_TO;
use serde_json::json;
use std::time::{Duration, Instant};

const RUNS: usize = 10;

fn stats(v: &[Duration]) -> (Duration, Duration) {
    let mut s = v.to_vec();
    s.sort();
    let median = s.get(s.len() / 2).copied().unwrap_or_default();
    let max = s.last().copied().unwrap_or_default();
    (median, max)
}

async fn apply_to_ready(env: &Env, name: &str, replicas: i32) -> Result<Duration> {
    let started = Instant::now();
    env.create(
        name,
        json!({"replicas": replicas, "storage": {"size": "1Gi"}}),
    )
    .await?;
    env.wait_ready(name, replicas).await?;
    Ok(started.elapsed())
}

async fn delete(env: &Env, name: &str) -> Result {
    env.clusters()
        .delete(name, &kube::api::DeleteParams::foreground())
        .await?;
    let api = env.clusters();
    pgop_testenv::wait::until("cluster deleted", TIMEOUT, || async {
        match api.get_opt(name).await {
            Ok(None) => Ok(()),
            other => Err(format!("{:?}", other.map(|c| c.is_some()))),
        }
    })
    .await?;
    Ok(())
}

/// Kills the primary's postmaster and times the first write accepted through `-rw`.
async fn failover_once(env: &Env, name: &str, password: &str) -> Result<Duration> {
    let primary = env.current_primary(name).await?;
    env.kill_postmaster(&primary, password).await?;
    let rto = write_through_rw(env, name, password, "insert into probe values (default)").await?;
    env.wait_ready(name, 3).await?;
    Ok(rto)
}

#[tokio::main]
async fn main() -> Result {
    // `cargo bench` passes --bench; a filter argument runs nothing else here.
    let env = start("bench").await?;
    let mut rows: Vec<(String, String, String, String)> = Vec::new();

    let mut one = Vec::new();
    let mut three = Vec::new();
    for i in 0..3 {
        one.push(apply_to_ready(&env, &format!("one{i}"), 1).await?);
        delete(&env, &format!("one{i}")).await?;
        three.push(apply_to_ready(&env, &format!("three{i}"), 3).await?);
        delete(&env, &format!("three{i}")).await?;
    }
    for (what, v) in [
        ("apply -> Ready, 1 instance", &one),
        ("apply -> Ready, 3 instances", &three),
    ] {
        let (median, max) = stats(v);
        rows.push((what.into(), v.len().to_string(), secs(median), secs(max)));
    }

    // Asynchronous replication: failover RTO, then switchovers.
    env.create("async", json!({"replicas": 3, "storage": {"size": "1Gi"}}))
        .await?;
    env.wait_ready("async", 3).await?;
    let password = env.password("async").await?;
    write_through_rw(
        &env,
        "async",
        &password,
        "create table probe(id serial primary key)",
    )
    .await?;
    let mut rto = Vec::new();
    for _ in 0..RUNS {
        rto.push(failover_once(&env, "async", &password).await?);
    }
    let (median, max) = stats(&rto);
    rows.push((
        "failover RTO, async (kill -9 -> write via -rw)".into(),
        RUNS.to_string(),
        secs(median),
        secs(max),
    ));
    let mut switchovers = Vec::new();
    for _ in 0..5 {
        let c = env.wait_ready("async", 3).await?;
        let status = c.status.ok_or("no status")?;
        let current = status.current_primary.clone().ok_or("no primary")?;
        let to = status
            .instances
            .iter()
            .map(|i| i.name.clone())
            .find(|n| *n != current)
            .ok_or("no standby")?;
        let started = Instant::now();
        env.patch(
            "async",
            json!({"metadata": {"annotations": {ANNOTATION_SWITCHOVER_TO: to}}}),
        )
        .await?;
        env.wait_cluster("async", "switchover", TIMEOUT, |s| {
            s.current_primary.as_deref() == Some(to.as_str())
        })
        .await?;
        write_through_rw(
            &env,
            "async",
            &password,
            "insert into probe values (default)",
        )
        .await?;
        switchovers.push(started.elapsed());
    }
    env.wait_ready("async", 3).await?;
    let (median, max) = stats(&switchovers);
    rows.push((
        "switchover (request -> write via -rw)".into(),
        switchovers.len().to_string(),
        secs(median),
        secs(max),
    ));
    let mut deletions = Vec::new();
    for _ in 0..5 {
        let c = env.wait_ready("async", 3).await?;
        let primary = c
            .status
            .and_then(|s| s.current_primary)
            .ok_or("no primary")?;
        // An idle session on the primary: a smart shutdown would wait for it.
        let old_ip = env.pod_ip(&primary).await?;
        let idle = connect(&old_ip, &password).await?;
        let started = Instant::now();
        env.delete_pod(&primary).await?;
        // The old primary keeps taking writes until its shutdown begins: the clock stops at
        // the first write accepted by the new one.
        loop {
            if let Some(rw) = env.rw("async")
                && rw != old_ip
                && let Ok(c) = connect_within(&rw, &password, Duration::from_millis(500)).await
                && c.batch_execute("insert into probe values (default)")
                    .await
                    .is_ok()
            {
                break;
            }
            if started.elapsed() > TIMEOUT {
                return Err("no write on a new primary after the pod deletion".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        deletions.push(started.elapsed());
        drop(idle);
    }
    env.wait_ready("async", 3).await?;
    let (median, max) = stats(&deletions);
    rows.push((
        "pod deletion of the primary, idle session open (delete -> write via -rw on the new primary)".into(),
        deletions.len().to_string(),
        secs(median),
        secs(max),
    ));
    delete(&env, "async").await?;

    // Synchronous replication, dataDurability required: RTO and commits lost.
    env.create(
        "sync",
        json!({"replicas": 3, "storage": {"size": "1Gi"}, "replication": {"synchronous": 1, "dataDurability": "required"}}),
    )
    .await?;
    env.wait_ready("sync", 3).await?;
    let password = env.password("sync").await?;
    write_through_rw(
        &env,
        "sync",
        &password,
        "create table probe(id serial primary key); create table acked(id bigint primary key)",
    )
    .await?;
    let writer = Writer::start(&env, "sync", &password);
    let mut rto = Vec::new();
    for _ in 0..RUNS {
        tokio::time::sleep(Duration::from_millis(500)).await;
        rto.push(failover_once(&env, "sync", &password).await?);
    }
    let acked = writer.stop().await?;
    let primary = env.current_primary("sync").await?;
    let c = connect(&env.pod_ip(&primary).await?, &password).await?;
    let stored: std::collections::HashSet<i64> = c
        .query("select id from acked", &[])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let lost = acked.iter().filter(|id| !stored.contains(id)).count();
    let (median, max) = stats(&rto);
    rows.push((
        "failover RTO, sync required".into(),
        RUNS.to_string(),
        secs(median),
        secs(max),
    ));
    rows.push((
        "commits lost in sync failovers (acknowledged / lost)".into(),
        RUNS.to_string(),
        acked.len().to_string(),
        lost.to_string(),
    ));
    delete(&env, "sync").await?;
    env.stop().await?;

    println!();
    println!("| measurement | runs | median | max |");
    println!("|---|---|---|---|");
    for (what, runs, median, max) in rows {
        println!("| {what} | {runs} | {median} | {max} |");
    }
    Ok(())
}
