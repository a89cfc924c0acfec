//! Nodes: the two decisions that need what the operator knows of the Kubernetes nodes
//! its instances run on ([`NodeFacts`]).
//!
//! - **Drain.** `kubectl drain` cordons a node (`spec.unschedulable`), then evicts its
//!   Pods through the Eviction API, which honours PodDisruptionBudgets. A second budget,
//!   `<cluster>-primary` (`minAvailable: 1` over the Pod labelled primary), refuses the
//!   primary's eviction while a switchover is possible; the operator sees the primary's
//!   node cordoned and switches over to a healthy standby on a schedulable node
//!   ([`evacuation`]). The old primary, now a standby, falls under the replicas' budget
//!   and is evicted on the drain's next retry. When no standby could take over, the
//!   primary's budget is not there ([`primary_budget_wanted`]), so a drain never waits for
//!   a switchover that cannot happen.
//! - **A deleted node.** A volume bound to a node that no longer exists (a local volume
//!   whose PersistentVolume is pinned to that node's hostname) can never be attached
//!   again. Once the instance's Pod is gone (the Pod garbage collector deletes Pods of
//!   deleted nodes) or cannot be scheduled, and the instance is not the primary, the
//!   operator deletes the volume claim and the Pod, and the instance is created anew on
//!   another node from the primary ([`lost_volume`]).
//!
//! The operator reads Nodes from a watch cache ([`NodeFacts`], in `cluster/nodes.rs`);
//! while that cache has not been filled, every node is [`NodeState::Unknown`] and neither
//! decision acts.

use super::roles::Roles;
pub use crate::cluster::nodes::{NodeFacts, NodeState, SELECTED_NODE};
use crate::cluster::pods::pod_ready;
use crate::cluster::world::Probe;
use k8s_openapi::api::core::v1::{PersistentVolume, Pod};
use kube::ResourceExt;
use pgop_api::instance_status::{PgRole, PgStatus};

/// One instance as the node decisions see it.
pub struct Instance<'a> {
    pub name: &'a str,
    pub serial: i32,
    pub pod: Option<&'a Pod>,
    pub status: Option<&'a PgStatus>,
}

/// The instances of the plan with their Pods and reports.
pub fn instances<'a>(
    planned: &'a [(String, i32)],
    pods: &'a [Pod],
    probes: &'a std::collections::BTreeMap<String, Probe>,
) -> Vec<Instance<'a>> {
    planned
        .iter()
        .map(|(name, serial)| Instance {
            name,
            serial: *serial,
            pod: pods.iter().find(|p| p.name_any() == *name),
            status: probes.get(name).and_then(Probe::status),
        })
        .collect()
}

/// The standby a switchover may go to: its Pod ready and not being deleted, on a
/// schedulable node, streaming from the primary; the most WAL received, then replayed,
/// then the lowest serial.
fn best_standby<'a>(
    instances: &'a [Instance<'a>],
    roles: &Roles,
    nodes: &NodeFacts,
) -> Option<&'a str> {
    instances
        .iter()
        .filter(|i| i.name != roles.current)
        .filter(|i| {
            i.pod.is_some_and(|p| {
                p.metadata.deletion_timestamp.is_none()
                    && pod_ready(p)
                    && nodes.of_pod(p) == NodeState::Schedulable
            })
        })
        .filter_map(|i| {
            let s = i.status?;
            (s.role == PgRole::Replica && s.streaming && !s.fenced).then_some((i, s))
        })
        .max_by_key(|(i, s)| {
            (
                s.wal_position().unwrap_or(0),
                s.replayed_lsn
                    .as_deref()
                    .and_then(pgop_api::instance_status::parse_lsn)
                    .unwrap_or(0),
                -i.serial,
            )
        })
        .map(|(i, _)| i.name)
}

/// Whether the primary's eviction should wait for a switchover: more than one instance,
/// the Nodes known, no change of primary under way, and a standby that could take over.
pub fn primary_budget_wanted(instances: &[Instance], roles: &Roles, nodes: &NodeFacts) -> bool {
    instances.len() > 1
        && nodes.known()
        && !roles.in_transition()
        && roles.primary.available
        && best_standby(instances, roles, nodes).is_some()
}

/// The standby to switch over to because the primary's node is cordoned (being drained):
/// only when no change of primary is under way and the primary runs.
pub fn evacuation(instances: &[Instance], roles: &Roles, nodes: &NodeFacts) -> Option<String> {
    if roles.in_transition() || !roles.primary.available {
        return None;
    }
    let primary = instances.iter().find(|i| i.name == roles.current)?;
    if nodes.of_pod(primary.pod?) != NodeState::Unschedulable {
        return None;
    }
    best_standby(instances, roles, nodes).map(str::to_string)
}

/// The nodes a PersistentVolume may be used on, when it is pinned to hostnames
/// (`kubernetes.io/hostname In [...]` or `metadata.name In [...]` in every term of its
/// required node affinity); `None` for a volume usable on any node, or pinned by other
/// labels (a zone: network storage follows the Pod).
pub fn pinned_to(pv: &PersistentVolume) -> Option<Vec<String>> {
    let terms = pv
        .spec
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required
        .as_ref()?
        .node_selector_terms
        .clone();
    if terms.is_empty() {
        return None;
    }
    let mut hosts = Vec::new();
    for term in &terms {
        let by_label = term
            .match_expressions
            .iter()
            .flatten()
            .filter(|e| e.key == "kubernetes.io/hostname" && e.operator == "In");
        let by_field = term
            .match_fields
            .iter()
            .flatten()
            .filter(|e| e.key == "metadata.name" && e.operator == "In");
        let names: Vec<String> = by_label
            .chain(by_field)
            .flat_map(|e| e.values.clone().unwrap_or_default())
            .collect();
        if names.is_empty() {
            return None;
        }
        hosts.extend(names);
    }
    Some(hosts)
}

/// Whether an instance's volume is lost with its node: the instance is neither the
/// primary nor the target, its Pod is gone or not scheduled, and its volume is pinned to
/// nodes none of which exists any more.
pub fn lost_volume(
    instance: &Instance,
    roles: &Roles,
    pv: &PersistentVolume,
    nodes: &NodeFacts,
) -> bool {
    if instance.name == roles.current || instance.name == roles.target {
        return false;
    }
    let unplaced = instance
        .pod
        .is_none_or(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none());
    unplaced
        && pinned_to(pv)
            .is_some_and(|hosts| hosts.iter().all(|h| nodes.state(h) == NodeState::Missing))
}

#[cfg(test)]
mod tests;
