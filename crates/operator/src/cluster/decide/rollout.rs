//! Step 7: the next step of a rolling update ([`super::rolling`], pure), the
//! restart requests of the cluster's annotations, and a switchover to start first (a drain,
//! or a rollout that reached the primary), as one value the pass acts on.

use super::{nodes, roles, rolling};
use crate::cluster::world::{self, Probe};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use pgop_api::constants::{ANNOTATION_RESTART, ANNOTATION_RESTART_INSTANCE};
use pgop_api::v1beta1::PostgresCluster;
use std::collections::BTreeMap;
use std::time::Duration;

/// Step 7's decision.
pub(in crate::cluster) struct Rollout {
    /// The outdated Pod to delete (it is created anew from the current spec).
    pub replace: Option<String>,
    /// The instance asked to restart PostgreSQL for parameters pending a restart.
    pub restart_instance: Option<String>,
    /// The restart annotation, with the moment it was first seen.
    pub restart_requested: Option<pgop_api::cluster::RestartRequest>,
    /// `status.instanceRestarts` for this pass.
    pub instance_restarts: Vec<pgop_api::cluster::InstanceRestart>,
    /// The restart-instance annotation, read in this pass: remove it once the status
    /// holds what it asked, and say so.
    pub instance_restart_request: Option<rolling::InstanceRestartRequest>,
    /// Why the rollout is blocked, if it is.
    pub blocked: Option<rolling::Blocked>,
    /// A switchover to start before anything is built: a drain, or a rolling update that
    /// must update the primary.
    pub switchover: Option<roles::Switchover>,
}

/// What step 7 decides from. `desired_hashes`: each instance's Pod spec hash as the spec
/// builds it now.
pub(in crate::cluster) struct RolloutInput<'a> {
    pub cluster: &'a PostgresCluster,
    pub defaulted: &'a PostgresCluster,
    pub named: &'a [(String, i32)],
    pub observed: &'a world::Observed,
    pub probes: &'a BTreeMap<String, Probe>,
    pub placed: &'a [nodes::Instance<'a>],
    pub desired_hashes: &'a BTreeMap<String, String>,
    pub roles: &'a roles::Roles,
    pub nodes: &'a nodes::NodeFacts,
}

/// Step 7: the next step of a rolling update, behind its health gate; a cordoned
/// primary's node (a drain) or a rollout that must update the primary asks for a
/// switchover instead (`Rollout::switchover`, which the caller starts).
pub(in crate::cluster) fn rollout(input: RolloutInput<'_>, now: &Time) -> Rollout {
    let RolloutInput {
        cluster,
        defaulted,
        named,
        observed,
        probes,
        placed,
        desired_hashes,
        roles,
        nodes: node_facts,
    } = input;
    let old_status = cluster.status.clone().unwrap_or_default();
    // The restart annotation: recorded with the moment it was first seen, so that every
    // postmaster started before then restarts, through the rollout.
    let restart_requested = match (
        cluster.annotations().get(ANNOTATION_RESTART),
        &old_status.restart_requested,
    ) {
        (Some(value), Some(known)) if &known.value == value => Some(known.clone()),
        (Some(value), _) => Some(pgop_api::cluster::RestartRequest {
            value: value.clone(),
            requested_at: now.0.to_string(),
        }),
        (None, known) => known.clone(),
    };
    // The restart-instance annotation: its instances recorded (it is removed once the
    // status holds them), the restarted ones pruned.
    let (instance_restarts, instance_restart_request) = rolling::instance_restarts(
        &old_status.instance_restarts,
        cluster
            .annotations()
            .get(ANNOTATION_RESTART_INSTANCE)
            .map(String::as_str),
        named,
        probes,
        now.0,
    );
    let restarts_by_instance: BTreeMap<String, jiff::Timestamp> = instance_restarts
        .iter()
        .filter_map(|e| Some((e.instance.clone(), e.requested_at.parse().ok()?)))
        .collect();
    let unplaced = rolling::unplaced(&observed.pods, now.0);
    let input = rolling::Input {
        instances: named,
        pods: &observed.pods,
        probes,
        roles,
        desired_hashes,
        generation: cluster.metadata.generation,
        restarting: old_status.restart_instance.as_deref(),
        restart_requested_at: restart_requested
            .as_ref()
            .and_then(|r| r.requested_at.parse().ok()),
        instance_restarts: &restarts_by_instance,
        unplaced: &unplaced,
    };
    let step = rolling::next(&input);
    // Health gate: a step that did not come back (or refused) blocks the rollout, and says so.
    let not_ready_since =
        pgop_api::conditions::find_condition(&old_status.conditions, pgop_api::conditions::READY)
            .filter(|c| c.status == pgop_api::conditions::FALSE)
            .map(|c| c.last_transition_time.0);
    let restarting_now = match &step {
        rolling::Step::Restart { instance } => Some(instance.as_str()),
        _ => None,
    };
    let blocked = rolling::blocked(
        &input,
        restarting_now,
        not_ready_since,
        now.0,
        Duration::from_secs(u64::try_from(defaulted.spec.ha.switchover_timeout).unwrap_or(60)),
    );
    let mut decided = Rollout {
        replace: None,
        restart_instance: None,
        restart_requested,
        instance_restarts,
        instance_restart_request,
        blocked,
        switchover: None,
    };
    // A drain: the primary's node is cordoned, so the primary moves first (its budget
    // holds its eviction meanwhile); the rollout goes on afterwards.
    if let Some(to) = nodes::evacuation(placed, roles, node_facts) {
        let node = observed
            .pods
            .iter()
            .find(|p| p.name_any() == roles.current)
            .and_then(|p| p.spec.as_ref()?.node_name.clone())
            .unwrap_or_default();
        decided.switchover = Some(roles::Switchover {
            note: roles::Note {
                warning: false,
                reason: "SwitchoverStarted",
                message: format!(
                    "node {node} of the primary {} is cordoned (drained): switching the primary to {to}",
                    roles.current
                ),
                instance: Some(to.clone()),
            },
            to,
        });
        return decided;
    }
    match step {
        rolling::Step::Idle => {}
        rolling::Step::Replace { instance } => decided.replace = Some(instance),
        rolling::Step::Restart { instance } => decided.restart_instance = Some(instance),
        rolling::Step::Switchover { to } => {
            decided.switchover = Some(roles::Switchover {
                note: roles::Note {
                    warning: false,
                    reason: "SwitchoverStarted",
                    message: format!(
                        "rolling update: switching the primary from {} to {to} so that {} can be updated",
                        roles.current, roles.current
                    ),
                    instance: Some(to.clone()),
                },
                to,
            });
        }
    }
    decided
}
