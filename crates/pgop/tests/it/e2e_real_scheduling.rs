//! Scheduling on real nodes (issue 13): `spec.affinity.podAntiAffinityType: required`
//! never puts two instances on one node, and a cluster that asks for more nodes than there
//! are says so in its status, and is Ready again once scaled to what the nodes allow. Two
//! workload nodes and an infrastructure node (the operator and CoreDNS), pgop installed by
//! its chart, the real kube-scheduler. Needs root.

use crate::real;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams};
use pgop_api::PostgresCluster;
use pgop_api::cluster::ClusterPhase;
use pgop_api::conditions::{self, INSTANCES_SCHEDULED};
use real::{RealEnv, Result, SERIAL, eventually};
use serde_json::json;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// The cluster's instance Pods.
async fn instance_pods(pods: &Api<Pod>) -> std::result::Result<Vec<Pod>, String> {
    pods.list(&ListParams::default().labels("database.example.com/cluster=db"))
        .await
        .map(|l| l.items)
        .map_err(|e| e.to_string())
}

fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref())
}

fn name_of(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or_default()
}

fn ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Whether the Pod's anti-affinity is the scheduling rule (not a preference).
fn required_anti_affinity(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.pod_anti_affinity.as_ref())
        .is_some_and(|a| {
            a.required_during_scheduling_ignored_during_execution
                .is_some()
        })
}

/// The Pending Pod's PodScheduled condition: (status, reason).
fn scheduled_condition(pod: &Pod) -> Option<(String, Option<String>)> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled"))
        .map(|c| (c.status.clone(), c.reason.clone()))
}

