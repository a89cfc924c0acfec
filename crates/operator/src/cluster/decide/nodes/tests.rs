use super::*;
use crate::cluster::decide::roles::Availability;
use crate::cluster::nodes::trim;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector::store;
use kube::runtime::watcher::Event;
use std::collections::BTreeMap;

fn node(name: &str, unschedulable: bool) -> Node {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {"unschedulable": unschedulable, "taints": [{"key": "k", "effect": "NoSchedule"}]},
        "status": {"images": [{"names": ["big"], "sizeBytes": 1}]}
    }))
    .expect("node")
}

/// A filled cache with these nodes (name, cordoned).
fn facts(nodes: &[(&str, bool)]) -> NodeFacts {
    let (reader, mut writer) = store::<Node>();
    writer.apply_watcher_event(&Event::Init);
    for (name, cordoned) in nodes {
        writer.apply_watcher_event(&Event::InitApply(node(name, *cordoned)));
    }
    writer.apply_watcher_event(&Event::InitDone);
    NodeFacts::new(reader)
}

fn pod(name: &str, node: Option<&str>, ready: bool) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"containers": [], "nodeName": node},
        "status": {"conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}
    }))
    .expect("pod")
}

fn pg(name: &str, role: PgRole, lsn: &str, streaming: bool) -> Probe {
    let mut s = PgStatus::stopped(name, false);
    s.role = role;
    s.running = true;
    s.streaming = streaming;
    if role == PgRole::Replica {
        s.received_lsn = Some(lsn.into());
    } else {
        s.current_lsn = Some(lsn.into());
    }
    Probe::Status(Box::new(s))
}

fn roles(current: &str, target: &str, available: bool) -> Roles {
    Roles {
        current: current.into(),
        target: target.into(),
        phase: None,
        primary: Availability {
            available,
            reason: "PrimaryRunning",
            message: String::new(),
        },
        notes: Vec::new(),
        clear_switchover_request: false,
    }
}

struct World {
    planned: Vec<(String, i32)>,
    pods: Vec<Pod>,
    probes: BTreeMap<String, Probe>,
}

/// db-1 primary on node-a, db-2 (0/7) on node-b, db-3 (0/8) on node-c: all ready.
fn world() -> World {
    World {
        planned: vec![("db-1".into(), 1), ("db-2".into(), 2), ("db-3".into(), 3)],
        pods: vec![
            pod("db-1", Some("node-a"), true),
            pod("db-2", Some("node-b"), true),
            pod("db-3", Some("node-c"), true),
        ],
        probes: BTreeMap::from([
            ("db-1".into(), pg("db-1", PgRole::Primary, "0/9", false)),
            ("db-2".into(), pg("db-2", PgRole::Replica, "0/7", true)),
            ("db-3".into(), pg("db-3", PgRole::Replica, "0/8", true)),
        ]),
    }
}

impl World {
    fn instances(&self) -> Vec<Instance<'_>> {
        instances(&self.planned, &self.pods, &self.probes)
    }
}

#[test]
fn node_states_come_from_a_filled_cache_only() {
    assert_eq!(NodeFacts::default().state("node-a"), NodeState::Unknown);
    let (reader, _writer) = store::<Node>();
    let empty = NodeFacts::new(reader);
    assert!(!empty.known());
    assert_eq!(empty.state("node-a"), NodeState::Unknown);
    let f = facts(&[("node-a", false), ("node-b", true)]);
    assert!(f.known());
    assert_eq!(f.state("node-a"), NodeState::Schedulable);
    assert_eq!(f.state("node-b"), NodeState::Unschedulable);
    assert_eq!(f.state("node-z"), NodeState::Missing);
    assert_eq!(f.of_pod(&pod("p", None, false)), NodeState::Unknown);
}

#[test]
fn trimming_keeps_the_name_and_the_cordon_only() {
    let mut n = node("node-a", true);
    trim(&mut n);
    assert_eq!(n.metadata.name.as_deref(), Some("node-a"));
    assert_eq!(n.spec.as_ref().and_then(|s| s.unschedulable), Some(true));
    assert!(n.status.is_none() && n.metadata.labels.is_none());
    assert!(n.spec.as_ref().is_some_and(|s| s.taints.is_none()));
}

#[test]
fn a_cordoned_primary_node_moves_the_primary_to_the_best_standby_on_a_schedulable_node() {
    let w = world();
    let r = roles("db-1", "db-1", true);
    let all_up = facts(&[("node-a", false), ("node-b", false), ("node-c", false)]);
    assert_eq!(evacuation(&w.instances(), &r, &all_up), None);
    let drained = facts(&[("node-a", true), ("node-b", false), ("node-c", false)]);
    assert_eq!(
        evacuation(&w.instances(), &r, &drained).as_deref(),
        Some("db-3")
    );
    // The best standby's node is cordoned too: the other one.
    let both = facts(&[("node-a", true), ("node-b", false), ("node-c", true)]);
    assert_eq!(
        evacuation(&w.instances(), &r, &both).as_deref(),
        Some("db-2")
    );
    // Nowhere to go: nothing, and no budget holding the primary's eviction either.
    let all = facts(&[("node-a", true), ("node-b", true), ("node-c", true)]);
    assert_eq!(evacuation(&w.instances(), &r, &all), None);
    assert!(!primary_budget_wanted(&w.instances(), &r, &all));
    // Not during a change of primary, nor when the primary is down, nor when unknown.
    assert_eq!(
        evacuation(&w.instances(), &roles("db-1", "db-2", true), &drained),
        None
    );
    assert_eq!(
        evacuation(&w.instances(), &roles("db-1", "db-1", false), &drained),
        None
    );
    assert_eq!(evacuation(&w.instances(), &r, &NodeFacts::default()), None);
}

