//! Faults that only real nodes can show (issue 13): a node that hangs, comes back or is
//! deleted; a killed container, deleted Pods; network partitions; a node drain. Three
//! workload nodes and an infrastructure node (operator, CoreDNS and the clients, so that
//! the fault does not take them too), pgop installed by its chart, a writer Pod writing
//! through `-rw` by DNS name. Needs root.

use crate::real;

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::api::DeleteParams;
use pgop_testenv::real_nodes::Cut;
use real::{
    RealEnv, Result, SERIAL, Writer, events, eventually, operator_log, start_writer,
    start_writer_on,
};
use serde_json::json;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hung_primary_node_fails_over_within_the_lease_loses_no_commit_and_rejoins() -> Result {
    let _serial = SERIAL.lock().await;
    let ns = "faults";
    let (env, cluster) = real::synchronous_cluster_on_three_nodes(ns).await?;
    let status = cluster.status.unwrap_or_default();
    let old_primary = status.current_primary.ok_or("no primary")?;
    let mut placed = Vec::new();
    for i in &status.instances {
        placed.push(env.node_of(ns, &i.name).await?);
    }
    placed.sort();
    placed.dedup();
    assert_eq!(
        placed.len(),
        3,
        "one instance per workload node: {placed:?}"
    );
    let primary_node = env.node_of(ns, &old_primary).await?;
    let index = env
        .nodes
        .index_of(&primary_node)
        .ok_or("the primary's node")?;
    println!(
        "cluster Ready at {:.1?}; primary {old_primary} on {primary_node}",
        env.started.elapsed()
    );

    let writer = start_writer(&env, ns, "db", "w").await?;
    tokio::time::sleep(Duration::from_secs(3)).await;

    // The primary's node hangs: kubelet, containerd, PostgreSQL and its manager stop where
    // they are, without a clean shutdown.
    let fault = now();
    env.nodes.freeze(index)?;
    let new_primary = new_primary_after(&env, ns, &old_primary).await;
    let promoted = now() - fault;
    let first_write = writer.first_write_after(&env.nodes, fault).await;
    println!(
        "node hung → {new_primary} primary in {promoted:.1} s, first write through -rw acknowledged {:.1} s after the fault",
        first_write.end - fault
    );
    // Let the writer go on against the new primary for a while, with the old one frozen.
    tokio::time::sleep(Duration::from_secs(3)).await;

    // The node comes back: the old primary lost its Lease while it hung and must rejoin
    // as a standby of the new primary (pg_rewind), not serve a single write.
    env.nodes.thaw(index)?;
    let back = env.wait_ready(ns, "db", 3, Duration::from_secs(180)).await;
    let back = back.status.unwrap_or_default();
    assert_eq!(back.current_primary.as_deref(), Some(new_primary.as_str()));
    println!("{old_primary} rejoined as a standby; cluster Ready again");

    // The new primary's node hangs too, and is not coming back: it is powered off and
    // deleted. The instance whose volume was on it is recreated on a remaining node.
    let (mut env, second) = (env, new_primary);
    let lost_node = env.node_of(ns, &second).await?;
    let lost = env.nodes.index_of(&lost_node).ok_or("the node")?;
    let fault = now();
    env.nodes.freeze(lost)?;
    let third = new_primary_after(&env, ns, &second).await;
    let first_write = writer.first_write_after(&env.nodes, fault).await;
    println!(
        "node hung again → {third} primary, first write {:.1} s after the fault",
        first_write.end - fault
    );
    env.nodes.power_off(lost)?;
    let deleted = now();
    Api::<Node>::all(env.client.clone())
        .delete(&lost_node, &DeleteParams::default())
        .await?;
    let back = env.wait_ready(ns, "db", 3, Duration::from_secs(300)).await;
    let status = back.status.unwrap_or_default();
    let mut placed = Vec::new();
    for i in &status.instances {
        placed.push((i.name.clone(), env.node_of(ns, &i.name).await?));
    }
    assert!(
        placed.iter().all(|(_, node)| *node != lost_node),
        "an instance is still on the deleted node: {placed:?}"
    );
    assert!(
        !placed.iter().any(|(name, _)| *name == second),
        "{second} should have been recreated as a new instance: {placed:?}"
    );
    let lost_events = events(&env, ns, "db", "VolumeLost").await?;
    assert!(
        lost_events.iter().any(|m| m.contains(&second)),
        "no VolumeLost Event about {second}: {lost_events:?}"
    );
    println!(
        "node {lost_node} deleted → a new instance cloned on a remaining node, cluster Ready \
         with 3 instances {:.1} s after the deletion: {placed:?}",
        now() - deleted
    );

    real::assert_no_acknowledged_write_lost(&env, ns, &writer).await?;
    Ok(())
}

