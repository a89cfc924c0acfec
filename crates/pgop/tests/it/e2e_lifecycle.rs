//! Fencing, restarts of single instances and hibernation on request, end to end on the
//! local node with real PostgreSQL: `spec.fencedInstances` stops PostgreSQL in the named
//! instances while their Pods keep running, a fenced primary is not failed over, and
//! unfencing brings every instance back with no row lost; the restart-instance annotation
//! restarts a standby alone, and a primary after a switchover; `spec.hibernate` deletes the
//! Pods (the volumes, Services and Secrets stay) and resuming brings the same data back
//! with the same primary.

use crate::common;

use common::*;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Service};
use kube::api::{Api, ListParams};
use pgop_api::cluster::ClusterPhase;
use pgop_api::conditions;
use serde_json::json;
use std::time::Duration;

/// The condition `type_` of the cluster's status, as (status, reason).
fn condition(s: &pgop_api::PostgresClusterStatus, type_: &str) -> Option<(String, String)> {
    conditions::find_condition(&s.conditions, type_).map(|c| (c.status.clone(), c.reason.clone()))
}

fn fenced(s: &pgop_api::PostgresClusterStatus, instance: &str) -> bool {
    s.instances
        .iter()
        .any(|i| i.name == instance && i.fenced && !i.ready)
}

/// Asks for a restart of `instances` (the annotation's value).
async fn annotate_restart(env: &Env, name: &str, instances: &str) -> Result {
    env.patch(
        name,
        json!({"metadata": {"annotations": {
            pgop_api::constants::ANNOTATION_RESTART_INSTANCE: instances
        }}}),
    )
    .await
}