#[test]
fn a_standby_that_is_not_ready_or_not_streaming_is_no_target() {
    let mut w = world();
    w.pods[2] = pod("db-3", Some("node-c"), false);
    w.probes
        .insert("db-2".into(), pg("db-2", PgRole::Replica, "0/7", false));
    let r = roles("db-1", "db-1", true);
    let drained = facts(&[("node-a", true), ("node-b", false), ("node-c", false)]);
    assert_eq!(evacuation(&w.instances(), &r, &drained), None);
    assert!(!primary_budget_wanted(&w.instances(), &r, &drained));
}

#[test]
fn the_primary_budget_exists_only_while_a_switchover_could_happen() {
    let w = world();
    let r = roles("db-1", "db-1", true);
    let up = facts(&[("node-a", false), ("node-b", false), ("node-c", false)]);
    assert!(primary_budget_wanted(&w.instances(), &r, &up));
    assert!(!primary_budget_wanted(
        &w.instances(),
        &r,
        &NodeFacts::default()
    ));
    assert!(!primary_budget_wanted(
        &w.instances(),
        &roles("db-1", "db-3", true),
        &up
    ));
    let single = World {
        planned: w.planned[..1].to_vec(),
        pods: w.pods[..1].to_vec(),
        probes: w.probes.clone(),
    };
    assert!(!primary_budget_wanted(&single.instances(), &r, &up));
}

fn pv(affinity: serde_json::Value) -> PersistentVolume {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "pv"},
        "spec": {"nodeAffinity": affinity}
    }))
    .expect("pv")
}

fn hostname_pv(hosts: &[&str]) -> PersistentVolume {
    pv(
        serde_json::json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": hosts}
        ]}]}}),
    )
}

#[test]
fn volumes_pinned_to_hostnames_are_recognised_and_others_are_not() {
    assert_eq!(
        pinned_to(&hostname_pv(&["node-a"])),
        Some(vec!["node-a".to_string()])
    );
    let by_field = pv(
        serde_json::json!({"required": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["node-b"]}
        ]}]}}),
    );
    assert_eq!(pinned_to(&by_field), Some(vec!["node-b".to_string()]));
    let zone = pv(
        serde_json::json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z1"]}
        ]}]}}),
    );
    assert_eq!(pinned_to(&zone), None);
    assert_eq!(pinned_to(&pv(serde_json::json!(null))), None);
    let not_in = pv(
        serde_json::json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["node-a"]}
        ]}]}}),
    );
    assert_eq!(pinned_to(&not_in), None);
}

#[test]
fn a_standby_whose_volume_died_with_its_node_is_recreated_only_once_unplaced() {
    let mut w = world();
    let r = roles("db-2", "db-2", true);
    let gone = facts(&[("node-b", false), ("node-c", false)]);
    let lost = hostname_pv(&["node-a"]);
    // The Pod still bound to the deleted node: wait for the Pod garbage collector.
    assert!(!lost_volume(&w.instances()[0], &r, &lost, &gone));
    // Pod gone, or created again and Pending: the volume is lost.
    w.pods[0] = pod("db-1", None, false);
    assert!(lost_volume(&w.instances()[0], &r, &lost, &gone));
    w.pods.remove(0);
    assert!(lost_volume(&w.instances()[0], &r, &lost, &gone));
    // Never the primary or the target, never a volume on a node that exists or may,
    // never network storage, never when the Nodes are unknown.
    assert!(!lost_volume(
        &w.instances()[0],
        &roles("db-1", "db-1", false),
        &lost,
        &gone
    ));
    assert!(!lost_volume(
        &w.instances()[0],
        &roles("db-2", "db-1", true),
        &lost,
        &gone
    ));
    assert!(!lost_volume(
        &w.instances()[0],
        &r,
        &hostname_pv(&["node-b"]),
        &gone
    ));
    assert!(!lost_volume(
        &w.instances()[0],
        &r,
        &hostname_pv(&["node-a", "node-c"]),
        &gone
    ));
    assert!(!lost_volume(
        &w.instances()[0],
        &r,
        &pv(serde_json::json!(null)),
        &gone
    ));
    assert!(!lost_volume(
        &w.instances()[0],
        &r,
        &lost,
        &NodeFacts::default()
    ));
}