/// Waits for a primary other than `old` in the status of cluster `db`.
async fn new_primary_after(env: &RealEnv, ns: &str, old: &str) -> String {
    let clusters = env.clusters(ns);
    eventually(
        &format!("a new primary instead of {old}"),
        Duration::from_secs(120),
        || async {
            let s = clusters
                .get("db")
                .await
                .map_err(|e| e.to_string())?
                .status
                .unwrap_or_default();
            match s.current_primary {
                Some(p) if p != old => Ok(p),
                other => Err(format!("primary {other:?}, phase {:?}", s.phase)),
            }
        },
    )
    .await
}

/// SIGKILL to the instance container of `pod` on node `index` (its init, the instance
/// manager, takes PostgreSQL with it), as the OOM killer or a crash would; returns when.
/// Stops the Pod's running `postgres` container at once (SIGKILL); returns when it was
/// asked to and when the stop had returned. A write that started in between may still
/// have reached the dying server, so recovery is only read from writes started after.
async fn kill_container(env: &RealEnv, index: usize, pod: &str) -> Result<(f64, f64)> {
    let label = format!("io.kubernetes.pod.name={pod}");
    let id = eventually(
        &format!("a running container of {pod}"),
        Duration::from_secs(120),
        || async {
            let id = env
                .nodes
                .crictl(
                    index,
                    &["ps", "-q", "--name", "postgres", "--label", &label],
                )
                .map_err(|e| e.to_string())?;
            let id = id.trim().to_string();
            if id.is_empty() {
                Err("none".to_string())
            } else {
                Ok(id)
            }
        },
    )
    .await;
    let fault = now();
    env.nodes.crictl(index, &["stop", "--timeout", "0", &id])?;
    Ok((fault, now()))
}

