//! After the status: the request annotations the pass acted on, to remove (so that an old
//! request cannot act again later), and the Events of the restarts they asked for.

use super::Rollout;
use super::roles;
use crate::cluster::notes::Note;
use kube::runtime::events::EventType;
use pgop_api::constants::{ANNOTATION_RESTART_INSTANCE, ANNOTATION_SWITCHOVER_TO};
use pgop_api::v1beta1::PostgresCluster;

/// What follows the status write.
#[derive(Debug, Default, PartialEq)]
pub(in crate::cluster) struct Requests {
    /// The annotations to remove, in this order.
    pub clear: Vec<&'static str>,
    /// The Events after them, in this order.
    pub notes: Vec<Note>,
}

/// The switchover annotation once acted on or refused; the restart-instance annotation once
/// the status holds what it asked (with an Event for what it accepted and one for what it
/// refused); and an Event when the rollout asks another instance to restart.
pub(in crate::cluster) fn requests(
    cluster: &PostgresCluster,
    roles: &roles::Roles,
    rollout: &Rollout,
) -> Requests {
    let mut decided = Requests::default();
    if roles.clear_switchover_request {
        decided.clear.push(ANNOTATION_SWITCHOVER_TO);
    }
    if let Some(request) = &rollout.instance_restart_request {
        decided.clear.push(ANNOTATION_RESTART_INSTANCE);
        if !request.accepted.is_empty() {
            let message = format!(
                "restart of {} requested: one instance at a time, a standby in place, the \
                 primary after a switchover",
                request.accepted.join(", ")
            );
            decided
                .notes
                .push(Note::new(EventType::Normal, "RestartRequested", message));
        }
        if !request.refused.is_empty() {
            let message = format!(
                "annotation {ANNOTATION_RESTART_INSTANCE} refused in part: {}",
                request.refused.join("; ")
            );
            decided
                .notes
                .push(Note::new(EventType::Warning, "RestartRefused", message));
        }
    }
    let old_restart = cluster
        .status
        .as_ref()
        .and_then(|s| s.restart_instance.as_ref());
    if let Some(instance) = &rollout.restart_instance
        && old_restart != Some(instance)
    {
        let message = format!(
            "rolling restart: {instance} restarts PostgreSQL (parameters pending a restart, or a restart requested)"
        );
        decided.notes.push(
            Note::new(EventType::Normal, "RollingRestart", message).about(Some(instance.clone())),
        );
    }
    decided
}
