//! Facts about the instances' Pods, and about what their managers say of them, with the
//! words the conditions use for them: a leaf that status, roles, rollout and hibernation
//! import (and that imports none of them).

use k8s_openapi::api::core::v1::Pod;
use pgop_api::instance_status::{Down, MAX_DOWN_MESSAGE, printable};

/// Whether a Pod's Ready condition is True.
pub fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The scheduler's message for a Pod it found no node for: its PodScheduled condition is
/// False with reason Unschedulable, and it has no node.
pub fn unschedulable(pod: &Pod) -> Option<&str> {
    if pod.spec.as_ref().is_some_and(|s| s.node_name.is_some()) {
        return None;
    }
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| {
            cs.iter().find(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some(REASON_UNSCHEDULABLE)
            })
        })
        .map(|c| c.message.as_deref().unwrap_or_default())
}

/// Since when the scheduler has found no node for a Pod (see [`unschedulable`]): its
/// PodScheduled condition's last transition.
pub fn unschedulable_since(pod: &Pod) -> Option<jiff::Timestamp> {
    unschedulable(pod)?;
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled"))
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0)
}

/// The reason of `PrimaryAvailable=False` while the primary is fenced
/// (`spec.fencedInstances`, or its manager reports it so).
pub const REASON_FENCED: &str = "Fenced";
/// The reason of `PrimaryAvailable=False` while a primary no longer fenced starts again.
pub const REASON_UNFENCING: &str = "Unfencing";

/// The reason of `InstancesScheduled=False`, and of the Pod condition it comes from.
pub const REASON_UNSCHEDULABLE: &str = "Unschedulable";

/// The reason of `ConfigurationApplied=False` (and `RolloutBlocked=True`) while an
/// instance cannot start after a restart for the spec's parameters.
pub const REASON_INSTANCE_CANNOT_START: &str = "InstanceCannotStart";

/// A [`Down`]'s words for people: the parameters of the restart that left the instance
/// down, then PostgreSQL's (or the manager's) words; printable, at most 1 KiB.
pub fn down_message(down: &Down) -> String {
    let words = if down.parameters.is_empty() {
        down.message.clone()
    } else {
        format!(
            "after the restart for {}: {}",
            down.parameters.join(", "),
            down.message
        )
    };
    printable(&words, MAX_DOWN_MESSAGE)
}
