//! Failover and switchover end to end: a real API server, the operator, the local node
//! running `pgop instance run` and real PostgreSQL. Each test has its own namespace and
//! control plane; they run one at a time.

use crate::common;

use common::*;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use pgop_api::cluster::ClusterPhase;
use pgop_api::constants::ANNOTATION_SWITCHOVER_TO;
use serde_json::json;
use std::time::Duration;

fn three(extra: serde_json::Value) -> serde_json::Value {
    let mut spec = json!({"replicas": 3, "storage": {"size": "1Gi"}});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    spec
}

/// Reasons of the Events recorded on `cluster`.
async fn event_reasons(env: &Env, cluster: &str) -> Result<Vec<String>> {
    let events: Api<Event> = Api::namespaced(env.client.clone(), env.n());
    Ok(events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(cluster))
        .filter_map(|e| e.reason)
        .collect())
}

async fn wait_event(env: &Env, cluster: &str, reason: &str) -> Result {
    pgop_testenv::wait::until(&format!("event {reason}"), TIMEOUT, || async {
        match event_reasons(env, cluster).await {
            Ok(r) if r.iter().any(|x| x == reason) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn e2e_failover_after_the_primary_is_killed_and_after_its_pod_is_deleted() -> Result {
    let _serial = SERIAL.lock().await;
    let env = start("failover").await?;
    env.create("ha", three(json!({}))).await?;
    env.wait_ready("ha", 3).await?;
    let password = env.password("ha").await?;
    write_through_rw(
        &env,
        "ha",
        &password,
        "create table t(id int primary key); insert into t select generate_series(1, 100)",
    )
    .await?;
    rows_everywhere(&env, "ha", &password, "t", 100).await?;

    // 1. kill -9 of the primary's postmaster; the old primary rejoins (pg_rewind).
    let (_, second) = fail_over_after_kill(&env, "ha", &password).await?;
    wait_event(&env, "ha", "FailoverStarted").await?;
    wait_event(&env, "ha", "FailoverCompleted").await?;

    // 2. Deleting the primary's pod, with an idle session open on it (a smart shutdown
    // would wait for it): the same, and the pod comes back as a standby.
    let idle = connect(&env.pod_ip(&second).await?, &password).await?;
    let deleted = std::time::Instant::now();
    env.delete_pod(&second).await?;
    let third = wait_new_primary(&env, "ha", &second).await?;
    let written = write_through_rw(&env, "ha", &password, "insert into t values (102)").await?;
    println!(
        "pod deletion -> new primary and a write through -rw: {:?} (write {written:?})",
        deleted.elapsed()
    );
    drop(idle);
    env.wait_ready("ha", 3).await?;
    assert_ne!(env.current_primary("ha").await?, second);
    assert_eq!(env.rw("ha"), Some(env.pod_ip(&third).await?));
    rows_everywhere(&env, "ha", &password, "t", 102).await?;
    env.stop().await
}

/// Synchronous failovers under a writer in the suite; the HA benchmark
/// (`cargo bench -p pgop --bench ha`) repeats them ten times and reports the commits lost.
const SYNCHRONOUS_ROUNDS: usize = 4;

#[tokio::test]
async fn e2e_synchronous_failovers_lose_no_acknowledged_commit() -> Result {
    let _serial = SERIAL.lock().await;
    let env = start("sync").await?;
    env.create(
        "sync",
        three(json!({"replication": {"synchronous": 1, "dataDurability": "required"}})),
    )
    .await?;
    env.wait_ready("sync", 3).await?;
    let password = env.password("sync").await?;
    write_through_rw(
        &env,
        "sync",
        &password,
        "create table acked(id bigint primary key)",
    )
    .await?;
    let writer = Writer::start(&env, "sync", &password);
    let mut primaries = Vec::new();
    for round in 1..=SYNCHRONOUS_ROUNDS {
        let primary = env.current_primary("sync").await?;
        // Let the writer commit on this primary first.
        let before = count_on(&env.pod_ip(&primary).await?, &password, "acked").await?;
        pgop_testenv::wait::until(&format!("round {round}: writes"), TIMEOUT, || async {
            match count_on(
                &env.pod_ip(&primary).await.map_err(|e| e.to_string())?,
                &password,
                "acked",
            )
            .await
            {
                Ok(n) if n > before + 20 => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await?;
        env.kill_postmaster(&primary, &password).await?;
        let next = wait_new_primary(&env, "sync", &primary).await?;
        primaries.push(next);
        env.wait_ready("sync", 3).await?;
    }
    let acked = writer.stop().await?;
    let primary = env.current_primary("sync").await?;
    let c = connect(&env.pod_ip(&primary).await?, &password).await?;
    let rows = c.query("select id from acked", &[]).await?;
    let stored: std::collections::HashSet<i64> = rows.iter().map(|r| r.get(0)).collect();
    let lost: Vec<&i64> = acked.iter().filter(|id| !stored.contains(id)).collect();
    println!(
        "{SYNCHRONOUS_ROUNDS} failovers ({}): {} acknowledged commits, {} lost",
        primaries.join(" -> "),
        acked.len(),
        lost.len()
    );
    // Each round waits for more than 20 commits on the primary it then kills.
    assert!(
        acked.len() > 20 * SYNCHRONOUS_ROUNDS,
        "the writer kept writing: {}",
        acked.len()
    );
    assert!(lost.is_empty(), "acknowledged commits lost: {lost:?}");
    env.stop().await
}

#[tokio::test]
async fn e2e_switchover_on_request_and_a_refused_request() -> Result {
    let _serial = SERIAL.lock().await;
    let env = start("switchover").await?;
    env.create("sw", three(json!({}))).await?;
    let ready = env.wait_ready("sw", 3).await?;
    let password = env.password("sw").await?;
    write_through_rw(
        &env,
        "sw",
        &password,
        "create table t(id int); insert into t select generate_series(1, 50)",
    )
    .await?;
    let status = ready.status.ok_or("no status")?;
    let old = status.current_primary.clone().ok_or("no primary")?;
    let to = status
        .instances
        .iter()
        .map(|i| i.name.clone())
        .find(|n| *n != old)
        .ok_or("no standby")?;
    rows_everywhere(&env, "sw", &password, "t", 50).await?;

    env.patch(
        "sw",
        json!({"metadata": {"annotations": {ANNOTATION_SWITCHOVER_TO: to}}}),
    )
    .await?;
    let started = std::time::Instant::now();
    let now = wait_new_primary(&env, "sw", &old).await?;
    assert_eq!(now, to);
    let took = write_through_rw(&env, "sw", &password, "insert into t values (51)").await?;
    println!(
        "switchover {old} -> {to}: first write through -rw after {:?}",
        started.elapsed().max(took)
    );
    let c = env.clusters().get("sw").await?;
    assert!(
        !c.annotations_contains(ANNOTATION_SWITCHOVER_TO),
        "the request is removed once acted on"
    );
    env.wait_ready("sw", 3).await?;
    rows_everywhere(&env, "sw", &password, "t", 51).await?;
    wait_event(&env, "sw", "SwitchoverCompleted").await?;

    // A request for something that is not a standby of this cluster is refused by name.
    env.patch(
        "sw",
        json!({"metadata": {"annotations": {ANNOTATION_SWITCHOVER_TO: "sw-99"}}}),
    )
    .await?;
    wait_event(&env, "sw", "SwitchoverRefused").await?;
    env.wait_cluster("sw", "the refused request removed", TIMEOUT, |_| true)
        .await?;
    pgop_testenv::wait::until("the annotation removed", TIMEOUT, || async {
        match env.clusters().get("sw").await {
            Ok(c) if !c.annotations_contains(ANNOTATION_SWITCHOVER_TO) => Ok(()),
            other => Err(format!("{:?}", other.map(|c| c.metadata.annotations))),
        }
    })
    .await?;
    assert_eq!(env.current_primary("sw").await?, to);
    env.stop().await
}

trait Annotated {
    fn annotations_contains(&self, key: &str) -> bool;
}

impl Annotated for pgop_api::PostgresCluster {
    fn annotations_contains(&self, key: &str) -> bool {
        self.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(key))
    }
}

#[tokio::test]
async fn e2e_an_operator_killed_during_a_failover_completes_it_after_restart() -> Result {
    let _serial = SERIAL.lock().await;
    let mut env = start("resume").await?;
    env.create("rs", three(json!({}))).await?;
    env.wait_ready("rs", 3).await?;
    let password = env.password("rs").await?;
    write_through_rw(&env, "rs", &password, "create table t(id int)").await?;
    let old = env.current_primary("rs").await?;
    env.kill_postmaster(&old, &password).await?;
    // Kill the operator as soon as it has chosen the new primary.
    let api = env.clusters();
    let started = std::time::Instant::now();
    let target = loop {
        let s = api.get("rs").await?.status.unwrap_or_default();
        if let Some(t) = s.target_primary.filter(|t| *t != old) {
            assert_eq!(
                s.current_primary.as_deref(),
                Some(old.as_str()),
                "the failover finished before the test could interrupt it"
            );
            break t;
        }
        if started.elapsed() > TIMEOUT {
            return Err("no failover started".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    env.kill_operator().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let s = api.get("rs").await?.status.unwrap_or_default();
    assert_eq!(s.phase, Some(ClusterPhase::FailingOver));
    assert_eq!(s.current_primary.as_deref(), Some(old.as_str()));
    assert_eq!(s.target_primary.as_deref(), Some(target.as_str()));
    assert_eq!(
        env.rw("rs"),
        None,
        "no primary is published while failing over"
    );

    env.start_operator();
    let now = wait_new_primary(&env, "rs", &old).await?;
    assert_eq!(
        now, target,
        "the restarted operator finishes the same failover"
    );
    write_through_rw(&env, "rs", &password, "insert into t values (1)").await?;
    env.wait_ready("rs", 3).await?;
    env.stop().await
}

/// Sets `parameter` in the spec of the 3-instance cluster `name` and waits until every
/// instance runs with `value`.
async fn set_everywhere(
    env: &Env,
    name: &str,
    password: &str,
    parameter: &str,
    value: &str,
) -> Result {
    env.patch(
        name,
        json!({"spec": {"postgresql": {"parameters": {parameter: value}}}}),
    )
    .await?;
    let what = format!("{parameter} {value} everywhere");
    pgop_testenv::wait::until(&what, TIMEOUT, || async {
        match shown_everywhere(env, name, password, parameter).await {
            Ok(v) if v.len() == 3 && v.iter().all(|s| s == value) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await?;
    Ok(())
}

/// `show <parameter>` on every instance.
async fn shown_everywhere(
    env: &Env,
    name: &str,
    password: &str,
    parameter: &str,
) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for (_, ip) in env.pod_ips(name).await? {
        let c = connect(&ip, password).await?;
        let row = c.query_one(&format!("show {parameter}"), &[]).await?;
        out.push(row.get::<_, String>(0));
    }
    Ok(out)
}

#[tokio::test]
async fn e2e_rolling_updates_go_standbys_first_with_one_switchover() -> Result {
    let _serial = SERIAL.lock().await;
    let env = start("rolling").await?;
    env.create("roll", three(json!({}))).await?;
    env.wait_ready("roll", 3).await?;
    let password = env.password("roll").await?;
    write_through_rw(
        &env,
        "roll",
        &password,
        "create table t(id int); insert into t values (1)",
    )
    .await?;
    let first = env.current_primary("roll").await?;

    // 1. A parameter PostgreSQL applies only at start.
    set_everywhere(&env, "roll", &password, "shared_buffers", "48MB").await?;
    let second = env.wait_ready("roll", 3).await?;
    let second = second
        .status
        .and_then(|s| s.current_primary)
        .ok_or("no primary")?;
    assert_ne!(
        second, first,
        "the primary was switched over, not restarted in place"
    );
    let events = events_in_order(&env, "roll").await?;
    let restarts: Vec<&(String, String)> = events
        .iter()
        .filter(|(r, _)| r == "RollingRestart")
        .collect();
    let switchovers = events
        .iter()
        .filter(|(r, _)| r == "SwitchoverStarted")
        .count();
    assert_eq!(switchovers, 1, "{events:?}");
    assert_eq!(
        restarts.len(),
        2,
        "the two standbys, one at a time: {events:?}"
    );
    assert!(
        restarts
            .iter()
            .all(|(_, m)| !m.contains(&format!("{first} "))),
        "the primary is never restarted in place: {events:?}"
    );
    write_through_rw(&env, "roll", &password, "insert into t values (2)").await?;

    // 2. A Pod change (the image): every Pod replaced, standbys first, one switchover.
    env.patch("roll", json!({"spec": {"image": "pgop:next"}}))
        .await?;
    pgop_testenv::wait::until("every pod on the new image", TIMEOUT, || async {
        let pods = env
            .pods()
            .list(&kube::api::ListParams::default().labels("database.example.com/cluster=roll"))
            .await
            .map_err(|e| e.to_string())?;
        let images: Vec<Option<String>> = pods
            .items
            .iter()
            .map(|p| {
                p.spec
                    .as_ref()
                    .and_then(|s| s.containers.first())
                    .and_then(|c| c.image.clone())
            })
            .collect();
        if images.len() == 3 && images.iter().all(|i| i.as_deref() == Some("pgop:next")) {
            Ok(())
        } else {
            Err(format!("{images:?}"))
        }
    })
    .await?;
    let third = env.wait_ready("roll", 3).await?;
    let third = third
        .status
        .and_then(|s| s.current_primary)
        .ok_or("no primary")?;
    assert_ne!(third, second);
    let events = events_in_order(&env, "roll").await?;
    assert_eq!(
        events.iter().filter(|(r, _)| r == "RollingUpdate").count(),
        3,
        "{events:?}"
    );
    assert_eq!(
        events
            .iter()
            .filter(|(r, _)| r == "SwitchoverStarted")
            .count(),
        2,
        "{events:?}"
    );
    write_through_rw(&env, "roll", &password, "insert into t values (3)").await?;
    rows_everywhere(&env, "roll", &password, "t", 3).await?;

    // 3. Lowering max_connections: a standby restarted first would refuse to start below
    // its primary's value, so the primary restarts first, in place, without a failover.
    set_everywhere(&env, "roll", &password, "max_connections", "80").await?;
    let fourth = env.wait_ready("roll", 3).await?;
    assert_eq!(
        fourth.status.and_then(|s| s.current_primary).as_deref(),
        Some(third.as_str()),
        "the primary stays"
    );
    // The primary's postmaster started before either standby's (Events of one reason about
    // one instance fold into one series, so they cannot tell the order here).
    let mut started: Vec<(f64, String)> = start_times(&env, "roll", &password)
        .await?
        .into_iter()
        .map(|(name, at)| (at, name))
        .collect();
    started.sort_by(|a, b| a.0.total_cmp(&b.0));
    assert_eq!(
        started.first().map(|(_, n)| n.as_str()),
        Some(third.as_str()),
        "the primary restarted first: {started:?}"
    );
    let events = events_in_order(&env, "roll").await?;
    for reason in ["FailoverStarted", "SwitchoverFailed"] {
        assert!(!events.iter().any(|(r, _)| r == reason), "{events:?}");
    }
    assert_eq!(
        events
            .iter()
            .filter(|(r, _)| r == "SwitchoverStarted")
            .count(),
        2,
        "{events:?}"
    );
    write_through_rw(&env, "roll", &password, "insert into t values (4)").await?;
    rows_everywhere(&env, "roll", &password, "t", 4).await?;
    env.stop().await
}

/// (reason, note) of the cluster's Events, oldest first.
async fn events_in_order(env: &Env, cluster: &str) -> Result<Vec<(String, String)>> {
    let events: Api<Event> = Api::namespaced(env.client.clone(), env.n());
    let mut list: Vec<Event> = events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(cluster))
        .collect();
    list.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
    Ok(list
        .into_iter()
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect())
}