#[tokio::test]
async fn e2e_fencing_instance_restarts_and_hibernation_keep_every_row() -> Result {
    let _serial = SERIAL.lock().await;
    let env = start("lifecycle").await?;
    let name = "life";
    env.create(
        name,
        json!({"replicas": 2, "failoverDelay": 1, "storage": {"size": "1Gi"}}),
    )
    .await?;
    env.wait_ready(name, 2).await?;
    let password = env.password(name).await?;
    let primary = env.current_primary(name).await?;
    let standby = if primary == "life-1" {
        "life-2"
    } else {
        "life-1"
    };
    write_through_rw(
        &env,
        name,
        &password,
        "create table t(id int primary key); insert into t select generate_series(1, 100)",
    )
    .await?;
    rows_everywhere(&env, name, &password, "t", 100).await?;

    // Fence the standby: PostgreSQL stops there, its Pod stays, the primary serves on.
    env.patch(name, json!({"spec": {"fencedInstances": [standby]}}))
        .await?;
    env.wait_cluster(name, "the standby fenced", TIMEOUT, |s| fenced(s, standby))
        .await?;
    let standby_ip = env.pod_ip(standby).await?;
    assert!(
        connect(&standby_ip, &password).await.is_err(),
        "PostgreSQL of the fenced {standby} still takes connections"
    );
    write_through_rw(
        &env,
        name,
        &password,
        "insert into t select generate_series(101, 200)",
    )
    .await?;

    // Unfenced, the standby catches up.
    env.patch(name, json!({"spec": {"fencedInstances": []}}))
        .await?;
    env.wait_ready(name, 2).await?;
    rows_everywhere(&env, name, &password, "t", 200).await?;

    // Fence the primary alone: it is down on purpose, so the standby, streaming and
    // promotable, does not take over, however long past failoverDelay (1 s);
    // PrimaryAvailable says why.
    env.patch(name, json!({"spec": {"fencedInstances": [primary]}}))
        .await?;
    env.wait_cluster(name, "the primary fenced", TIMEOUT, |s| {
        fenced(s, &primary)
            && condition(s, conditions::PRIMARY_AVAILABLE)
                == Some((conditions::FALSE.into(), "Fenced".into()))
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let c = env.clusters_v1beta1().get(name).await?;
    let s = c.status.ok_or("no status")?;
    assert_eq!(s.target_primary.as_deref(), Some(primary.as_str()), "{s:?}");
    assert_eq!(
        s.current_primary.as_deref(),
        Some(primary.as_str()),
        "{s:?}"
    );
    assert!(env.pods().get_opt(&primary).await?.is_some());

    // Unfenced, the primary comes back as the primary, every row with it.
    env.patch(name, json!({"spec": {"fencedInstances": []}}))
        .await?;
    env.wait_ready(name, 2).await?;
    assert_eq!(env.current_primary(name).await?, primary);
    rows_everywhere(&env, name, &password, "t", 200).await?;

    // Restart one instance on request: the standby alone, in place; a name that is no
    // instance is refused; the annotation is removed once recorded.
    let before = start_times(&env, name, &password).await?;
    annotate_restart(&env, name, &format!("{standby}, {name}-9")).await?;
    eventually("the standby restarted", TIMEOUT, || async {
        let now = start_times(&env, name, &password).await.ok()?;
        (now.get(standby)? > before.get(standby)?).then_some(())
    })
    .await;
    env.wait_event("RestartRequested").await?;
    let refused = env.wait_event("RestartRefused").await?;
    assert!(refused.contains(&format!("\"{name}-9\"")), "{refused}");
    env.wait_ready(name, 2).await?;
    let after = start_times(&env, name, &password).await?;
    assert_eq!(
        after.get(&primary),
        before.get(&primary),
        "the primary was restarted"
    );
    let c = env.clusters_v1beta1().get(name).await?;
    assert!(
        !c.metadata
            .annotations
            .unwrap_or_default()
            .contains_key(pgop_api::constants::ANNOTATION_RESTART_INSTANCE)
    );
    // The primary: a switchover first, then it restarts as a standby.
    annotate_restart(&env, name, &primary).await?;
    let new_primary = wait_new_primary(&env, name, &primary).await?;
    assert_eq!(new_primary, standby);
    eventually("the old primary restarted", TIMEOUT, || async {
        let now = start_times(&env, name, &password).await.ok()?;
        (now.get(&primary)? > after.get(&primary)?).then_some(())
    })
    .await;
    env.wait_ready(name, 2).await?;
    env.wait_cluster(name, "no restart left to do", TIMEOUT, |s| {
        s.instance_restarts.is_empty() && s.restart_instance.is_none()
    })
    .await?;
    rows_everywhere(&env, name, &password, "t", 200).await?;
    let primary = new_primary;

    // Hibernate: the Pods go, the primary's first; the volumes and Services stay.
    env.patch(name, json!({"spec": {"hibernate": true}}))
        .await?;
    let hibernated = env
        .wait_cluster(name, "Hibernated", TIMEOUT, |s| {
            s.phase == Some(ClusterPhase::Hibernated)
        })
        .await?;
    let s = hibernated.status.ok_or("no status")?;
    assert_eq!(s.current_primary.as_deref(), Some(primary.as_str()));
    assert_eq!(
        condition(&s, conditions::HIBERNATED),
        Some((conditions::TRUE.into(), "Hibernated".into()))
    );
    assert_eq!(s.ready_replicas, 0);
    let selector = format!("database.example.com/cluster={name}");
    let pods = env
        .pods()
        .list(&ListParams::default().labels(&selector))
        .await?;
    assert!(pods.items.is_empty(), "pods left: {:?}", pods.items.len());
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(env.client.clone(), env.n());
    let claims = claims
        .list(&ListParams::default().labels(&selector))
        .await?;
    assert_eq!(claims.items.len(), 2, "the volumes are kept");
    let services: Api<Service> = Api::namespaced(env.client.clone(), env.n());
    assert!(services.get_opt(&format!("{name}-rw")).await?.is_some());
    env.wait_event("Hibernated").await?;

    // Resume: the same primary, the same rows, writable again.
    env.patch(name, json!({"spec": {"hibernate": false}}))
        .await?;
    let resumed = env.wait_ready(name, 2).await?;
    let s = resumed.status.ok_or("no status")?;
    assert_eq!(s.current_primary.as_deref(), Some(primary.as_str()));
    assert_eq!(
        condition(&s, conditions::HIBERNATED),
        Some((conditions::FALSE.into(), "Resumed".into()))
    );
    rows_everywhere(&env, name, &password, "t", 200).await?;
    write_through_rw(
        &env,
        name,
        &password,
        "insert into t select generate_series(201, 300)",
    )
    .await?;
    rows_everywhere(&env, name, &password, "t", 300).await?;
    env.stop().await
}