/// Fault at `fault`, done (its command returned) at `done`; then writes through `-rw`
/// resume and the cluster is Ready again with every instance. Returns (seconds from the
/// fault to the first acknowledged write started after it was done, the primary
/// afterwards).
async fn recover(
    env: &RealEnv,
    ns: &str,
    writer: &Writer,
    (fault, done): (f64, f64),
) -> (f64, String) {
    let first = writer.first_write_after(&env.nodes, done).await;
    let ready = env.wait_ready(ns, "db", 3, Duration::from_secs(180)).await;
    let primary = ready
        .status
        .and_then(|s| s.current_primary)
        .unwrap_or_default();
    (first.end - fault, primary)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_container_a_deleted_and_a_force_deleted_primary_pod_hand_over_and_rejoin()
-> Result {
    let _serial = SERIAL.lock().await;
    let ns = "pods";
    let (env, ready) = real::synchronous_cluster_on_three_nodes(ns).await?;
    let mut primary = ready
        .status
        .and_then(|s| s.current_primary)
        .ok_or("no primary")?;
    let writer = start_writer(&env, ns, "db", "p").await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pods = env.pods(ns);

    // The PostgreSQL container is killed.
    let node = env
        .nodes
        .index_of(&env.node_of(ns, &primary).await?)
        .ok_or("node")?;
    let killed = primary.clone();
    let fault = kill_container(&env, node, &killed).await?;
    let (first, after) = recover(&env, ns, &writer, fault).await;
    println!("container of {killed} killed → first write {first:.1} s after; primary now {after}");

    // Killed again once it is the primary again: the kubelet now restarts the container
    // only after a back-off, so its manager cannot release the Lease at start; the
    // operator, seeing the kubelet report the container stopped, releases it.
    env.clusters(ns)
        .patch(
            "db",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"annotations": {
                pgop_api::constants::ANNOTATION_SWITCHOVER_TO: killed
            }}})),
        )
        .await?;
    eventually(
        "the killed instance is the primary again",
        Duration::from_secs(120),
        || async {
            let c = env
                .clusters(ns)
                .get("db")
                .await
                .map_err(|e| e.to_string())?;
            let s = c.status.unwrap_or_default();
            if s.current_primary.as_deref() == Some(killed.as_str())
                && s.target_primary == s.current_primary
            {
                Ok(())
            } else {
                Err(format!("{:?}", s.current_primary))
            }
        },
    )
    .await;
    env.wait_ready(ns, "db", 3, Duration::from_secs(180)).await;
    let fault = kill_container(&env, node, &killed).await?;
    let (first, after) = recover(&env, ns, &writer, fault).await;
    let released = events(&env, ns, "db", "LeaseReleased").await?;
    println!(
        "container of {killed} killed again (restart back-off) → first write {first:.1} s after; \
         primary now {after}; {released:?}"
    );
    assert!(
        released.iter().any(|m| m.contains(&killed)),
        "no LeaseReleased Event about {killed}: {released:?}"
    );
    primary = after;

    // The primary Pod is deleted (graceful), then deleted with --grace-period=0 --force.
    for (what, grace) in [("deleted", None), ("force-deleted", Some(0))] {
        let fault = now();
        pods.delete(
            &primary,
            &DeleteParams {
                grace_period_seconds: grace,
                ..DeleteParams::default()
            },
        )
        .await?;
        // Until another instance is the primary, a write may still reach the old one
        // while it shuts down.
        let moved = eventually(
            &format!("{primary} is no longer the primary"),
            Duration::from_secs(120),
            || async {
                let c = env
                    .clusters(ns)
                    .get("db")
                    .await
                    .map_err(|e| e.to_string())?;
                match c.status.and_then(|s| s.current_primary) {
                    Some(p) if p != primary => Ok(now()),
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await;
        let (first, after) = recover(&env, ns, &writer, (fault, moved)).await;
        println!(
            "primary Pod {primary} {what} → first write {first:.1} s after; primary now {after}"
        );
        primary = after;
    }
    real::assert_no_acknowledged_write_lost(&env, ns, &writer).await?;
    Ok(())
}

/// The primary's node is cut off, first from the other nodes only (its kubelet and
/// instance manager still reach the API server), then, on the next primary, from
/// everything. A writer on the cut-off node (through `-rw`'s ClusterIP: DNS is on the
/// other side) and one on the infrastructure node record what was acknowledged; after
/// each heal the old primary rejoins, and nothing acknowledged on either side is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn partitions_never_leave_two_writable_primaries_and_lose_no_acknowledged_write() -> Result {
    let _serial = SERIAL.lock().await;
    let ns = "partition";
    let (env, ready) = real::synchronous_cluster_on_three_nodes(ns).await?;
    let mut primary = ready
        .status
        .and_then(|s| s.current_primary)
        .ok_or("no primary")?;
    let outside = start_writer(&env, ns, "db", "outside").await?;
    let mut writers = Vec::new();
    for (cut, table) in [(Cut::FromNodes, "inside1"), (Cut::Isolated, "inside2")] {
        let node = env.node_of(ns, &primary).await?;
        let index = env.nodes.index_of(&node).ok_or("node")?;
        let inside = start_writer_on(
            &env,
            ns,
            "db",
            table,
            json!({"nodeName": node}),
            "$DB_RW_SERVICE_HOST",
        )
        .await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let fault = now();
        env.nodes.partition(index, cut)?;
        let next = new_primary_after(&env, ns, &primary).await;
        let first = outside.first_write_after(&env.nodes, fault).await;
        println!(
            "{primary}'s node {node} cut off ({cut:?}) → {next} primary {:.1} s later; first \
             write on the majority side {:.1} s after the cut",
            now() - fault,
            first.end - fault
        );
        // The cut-off side keeps trying for a while; nothing it is told succeeded may be
        // lost.
        tokio::time::sleep(Duration::from_secs(10)).await;
        let during: Vec<_> = inside
            .read(&env.nodes)
            .into_iter()
            .filter(|a| a.ok && a.start > fault + 1.0)
            .collect();
        println!(
            "writes acknowledged on the cut-off side during the partition: {}",
            during.len()
        );
        env.nodes.heal(index)?;
        let healed = now();
        let back = env.wait_ready(ns, "db", 3, Duration::from_secs(240)).await;
        let back = back.status.unwrap_or_default();
        assert_eq!(back.current_primary.as_deref(), Some(next.as_str()));
        let resumed = inside.first_write_after(&env.nodes, healed).await;
        println!(
            "healed → {primary} rejoined as a standby, cut-off writer writing again {:.1} s \
             after the heal",
            resumed.end - healed
        );
        writers.push(inside);
        primary = next;
    }
    for writer in writers.iter().chain([&outside]) {
        real::assert_no_acknowledged_write_lost(&env, ns, writer).await?;
    }
    Ok(())
}

/// `kubectl drain` of the primary's node: the primary's PodDisruptionBudget holds its
/// eviction until the operator has switched over (once) to a standby on another node;
/// the drain then completes, and after `kubectl uncordon` the cluster is whole again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn draining_the_primary_node_switches_over_once_and_the_drain_completes() -> Result {
    let _serial = SERIAL.lock().await;
    let ns = "drain";
    let (env, ready) = real::synchronous_cluster_on_three_nodes(ns).await?;
    let primary = ready
        .status
        .and_then(|s| s.current_primary)
        .ok_or("no primary")?;
    let budgets: Api<k8s_openapi::api::policy::v1::PodDisruptionBudget> =
        Api::namespaced(env.client.clone(), ns);
    eventually(
        "both PodDisruptionBudgets",
        Duration::from_secs(60),
        || async {
            let names: Vec<String> = budgets
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?
                .items
                .into_iter()
                .filter_map(|b| b.metadata.name)
                .collect();
            if names.contains(&"db".to_string()) && names.contains(&"db-primary".to_string()) {
                Ok(())
            } else {
                Err(format!("{names:?}"))
            }
        },
    )
    .await;
    let node = env.node_of(ns, &primary).await?;
    let writer = start_writer(&env, ns, "db", "d").await?;
    tokio::time::sleep(Duration::from_secs(2)).await;

    let started = now();
    let out = env.kubectl(&[
        "drain",
        &node,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--timeout=150s",
    ]);
    let out = match out {
        Ok(out) => out,
        Err(e) => return Err(format!("{e}\noperator log:\n{}", operator_log(&env, 80)).into()),
    };
    let drained = now() - started;
    let first = writer.first_write_after(&env.nodes, started).await;
    let status = env.clusters(ns).get("db").await?.status.unwrap_or_default();
    let after = status.current_primary.unwrap_or_default();
    assert_ne!(after, primary, "the primary did not move");
    assert_ne!(env.node_of(ns, &after).await?, node);
    let switchovers = events(&env, ns, "db", "SwitchoverStarted").await?;
    let failovers = events(&env, ns, "db", "FailoverStarted").await?;
    assert_eq!(switchovers.len(), 1, "switchovers: {switchovers:?}");
    assert!(failovers.is_empty(), "failovers: {failovers:?}");
    println!(
        "drained {node} in {drained:.1} s: one switchover {primary} → {after} ({}); first \
         write after the drain began {:.1} s later\n{out}",
        switchovers.join("; "),
        first.end - started
    );

    env.kubectl(&["uncordon", &node])?;
    env.wait_ready(ns, "db", 3, Duration::from_secs(240)).await;
    println!("uncordoned: {primary} back as a standby, cluster Ready");
    real::assert_no_acknowledged_write_lost(&env, ns, &writer).await?;
    Ok(())
}