/// Two running instances on two distinct nodes and one Pending Pod without a node, which
/// the cluster's status reports: returns the Pending Pod's name and the condition's message.
async fn two_placed_one_pending(
    pods: &Api<Pod>,
    clusters: &Api<PostgresCluster>,
    workload: &BTreeSet<String>,
) -> std::result::Result<(String, String), String> {
    let all = instance_pods(pods).await?;
    if all.len() != 3 {
        return Err(format!("{} instance Pods", all.len()));
    }
    let (placed, pending): (Vec<&Pod>, Vec<&Pod>) = all.iter().partition(|p| node_of(p).is_some());
    let nodes: BTreeSet<String> = placed
        .iter()
        .filter_map(|p| node_of(p).map(str::to_string))
        .collect();
    if placed.len() != 2 || pending.len() != 1 || placed.iter().any(|p| !ready(p)) {
        let seen: Vec<(&str, Option<&str>, bool)> = all
            .iter()
            .map(|p| (name_of(p), node_of(p), ready(p)))
            .collect();
        return Err(format!("pods (name, node, ready): {seen:?}"));
    }
    // Two nodes, not one: the rule holds for the two that run.
    assert_eq!(&nodes, workload, "one instance on each workload node");
    let stuck = pending[0];
    let stuck_name = name_of(stuck).to_string();
    let verdict = scheduled_condition(stuck);
    if verdict != Some(("False".into(), Some("Unschedulable".into()))) {
        return Err(format!("{stuck_name}'s PodScheduled: {verdict:?}"));
    }
    let c = clusters.get("db").await.map_err(|e| e.to_string())?;
    let status = c.status.unwrap_or_default();
    let condition = conditions::find_condition(&status.conditions, INSTANCES_SCHEDULED)
        .ok_or("no InstancesScheduled condition yet")?;
    if condition.status != conditions::FALSE
        || condition.reason != "Unschedulable"
        || !condition
            .message
            .contains(&format!("pod {stuck_name} cannot be scheduled"))
    {
        return Err(format!("InstancesScheduled: {condition:?}"));
    }
    if status.phase != Some(ClusterPhase::Degraded) || status.ready_replicas != 2 {
        return Err(format!(
            "phase {:?}, {} ready",
            status.phase, status.ready_replicas
        ));
    }
    Ok((stuck_name, condition.message.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn required_anti_affinity_keeps_instances_apart_and_an_unplaceable_one_shows_in_the_status()
-> Result {
    let _serial = SERIAL.lock().await;
    let env = RealEnv::start(2, true).await?;
    let infra = RealEnv::on_infra();
    let extra: Vec<&str> = infra.iter().map(String::as_str).collect();
    env.install_operator(&extra).await?;
    let ns = "scheduling";
    env.restricted_namespace(ns).await?;
    let names = env.nodes.names();
    // The infrastructure node is the last one, tainted: no instance may land there.
    let workload: BTreeSet<String> = names[..names.len() - 1].iter().cloned().collect();
    assert_eq!(workload.len(), 2);

    // Three instances that must each have a node of their own, on two nodes.
    let created = Instant::now();
    env.create_cluster(
        ns,
        "db",
        json!({
            "replicas": 3,
            "storage": {"size": "1Gi"},
            "affinity": {"podAntiAffinityType": "required"}
        }),
    )
    .await?;
    let pods = env.pods(ns);
    let clusters = env.clusters(ns);
    let (stuck, message) = eventually(
        "two instances on two nodes, the third Pending and reported",
        Duration::from_secs(300),
        || two_placed_one_pending(&pods, &clusters, &workload),
    )
    .await;
    println!(
        "{:.1?} after create: 2 instances on {workload:?}, {stuck} Pending; InstancesScheduled: {message}",
        created.elapsed()
    );
    assert!(
        message.contains("anti-affinity"),
        "the scheduler's own words are quoted: {message}"
    );

    // A Warning Event says it too.
    let events: Api<Event> = Api::namespaced(env.client.clone(), ns);
    let events_with = |reason: &'static str, about: Option<String>| {
        let events = events.clone();
        async move {
            let list = events
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            // About the Pod that stays Pending: another Pod may have been unschedulable
            // for a moment first (its claim not yet in the scheduler's cache), with an
            // Event of the same reason (a local CI run of 66e1a8f).
            list.items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some(reason)
                        && about
                            .as_deref()
                            .is_none_or(|pod| e.note.as_deref().is_some_and(|n| n.contains(pod)))
                })
                .ok_or_else(|| format!("no {reason} Event about {about:?} yet"))
        }
    };
    let warning = eventually(
        "an InstancesUnschedulable Event",
        Duration::from_secs(60),
        || events_with("InstancesUnschedulable", Some(stuck.clone())),
    )
    .await;
    assert_eq!(warning.type_.as_deref(), Some("Warning"));
    assert!(
        warning.note.as_deref().is_some_and(|n| n.contains(&stuck)),
        "{warning:?}"
    );

    // It stays so: the scheduler retries, the rule holds, nothing else moves.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let (still, _) = two_placed_one_pending(&pods, &clusters, &workload)
        .await
        .map_err(|e| format!("15 s later: {e}"))?;
    assert_eq!(still, stuck);

    // Scaled to what the nodes allow (scaling down removes the highest serial that is not
    // the primary): the cluster is Ready with one instance per node.
    let scaled = Instant::now();
    clusters
        .patch(
            "db",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 2}})),
        )
        .await?;
    let ready_cluster = env.wait_ready(ns, "db", 2, Duration::from_secs(300)).await;
    println!(
        "{:.1?} after scaling to 2: Ready with 2 instances",
        scaled.elapsed()
    );
    let status = ready_cluster.status.unwrap_or_default();
    let scheduled = conditions::find_condition(&status.conditions, INSTANCES_SCHEDULED)
        .ok_or("no InstancesScheduled condition")?;
    assert_eq!(scheduled.status, conditions::TRUE, "{scheduled:?}");
    // The status drops the third instance in the pass that deletes its Pod, and may be
    // read a moment before that Pod is gone.
    let remaining: Vec<Pod> = eventually(
        "the third instance's Pod to be gone",
        Duration::from_secs(60),
        || async {
            let left: Vec<Pod> = instance_pods(&pods)
                .await
                .map_err(|e| e.to_string())?
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .collect();
            (left.len() == 2)
                .then_some(left.clone())
                .ok_or_else(|| format!("{} instance Pods", left.len()))
        },
    )
    .await;
    assert_eq!(remaining.len(), 2);
    assert!(remaining.iter().all(required_anti_affinity));
    let placed: BTreeSet<String> = remaining
        .iter()
        .filter_map(|p| node_of(p).map(str::to_string))
        .collect();
    assert_eq!(placed, workload, "one instance on each workload node");
    let normal = eventually(
        "an InstancesScheduled Event",
        Duration::from_secs(60),
        || events_with("InstancesScheduled", None),
    )
    .await;
    assert_eq!(normal.type_.as_deref(), Some("Normal"));
    println!("test done at {:.1?}", env.started.elapsed());
    Ok(())
}
