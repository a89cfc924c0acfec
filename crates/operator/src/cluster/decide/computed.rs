//! Status: computed from what was observed, purely. For a valid spec (`compute`): the
//! phase, the conditions, `status.instances` (their WAL positions published at most once a
//! minute) and how the declared roles and databases were applied; for an invalid one
//! (`invalid`): the phase Invalid and the SpecValid condition; and the instance Events a
//! change of status raises. This file writes nothing: `write::patch_status` patches the
//! status, and only when it differs from what the cluster already shows.
//!
//! Why this file stays whole: it is one idea, the status computed from what was observed
//! (its phase, conditions and instances, and the instance Events a change of them raises);
//! about 600 of its lines are the unit tests.

use super::roles::Roles;
use super::serials::{Plan, instance_name};
use crate::cluster::world::Probe;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use pgop_api::cluster::{ClusterPhase, InstanceRole, InstanceStatus};
use pgop_api::conditions::{self, new_condition, set_condition};
use pgop_api::instance_status::{DownReason, PgRole, PgStatus, printable};
use pgop_api::v1beta1::PostgresCluster;
use pgop_api::{PostgresClusterStatus, labels};
use std::collections::BTreeMap;

use crate::cluster::pods::{
    REASON_FENCED, REASON_INSTANCE_CANNOT_START, REASON_UNSCHEDULABLE, down_message, pod_ready,
    unschedulable,
};

/// Least time between two publications of the instances' WAL positions while nothing else
/// about them changes (`status.positionsObservedAt`).
pub const POSITIONS_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

/// Keeps the old WAL positions in `status.instances` (and `positionsObservedAt`) when only
/// the positions changed and the old ones are younger than `interval`; else the new ones
/// are published with `now`. A cluster under write load then writes its status at most
/// once per interval for its positions. Roles, timelines, readiness and the set of
/// instances are always current (and take fresh positions with them).
///
/// Returns when the cluster should next be looked at for its positions: when the ones it
/// held back are due, or one `interval` after it published moved ones (they may go on
/// moving); `None` when they did not move.
pub fn publish_positions_at_most_every(
    status: &mut PostgresClusterStatus,
    old: &PostgresClusterStatus,
    now: &Time,
    interval: std::time::Duration,
) -> Option<std::time::Duration> {
    let without_positions = |instances: &[InstanceStatus]| -> Vec<InstanceStatus> {
        instances
            .iter()
            .map(|i| InstanceStatus {
                received_lsn: None,
                replayed_lsn: None,
                ..i.clone()
            })
            .collect()
    };
    let positions = |instances: &[InstanceStatus]| -> Vec<(Option<String>, Option<String>)> {
        instances
            .iter()
            .map(|i| (i.received_lsn.clone(), i.replayed_lsn.clone()))
            .collect()
    };
    if positions(&status.instances) == positions(&old.instances) {
        status.positions_observed_at = old.positions_observed_at.clone().or(Some(now.clone()));
        return None;
    }
    let left = old.positions_observed_at.as_ref().and_then(|at| {
        let age: std::time::Duration = now.0.duration_since(at.0).try_into().ok()?;
        interval.checked_sub(age).filter(|left| !left.is_zero())
    });
    match left {
        Some(left) if without_positions(&status.instances) == without_positions(&old.instances) => {
            status.instances = old.instances.clone();
            status.positions_observed_at = old.positions_observed_at.clone();
            Some(left)
        }
        _ => {
            status.positions_observed_at = Some(now.clone());
            Some(interval)
        }
    }
}

pub use pgop_api::conditions::set_spec_valid;

/// The reason of `RolesApplied=False` when PostgreSQL refused a declared role.
pub const REASON_ROLE_FAILED: &str = "RoleFailed";
/// The reason of `DatabasesApplied=False` when PostgreSQL refused part of a declared
/// database.
pub const REASON_DATABASE_FAILED: &str = "DatabaseFailed";

/// What the primary's manager keeps as declared: `spec.roles` or `spec.databases`.
pub struct Declared {
    /// The condition saying whether all of it is applied.
    pub condition: &'static str,
    /// Its reason when PostgreSQL refused something.
    pub failed: &'static str,
    /// The spec field, for messages.
    pub field: &'static str,
    /// The objects, for messages (`roles`, `databases`).
    pub noun: &'static str,
}

/// `spec.roles`.
pub const ROLES: Declared = Declared {
    condition: conditions::ROLES_APPLIED,
    failed: REASON_ROLE_FAILED,
    field: "spec.roles",
    noun: "roles",
};

/// `spec.databases`.
pub const DATABASES: Declared = Declared {
    condition: conditions::DATABASES_APPLIED,
    failed: REASON_DATABASE_FAILED,
    field: "spec.databases",
    noun: "databases",
};

/// `status.roles` or `status.databases` (`out`) and their condition from the primary's
/// report (`report`): each declared object (`declared`, by name) with how it was applied
/// (one the report does not name yet is pending). Without declared objects both are
/// removed; while no primary answers (`report` is None), both stay as they were.
fn set_declared(
    what: &Declared,
    out: &mut Vec<pgop_api::roles::AppliedStatus>,
    c: &mut Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
    declared: &[&str],
    report: Option<&[pgop_api::roles::AppliedStatus]>,
    generation: Option<i64>,
    now: &Time,
) {
    if declared.is_empty() {
        out.clear();
        c.retain(|x| x.type_ != what.condition);
        return;
    }
    let Some(report) = report else {
        return;
    };
    *out = declared
        .iter()
        .map(|&d| {
            report
                .iter()
                .find(|r| r.name == d)
                .cloned()
                .unwrap_or_else(|| pgop_api::roles::AppliedStatus {
                    name: d.to_string(),
                    applied: false,
                    message: None,
                })
        })
        .collect();
    let failed: Vec<String> = out
        .iter()
        .filter_map(|r| Some(format!("{}: {}", r.name, r.message.as_deref()?)))
        .collect();
    let pending = out
        .iter()
        .filter(|r| !r.applied && r.message.is_none())
        .count();
    let noun = what.noun;
    let (ok, reason, message) = if !failed.is_empty() {
        (false, what.failed, failed.join("; "))
    } else if pending > 0 {
        (
            false,
            "Pending",
            format!("{pending} of {} declared {noun} not applied yet", out.len()),
        )
    } else {
        (
            true,
            "Applied",
            format!("all {} declared {noun} are as declared", out.len()),
        )
    };
    set_condition(
        c,
        new_condition(what.condition, ok, reason, message, generation, now.clone()),
        now.clone(),
    );
}

/// Longest part of a scheduler's message quoted per Pod.
const MAX_SCHEDULER_MESSAGE: usize = 400;

/// `InstancesScheduled=False`'s message: each planned instance whose Pod the scheduler
/// found no node for, with its words (quoted, cut to [`MAX_SCHEDULER_MESSAGE`]).
fn unschedulable_instances(name: &str, plan: &Plan, pods: &[Pod]) -> Option<String> {
    let all: Vec<String> = plan
        .serials
        .iter()
        .filter_map(|serial| {
            let instance = instance_name(name, *serial);
            let pod = pods
                .iter()
                .find(|p| p.name_any() == instance && p.metadata.deletion_timestamp.is_none())?;
            let words: String = unschedulable(pod)?
                .chars()
                .take(MAX_SCHEDULER_MESSAGE)
                .collect();
            Some(format!("pod {instance} cannot be scheduled: {words:?}"))
        })
        .collect();
    (!all.is_empty()).then(|| all.join("; "))
}

/// What was observed of the instances, and the roles decided from it.
pub struct Observations<'a> {
    pub pods: &'a [Pod],
    pub probes: &'a BTreeMap<String, Probe>,
    pub roles: &'a Roles,
}

/// An instance's `reason`, `message` and `downSince`: none while it is ready; what its
/// manager says while it is not; else (it restarts, or its manager does not answer) what
/// was last said, so that a reason does not flicker away while the instance retries.
fn down_status(
    ready: bool,
    pg: Option<&PgStatus>,
    previous: Option<&InstanceStatus>,
) -> (Option<String>, Option<String>, Option<String>) {
    if ready {
        return (None, None, None);
    }
    let kept = |p: &InstanceStatus| (p.reason.clone(), p.message.clone(), p.down_since.clone());
    // Why the instance went down, if that was not a state passed through on the way.
    let held = previous.filter(|p| {
        p.reason
            .as_deref()
            .is_some_and(|r| r != DownReason::NotStreaming.as_str())
    });
    match (pg.and_then(|s| s.down.as_ref()), held) {
        // A standby that is back up but not streaming yet (catching up after its volume
        // was freed, say) is still down for its reason: that stays until it is ready, so
        // that its InstanceBack Event names it then.
        (Some(down), Some(p)) if down.reason.passing() => kept(p),
        (Some(down), _) => (
            Some(down.reason.as_str().to_string()),
            Some(down_message(down)),
            down.since.clone(),
        ),
        (None, _) => previous.map(kept).unwrap_or_default(),
    }
}

/// The instances that are not ready with a reason, as "name (Reason)", for the messages
/// of Ready and Degraded.
fn down_instances(instances: &[InstanceStatus]) -> Vec<String> {
    instances
        .iter()
        .filter(|i| !i.ready)
        .map(|i| match &i.reason {
            Some(reason) => format!("{} ({reason})", i.name),
            None => i.name.clone(),
        })
        .collect()
}

/// The action of an `InstanceDown` Event: the reason and a digest of the words, so that
/// the recorder (which folds Events of the same reason, action and objects into one series,
/// keeping the first note) keeps apart two failures of one reason with other words (a
/// parameter, then another), and folds the same failure seen again.
fn down_action(reason: &str, message: Option<&str>) -> String {
    // FNV-1a: the same words give the same digest in every operator process.
    let digest = message
        .unwrap_or_default()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    format!("{reason}-{:08x}", digest >> 32)
}

/// An Event about one instance: `InstanceDown` (a Warning) when it is down for a reason it
/// was not before, or with other words, `InstanceBack` when it is ready again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceEvent {
    pub warning: bool,
    pub reason: &'static str,
    /// The Event's action: the down reason, so that the recorder keeps two reasons apart.
    pub action: String,
    pub instance: String,
    pub note: String,
}

/// The instance Events of a status change: one `InstanceDown` per instance and reason
/// (none for a state a standby passes through, [`DownReason::passing`]: status only),
/// one `InstanceBack` when an instance that was down is ready again.
pub fn instance_events(
    old: Option<&PostgresClusterStatus>,
    new: &PostgresClusterStatus,
) -> Vec<InstanceEvent> {
    let quiet = |reason: &str| reason == DownReason::NotStreaming.as_str();
    let mut events = Vec::new();
    for i in &new.instances {
        let before = old.and_then(|o| o.instances.iter().find(|p| p.name == i.name));
        let was = before
            .and_then(|b| b.reason.as_deref())
            .filter(|r| !quiet(r));
        match i.reason.as_deref() {
            Some(reason)
                if !quiet(reason)
                    && (was != Some(reason)
                        || before.and_then(|b| b.message.as_deref()) != i.message.as_deref()) =>
            {
                events.push(InstanceEvent {
                    warning: true,
                    reason: "InstanceDown",
                    action: down_action(reason, i.message.as_deref()),
                    instance: i.name.clone(),
                    note: format!(
                        "{} is down ({reason}): {}",
                        i.name,
                        i.message.as_deref().unwrap_or("")
                    ),
                });
            }
            None if i.ready
                && let Some(was) = was =>
            {
                events.push(InstanceEvent {
                    warning: false,
                    reason: "InstanceBack",
                    action: was.to_string(),
                    instance: i.name.clone(),
                    note: format!("{} is ready again (it was down: {was})", i.name),
                })
            }
            _ => {}
        }
    }
    events
}

/// The status of a cluster whose spec is valid, given its instance plan, its pods, what
/// the instances reported and the roles decided.
///
/// The WAL positions of the instances are published at most every [`POSITIONS_INTERVAL`]
/// unless something else about the instances changed: see
/// [`publish_positions_at_most_every`], whose answer (when held-back positions are due)
/// comes with the status.
pub fn compute(
    cluster: &PostgresCluster,
    plan: &Plan,
    seen: &Observations,
    now: Time,
) -> (PostgresClusterStatus, Option<std::time::Duration>) {
    let Observations {
        pods,
        probes,
        roles,
    } = *seen;
    let name = cluster.name_any();
    let generation = cluster.metadata.generation;
    let old = cluster.status.clone().unwrap_or_default();
    let mut status = old.clone();

    status.instances = plan
        .serials
        .iter()
        .map(|serial| {
            let instance = instance_name(&name, *serial);
            let pod = pods.iter().find(|p| p.name_any() == instance);
            let previous = old.instances.iter().find(|i| i.name == instance);
            let pg = probes.get(&instance).and_then(Probe::status);
            // Positions are the last ones reported: an instance that stopped answering
            // keeps them (they matter for a post-mortem), but no role.
            let (timeline, received, replayed) = match pg {
                Some(s) if s.role != PgRole::Stopped => (
                    s.timeline,
                    s.received_lsn.clone().or_else(|| s.current_lsn.clone()),
                    s.replayed_lsn.clone(),
                ),
                _ => (
                    previous.and_then(|p| p.timeline),
                    previous.and_then(|p| p.received_lsn.clone()),
                    previous.and_then(|p| p.replayed_lsn.clone()),
                ),
            };
            let ready = pod.is_some_and(pod_ready);
            let (reason, message, down_since) = down_status(ready, pg, previous);
            InstanceStatus {
                role: match pg.map(|s| s.role) {
                    // A replica cluster's designated primary is its primary: the one the
                    // `-rw` Service and the other instances follow (it takes no writes).
                    Some(PgRole::Primary | PgRole::DesignatedPrimary) => {
                        Some(InstanceRole::Primary)
                    }
                    Some(PgRole::Replica) => Some(InstanceRole::Replica),
                    _ => None,
                },
                ready,
                timeline,
                received_lsn: received,
                replayed_lsn: replayed,
                // Only while it answers: a Pod replaced by one of another image runs
                // another manager, which says its version once it answers.
                manager_version: pg.and_then(|s| s.manager_version.clone()),
                postgres_version: pg.and_then(|s| s.postgres_version.clone()),
                fenced: pg.is_some_and(|s| s.fenced),
                reason,
                message,
                down_since,
                name: instance,
                serial: *serial,
            }
        })
        .collect();
    let positions_due =
        publish_positions_at_most_every(&mut status, &old, &now, POSITIONS_INTERVAL);
    let desired = plan.serials.len() as i32;
    let existing = status
        .instances
        .iter()
        .filter(|i| pods.iter().any(|p| p.name_any() == i.name))
        .count() as i32;
    let ready = status.instances.iter().filter(|i| i.ready).count() as i32;
    status.replicas = existing;
    status.ready_replicas = ready;
    status.selector = Some(labels::instance_selector(&name));
    status.next_serial = plan.next_serial;
    status.observed_generation = generation;
    status.current_primary = Some(roles.current.clone());
    status.target_primary = Some(roles.target.clone());
    status.target_primary_since = if old.target_primary.as_deref() == Some(roles.target.as_str()) {
        old.target_primary_since
            .clone()
            .or_else(|| Some(now.clone()))
    } else {
        Some(now.clone())
    };
    // The pass that names a new target hands its trace to the target's promotion.
    status.target_primary_trace = if old.target_primary.as_deref() == Some(roles.target.as_str()) {
        old.target_primary_trace.clone()
    } else {
        pgop_telemetry::current_traceparent()
    };

    let was_ready = matches!(
        old.phase,
        Some(
            ClusterPhase::Ready
                | ClusterPhase::Degraded
                | ClusterPhase::FailingOver
                | ClusterPhase::SwitchingOver
        )
    );
    // Back from hibernation: Resuming until the primary is available again (no failover
    // meanwhile, see roles.rs), then Ready, or Degraded while short of instances.
    let back_from_hibernation = super::hibernation::resuming_from(old.phase);
    let was_ready = was_ready || back_from_hibernation;
    let resuming = back_from_hibernation && !roles.primary.available;
    let all_ready = ready == desired && existing == desired && !roles.in_transition();
    let unplaced = unschedulable_instances(&name, plan, pods);
    // A cluster whose primary serves while an instance waits for a node that may never
    // come is short of instances (Degraded), not still being created.
    let serving_short = unplaced.is_some() && roles.primary.available && ready > 0;
    let short = (was_ready || serving_short) && !all_ready;
    status.phase = Some(match roles.phase {
        Some(phase) => phase,
        None if all_ready => ClusterPhase::Ready,
        None if resuming => ClusterPhase::Resuming,
        None if short => ClusterPhase::Degraded,
        None => ClusterPhase::Creating,
    });

    let refused = refused_configuration(&status.instances, probes);
    let c = &mut status.conditions;
    let cond = |t, s, r, m: String| new_condition(t, s, r, m, generation, now.clone());
    match &refused {
        Some(Refused::None) => {
            set_condition(
                c,
                cond(
                    conditions::CONFIGURATION_APPLIED,
                    true,
                    "Applied",
                    "every instance that answers runs with spec.postgresql".into(),
                ),
                now.clone(),
            );
        }
        Some(Refused::Some(message)) => {
            set_condition(
                c,
                cond(
                    conditions::CONFIGURATION_APPLIED,
                    false,
                    REASON_PARAMETERS_REFUSED,
                    message.clone(),
                ),
                now.clone(),
            );
        }
        Some(Refused::CannotStart(message)) => {
            set_condition(
                c,
                cond(
                    conditions::CONFIGURATION_APPLIED,
                    false,
                    REASON_INSTANCE_CANNOT_START,
                    message.clone(),
                ),
                now.clone(),
            );
        }
        // No instance answered: what was last seen stays.
        None => {}
    }
    let ready_note = if matches!(refused, Some(Refused::Some(_))) {
        "; some of spec.postgresql was refused and is not in effect (see ConfigurationApplied)"
    } else {
        ""
    };
    let down = down_instances(&status.instances);
    let why = status
        .instances
        .iter()
        .find(|i| !i.ready && i.message.is_some())
        .and_then(|i| Some(format!("{}: {}", i.name, i.message.as_deref()?)));
    let not_ready_note = match (down.is_empty(), why) {
        (true, _) => String::new(),
        (false, Some(why)) => format!(
            "; not ready: {}; why: {}",
            down.join(", "),
            printable(&why, 300)
        ),
        (false, None) => format!("; not ready: {}", down.join(", ")),
    };
    set_spec_valid(c, generation, &now);
    // spec.roles and spec.databases, as the primary's manager last applied them.
    let primary_report = probes
        .get(&roles.current)
        .and_then(Probe::status)
        .filter(|s| s.role == PgRole::Primary);
    set_declared(
        &ROLES,
        &mut status.roles,
        c,
        &cluster
            .spec
            .roles
            .iter()
            .map(|r| r.name.as_str())
            .collect::<Vec<_>>(),
        primary_report.map(|s| s.roles.as_slice()),
        generation,
        &now,
    );
    set_declared(
        &DATABASES,
        &mut status.databases,
        c,
        &cluster
            .spec
            .databases
            .iter()
            .map(|d| d.name.as_str())
            .collect::<Vec<_>>(),
        primary_report.map(|s| s.databases.as_slice()),
        generation,
        &now,
    );
    // A cluster that hibernated says it resumed (clusters that never did have no such
    // condition).
    if conditions::find_condition(c, conditions::HIBERNATED).is_some() {
        let message = if resuming {
            "spec.hibernate is false: the instances start again on their volumes".to_string()
        } else {
            "spec.hibernate is false: the cluster resumed".to_string()
        };
        let reason = if resuming { "Resuming" } else { "Resumed" };
        set_condition(
            c,
            cond(conditions::HIBERNATED, false, reason, message),
            now.clone(),
        );
    }
    set_condition(
        c,
        if all_ready {
            cond(
                conditions::READY,
                true,
                "AllInstancesReady",
                format!("{ready} of {desired} instances are ready{ready_note}"),
            )
        } else {
            cond(
                conditions::READY,
                false,
                "InstancesNotReady",
                format!("{ready} of {desired} instances are ready{not_ready_note}"),
            )
        },
        now.clone(),
    );
    let scaling = existing != desired;
    set_condition(
        c,
        if all_ready {
            cond(
                conditions::PROGRESSING,
                false,
                "ReconcileComplete",
                "every instance is in place and ready".into(),
            )
        } else if scaling {
            cond(
                conditions::PROGRESSING,
                true,
                "Scaling",
                format!("{existing} of {desired} instances exist"),
            )
        } else {
            cond(
                conditions::PROGRESSING,
                true,
                "WaitingForInstances",
                format!(
                    "waiting for {} instance(s) to become ready",
                    desired - ready
                ),
            )
        },
        now.clone(),
    );
    let primary = &roles.primary;
    let was_fenced = conditions::find_condition(c, conditions::PRIMARY_AVAILABLE)
        .is_some_and(|p| p.reason == REASON_FENCED);
    set_condition(
        c,
        cond(
            conditions::PRIMARY_AVAILABLE,
            primary.available,
            primary.reason,
            primary.message.clone(),
        ),
        now.clone(),
    );
    // The failover delay counts from lastTransitionTime: an outage that is no longer on
    // purpose (the primary unfenced, still down) starts its clock now, not when the fence
    // began.
    if was_fenced
        && !primary.available
        && primary.reason != REASON_FENCED
        && let Some(p) = c
            .iter_mut()
            .find(|p| p.type_ == conditions::PRIMARY_AVAILABLE)
    {
        p.last_transition_time = conditions::whole_seconds(now.clone());
    }
    set_condition(
        c,
        match &unplaced {
            Some(message) => cond(
                conditions::INSTANCES_SCHEDULED,
                false,
                REASON_UNSCHEDULABLE,
                message.clone(),
            ),
            None => cond(
                conditions::INSTANCES_SCHEDULED,
                true,
                "Scheduled",
                "no instance Pod is waiting for a node the scheduler cannot find".into(),
            ),
        },
        now.clone(),
    );
    set_condition(
        c,
        if short && unplaced.is_some() {
            cond(
                conditions::DEGRADED,
                true,
                "InstancesUnschedulable",
                format!(
                    "{} of {desired} instances are not ready; the scheduler finds no node for \
                     some (see InstancesScheduled)",
                    desired - ready
                ),
            )
        } else if short {
            cond(
                conditions::DEGRADED,
                true,
                "InstancesNotReady",
                format!(
                    "{} of {desired} instances are not ready{not_ready_note}",
                    desired - ready
                ),
            )
        } else {
            cond(
                conditions::DEGRADED,
                false,
                "NotDegraded",
                "no instance that was ready has failed".into(),
            )
        },
        now,
    );
    (status, positions_due)
}

/// Sets `RolloutBlocked`: True with the reason and message of `blocked`, else False.
pub fn set_rollout_blocked(
    status: &mut PostgresClusterStatus,
    blocked: Option<super::rolling::Blocked>,
    generation: Option<i64>,
    now: Time,
) {
    let condition = match blocked {
        Some(b) => new_condition(
            conditions::ROLLOUT_BLOCKED,
            true,
            b.reason,
            b.message,
            generation,
            now.clone(),
        ),
        None => new_condition(
            conditions::ROLLOUT_BLOCKED,
            false,
            "NotBlocked",
            "no rolling update is waiting for an instance that did not come back",
            generation,
            now.clone(),
        ),
    };
    set_condition(&mut status.conditions, condition, now);
}

/// The reason of `ConfigurationApplied=False`.
pub const REASON_PARAMETERS_REFUSED: &str = "ParametersRefused";

/// What the instances said of the spec's configuration.
enum Refused {
    /// Every instance that answered applied all of it.
    None,
    /// Something was refused: instance, parameter, value and reason, for people.
    Some(String),
    /// An instance does not start since a restart applied the spec's parameters: which,
    /// with the parameters and PostgreSQL's words.
    CannotStart(String),
}

/// Longest `ConfigurationApplied` message: the first refusals, then a count.
const MAX_REFUSED_MESSAGE: usize = 1024;

/// The refused parameters and pg_hba rules every answering instance reports; `None` when
/// no instance answered.
fn refused_configuration(
    instances: &[InstanceStatus],
    probes: &BTreeMap<String, Probe>,
) -> Option<Refused> {
    let answered: Vec<(&str, &pgop_api::instance_status::PgStatus)> = instances
        .iter()
        .filter_map(|i| {
            probes
                .get(&i.name)
                .and_then(Probe::status)
                .map(|s| (i.name.as_str(), s))
        })
        .collect();
    if answered.is_empty() {
        return None;
    }
    let cannot_start: Vec<String> = answered
        .iter()
        .filter_map(|(name, s)| {
            let down = s
                .down
                .as_ref()
                .filter(|d| d.cannot_start_with_parameters())?;
            Some(format!("{name}: {}", down_message(down)))
        })
        .collect();
    if !cannot_start.is_empty() {
        let message = format!(
            "not in effect: an instance cannot start with it ({})",
            cannot_start.join("; ")
        );
        return Some(Refused::CannotStart(printable(
            &message,
            MAX_REFUSED_MESSAGE,
        )));
    }
    let all: Vec<String> = answered
        .iter()
        .flat_map(|(name, s)| {
            s.invalid_parameters.iter().map(move |p| {
                let value: String = p.value.chars().take(80).collect();
                format!("{name}: {} = {value:?}: {}", p.name, p.reason)
            })
        })
        .collect();
    if all.is_empty() {
        return Some(Refused::None);
    }
    let mut message = String::from("refused, the last good value is in effect: ");
    for (i, line) in all.iter().enumerate() {
        if message.len() + line.len() > MAX_REFUSED_MESSAGE {
            message.push_str(&format!(" (and {} more)", all.len() - i));
            break;
        }
        if i > 0 {
            message.push_str("; ");
        }
        message.push_str(line);
    }
    Some(Refused::Some(message))
}

/// The status of a cluster whose spec failed validation: everything observed before
/// stays, the phase is Invalid and SpecValid names the fields.
pub fn invalid(cluster: &PostgresCluster, message: &str, now: Time) -> PostgresClusterStatus {
    let generation = cluster.metadata.generation;
    let mut status = cluster.status.clone().unwrap_or_default();
    status.phase = Some(ClusterPhase::Invalid);
    status.observed_generation = generation;
    set_condition(
        &mut status.conditions,
        new_condition(
            conditions::SPEC_VALID,
            false,
            "InvalidSpec",
            message,
            generation,
            now.clone(),
        ),
        now,
    );
    status
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::decide::serials::plan;
    use k8s_openapi::jiff::Timestamp;
    use std::collections::BTreeSet;

    fn cluster(status: Option<PostgresClusterStatus>) -> PostgresCluster {
        let mut c: PostgresCluster = serde_yaml::from_str(
            "apiVersion: database.example.com/v1beta1\nkind: PostgresCluster\nmetadata: {name: main, namespace: db, uid: u1, generation: 3}\nspec: {instances: 2, storage: {size: 1Gi}}\n",
        )
        .expect("fixture parses");
        c.status = status;
        c
    }

    fn pod(name: &str, ready: bool) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "status": {"conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}
        }))
        .expect("pod")
    }

    #[test]
    fn positions_alone_are_published_at_most_every_interval() {
        let at = |secs: i64| Time(Timestamp::from_second(1_800_000_000 + secs).expect("time"));
        let instance = |name: &str, role: InstanceRole, received: &str| InstanceStatus {
            name: name.into(),
            serial: 1,
            role: Some(role),
            ready: true,
            timeline: Some(1),
            received_lsn: Some(received.into()),
            replayed_lsn: Some(received.into()),
            manager_version: None,
            postgres_version: None,
            fenced: false,
            reason: None,
            message: None,
            down_since: None,
        };
        let with = |instances: Vec<InstanceStatus>, observed: Option<Time>| PostgresClusterStatus {
            instances,
            positions_observed_at: observed,
            ..PostgresClusterStatus::default()
        };
        let interval = std::time::Duration::from_secs(30);
        let old = with(
            vec![
                instance("main-1", InstanceRole::Primary, "0/3000000"),
                instance("main-2", InstanceRole::Replica, "0/3000000"),
            ],
            Some(at(0)),
        );
        let moved = || {
            with(
                vec![
                    instance("main-1", InstanceRole::Primary, "0/4000000"),
                    instance("main-2", InstanceRole::Replica, "0/3F00000"),
                ],
                None,
            )
        };

        // Only the positions moved, 10 s after the last publication: the old ones stay,
        // and are due 20 s later.
        let mut status = moved();
        let due = publish_positions_at_most_every(&mut status, &old, &at(10), interval);
        assert_eq!(status, old, "nothing to write");
        assert_eq!(due, Some(std::time::Duration::from_secs(20)));

        // 30 s after: published, with the time they were read.
        let mut status = moved();
        let due = publish_positions_at_most_every(&mut status, &old, &at(30), interval);
        assert_eq!(
            due,
            Some(interval),
            "a look again when they may have moved on"
        );
        assert_eq!(status.instances, moved().instances);
        assert_eq!(status.positions_observed_at, Some(at(30)));

        // A role changed: everything is current at once, positions included.
        let mut status = moved();
        status.instances[1].role = None;
        let due = publish_positions_at_most_every(&mut status, &old, &at(5), interval);
        assert_eq!(due, Some(interval));
        assert_eq!(
            status.instances[0].received_lsn.as_deref(),
            Some("0/4000000")
        );
        assert_eq!(status.positions_observed_at, Some(at(5)));

        // Unchanged positions keep their time; a status without one gets it.
        let mut status = old.clone();
        let due = publish_positions_at_most_every(&mut status, &old, &at(90), interval);
        assert_eq!((status.clone(), due), (old.clone(), None));
        let mut status = with(old.instances.clone(), None);
        let due = publish_positions_at_most_every(
            &mut status,
            &with(old.instances.clone(), None),
            &at(7),
            interval,
        );
        assert_eq!(due, None);
        assert_eq!(status.positions_observed_at, Some(at(7)));
    }

    /// Roles with `primary` running and in place.
    fn running(primary: &str) -> Roles {
        Roles {
            current: primary.into(),
            target: primary.into(),
            phase: None,
            primary: crate::cluster::decide::roles::Availability {
                available: true,
                reason: "PrimaryRunning",
                message: "runs".into(),
            },
            notes: Vec::new(),
            clear_switchover_request: false,
        }
    }

    /// The status with the plan's primary healthy and in place.
    fn compute_with(
        cluster: &PostgresCluster,
        plan: &Plan,
        pods: &[Pod],
        now: Time,
    ) -> PostgresClusterStatus {
        let roles = running(&instance_name("main", plan.primary));
        let probes = BTreeMap::new();
        let seen = Observations {
            pods,
            probes: &probes,
            roles: &roles,
        };
        compute(cluster, plan, &seen, now).0
    }

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).expect("valid time"))
    }

    #[test]
    fn a_cluster_back_from_hibernation_resumes_until_its_primary_runs() {
        let p = plan(2, &BTreeSet::from([1, 2]), 3, Some(1));
        let hibernated: PostgresClusterStatus = serde_yaml::from_str(
            "{phase: Hibernated, currentPrimary: main-1, targetPrimary: main-1, conditions: [{type: Hibernated, status: 'True', reason: Hibernated, message: x, lastTransitionTime: '1970-01-01T00:00:10Z'}]}",
        )
        .expect("status");
        let mut down = running("main-1");
        down.primary.available = false;
        down.primary.reason = "NotProbed";
        let probes = BTreeMap::new();
        let pods = [pod("main-1", false), pod("main-2", true)];
        let seen = Observations {
            pods: &pods,
            probes: &probes,
            roles: &down,
        };
        let resuming = compute(&cluster(Some(hibernated)), &p, &seen, at(100)).0;
        assert_eq!(resuming.phase, Some(ClusterPhase::Resuming));
        let c = conditions::find_condition(&resuming.conditions, conditions::HIBERNATED)
            .expect("Hibernated");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "Resuming")
        );
        // The primary runs, a standby is not ready yet: Degraded; all ready: Ready.
        let degraded = compute_with(
            &cluster(Some(resuming.clone())),
            &p,
            &[pod("main-1", true), pod("main-2", false)],
            at(110),
        );
        assert_eq!(degraded.phase, Some(ClusterPhase::Degraded));
        let ready = compute_with(
            &cluster(Some(resuming)),
            &p,
            &[pod("main-1", true), pod("main-2", true)],
            at(110),
        );
        assert_eq!(ready.phase, Some(ClusterPhase::Ready));
        let c = conditions::find_condition(&ready.conditions, conditions::HIBERNATED)
            .expect("Hibernated");
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "Resumed"));
        // A cluster that never hibernated gets no such condition.
        let plain = compute_with(&cluster(None), &p, &pods, at(100));
        assert!(conditions::find_condition(&plain.conditions, conditions::HIBERNATED).is_none());
    }

    #[test]
    fn all_pods_ready_makes_the_cluster_ready() {
        let p = plan(2, &BTreeSet::from([1, 2]), 3, Some(1));
        let s = compute_with(
            &cluster(None),
            &p,
            &[pod("main-1", true), pod("main-2", true)],
            at(100),
        );
        assert_eq!(s.phase, Some(ClusterPhase::Ready));
        assert_eq!(s.ready_replicas, 2);
        assert_eq!(s.current_primary.as_deref(), Some("main-1"));
        assert_eq!(s.observed_generation, Some(3));
        assert!(conditions::is_true(&s.conditions, conditions::READY));
        assert!(!conditions::is_true(&s.conditions, conditions::PROGRESSING));
    }

    #[test]
    fn an_unready_pod_after_ready_is_degraded_and_transition_times_move_only_on_change() {
        let p = plan(2, &BTreeSet::from([1, 2]), 3, Some(1));
        let ready = compute_with(
            &cluster(None),
            &p,
            &[pod("main-1", true), pod("main-2", true)],
            at(100),
        );
        let again = compute_with(
            &cluster(Some(ready.clone())),
            &p,
            &[pod("main-1", true), pod("main-2", true)],
            at(200),
        );
        assert_eq!(ready, again, "nothing changed, so nothing to write");
        assert_eq!(
            again.target_primary_since,
            Some(at(100)),
            "the target has not changed since it was first set"
        );
        let degraded = compute_with(
            &cluster(Some(ready)),
            &p,
            &[pod("main-1", true), pod("main-2", false)],
            at(300),
        );
        assert_eq!(degraded.phase, Some(ClusterPhase::Degraded));
        let r = conditions::find_condition(&degraded.conditions, conditions::READY).expect("Ready");
        assert_eq!(r.last_transition_time, at(300));
        let v = conditions::find_condition(&degraded.conditions, conditions::SPEC_VALID)
            .expect("SpecValid");
        assert_eq!(v.last_transition_time, at(100));
    }

    #[test]
    fn a_new_cluster_is_creating_until_its_pods_are_ready() {
        let p = plan(2, &BTreeSet::new(), 1, None);
        let s = compute_with(&cluster(None), &p, &[], at(1));
        assert_eq!(s.phase, Some(ClusterPhase::Creating));
        assert_eq!(s.next_serial, 3);
        let prog = conditions::find_condition(&s.conditions, conditions::PROGRESSING)
            .expect("Progressing");
        assert_eq!(prog.reason, "Scaling");
    }

    #[test]
    fn an_instance_that_cannot_start_is_named_with_its_reason_until_it_is_ready_again() {
        use pgop_api::instance_status::{Down, DownReason, PgStatus};
        let p = plan(2, &BTreeSet::from([1, 2]), 3, Some(1));
        let roles = running("main-1");
        let down = Down {
            reason: DownReason::StartFailed,
            message: "FATAL:  could not map anonymous shared memory: Cannot allocate memory".into(),
            parameters: vec!["huge_pages".into()],
            since: Some("2026-12-06T02:00:00Z".into()),
        };
        let probes_with = |down: Option<Down>| {
            let mut primary = PgStatus::stopped("main-1", false);
            primary.role = PgRole::Primary;
            let mut standby = PgStatus::stopped("main-2", false);
            standby.down = down;
            BTreeMap::from([
                ("main-1".to_string(), Probe::Status(Box::new(primary))),
                ("main-2".to_string(), Probe::Status(Box::new(standby))),
            ])
        };
        let compute_at = |old: Option<PostgresClusterStatus>,
                          probes: &BTreeMap<String, Probe>,
                          standby_ready: bool,
                          t| {
            let pods = [pod("main-1", true), pod("main-2", standby_ready)];
            let seen = Observations {
                pods: &pods,
                probes,
                roles: &roles,
            };
            compute(&cluster(old), &p, &seen, at(t)).0
        };
        let ready = compute_at(None, &probes_with(None), true, 10);

        // Down after the restart for huge_pages.
        let failed = compute_at(
            Some(ready.clone()),
            &probes_with(Some(down.clone())),
            false,
            20,
        );
        let i = &failed.instances[1];
        assert_eq!(i.reason.as_deref(), Some("StartFailed"));
        assert_eq!(i.down_since.as_deref(), Some("2026-12-06T02:00:00Z"));
        let message = i.message.as_deref().expect("message");
        assert!(
            message.starts_with("after the restart for huge_pages: FATAL:  could not map"),
            "{message}"
        );
        let cond = |s: &PostgresClusterStatus, t: &str| {
            conditions::find_condition(&s.conditions, t)
                .cloned()
                .expect("condition")
        };
        let r = cond(&failed, conditions::READY);
        assert!(
            r.message.contains(
                "not ready: main-2 (StartFailed); why: main-2: after the restart for huge_pages"
            ),
            "{}",
            r.message
        );
        let d = cond(&failed, conditions::DEGRADED);
        assert_eq!(d.status, conditions::TRUE);
        assert!(d.message.contains("main-2 (StartFailed)"), "{}", d.message);
        let a = cond(&failed, conditions::CONFIGURATION_APPLIED);
        assert_eq!(
            (a.status.as_str(), a.reason.as_str()),
            (conditions::FALSE, REASON_INSTANCE_CANNOT_START)
        );
        assert!(
            a.message
                .contains("main-2: after the restart for huge_pages"),
            "{}",
            a.message
        );
        let events = instance_events(Some(&ready), &failed);
        assert_eq!(events.len(), 1, "{events:?}");
        assert!(events[0].warning);
        assert_eq!(
            (
                events[0].reason,
                events[0].action.as_str(),
                events[0].instance.as_str()
            ),
            (
                "InstanceDown",
                down_action("StartFailed", failed.instances[1].message.as_deref()).as_str(),
                "main-2"
            )
        );
        assert!(
            events[0].note.contains("FATAL:  could not map"),
            "{}",
            events[0].note
        );
        // The same reason again: no second Event.
        let again = compute_at(
            Some(failed.clone()),
            &probes_with(Some(down.clone())),
            false,
            30,
        );
        assert!(instance_events(Some(&failed), &again).is_empty());
        // The same reason with other words (another parameter): a second Event, which the
        // recorder keeps apart from the first (another action).
        let mut other = down.clone();
        other.parameters = vec!["shared_preload_libraries".into()];
        other.message = "FATAL:  could not load library \"/x\"".into();
        let second = compute_at(Some(again.clone()), &probes_with(Some(other)), false, 35);
        let events = instance_events(Some(&again), &second);
        assert_eq!(events.len(), 1, "{events:?}");
        assert!(
            events[0].note.contains("shared_preload_libraries"),
            "{}",
            events[0].note
        );
        assert_ne!(
            events[0].action,
            down_action("StartFailed", failed.instances[1].message.as_deref())
        );
        let again = compute_at(
            Some(second.clone()),
            &probes_with(Some(down.clone())),
            false,
            38,
        );

        // Restarting with the parameter removed, the manager says nothing: the reason stays.
        let restarting = compute_at(Some(again.clone()), &BTreeMap::new(), false, 40);
        assert_eq!(
            restarting.instances[1].reason.as_deref(),
            Some("StartFailed")
        );
        assert!(instance_events(Some(&again), &restarting).is_empty());
        // Up again but not streaming yet (catching up): still down for its reason, no Event.
        let catching_up = Down {
            reason: DownReason::NotStreaming,
            message: "does not stream".into(),
            parameters: Vec::new(),
            since: None,
        };
        let restarting = compute_at(
            Some(restarting.clone()),
            &probes_with(Some(catching_up)),
            false,
            45,
        );
        assert_eq!(
            restarting.instances[1].reason.as_deref(),
            Some("StartFailed")
        );
        assert_eq!(
            restarting.instances[1].down_since.as_deref(),
            Some("2026-12-06T02:00:00Z")
        );
        assert!(instance_events(Some(&again), &restarting).is_empty());

        // Ready again: everything cleared, and one InstanceBack.
        let back = compute_at(Some(restarting.clone()), &probes_with(None), true, 50);
        assert_eq!(back.instances[1].reason, None);
        assert_eq!(back.instances[1].message, None);
        assert_eq!(back.instances[1].down_since, None);
        assert_eq!(
            cond(&back, conditions::CONFIGURATION_APPLIED).status,
            conditions::TRUE
        );
        assert_eq!(cond(&back, conditions::READY).status, conditions::TRUE);
        let events = instance_events(Some(&restarting), &back);
        assert_eq!(events.len(), 1, "{events:?}");
        assert!(!events[0].warning);
        assert_eq!(
            (events[0].reason, events[0].action.as_str()),
            ("InstanceBack", "StartFailed")
        );

        // A standby between two primaries is in status only: no Event either way.
        let passing = Down {
            reason: DownReason::NotStreaming,
            message: "does not stream".into(),
            parameters: Vec::new(),
            since: None,
        };
        let streaming_not = compute_at(Some(back.clone()), &probes_with(Some(passing)), false, 60);
        assert_eq!(
            streaming_not.instances[1].reason.as_deref(),
            Some("NotStreaming")
        );
        assert!(instance_events(Some(&back), &streaming_not).is_empty());
        let streaming = compute_at(Some(streaming_not.clone()), &probes_with(None), true, 70);
        assert!(instance_events(Some(&streaming_not), &streaming).is_empty());
    }

    #[test]
    fn refused_parameters_turn_configuration_applied_false_and_fixing_them_turns_it_true() {
        use pgop_api::instance_status::{InvalidParameter, PgStatus};
        let p = plan(2, &BTreeSet::from([1, 2]), 3, Some(1));
        let pods = [pod("main-1", true), pod("main-2", true)];
        let roles = running("main-1");
        let answering = |invalid: Vec<InvalidParameter>| {
            let mut status = PgStatus::stopped("main-2", false);
            status.invalid_parameters = invalid;
            BTreeMap::from([
                (
                    "main-1".to_string(),
                    Probe::Status(Box::new(PgStatus::stopped("main-1", false))),
                ),
                ("main-2".to_string(), Probe::Status(Box::new(status))),
            ])
        };
        let compute_at = |cluster: &PostgresCluster, probes: &BTreeMap<String, Probe>, t| {
            let seen = Observations {
                pods: &pods,
                probes,
                roles: &roles,
            };
            compute(cluster, &p, &seen, at(t)).0
        };

        let bad = answering(vec![InvalidParameter {
            name: "work_mem".into(),
            value: "lots".into(),
            reason: "\"lots\" is not a number".into(),
        }]);
        let refused = compute_at(&cluster(None), &bad, 100);
        let c = conditions::find_condition(&refused.conditions, conditions::CONFIGURATION_APPLIED)
            .expect("ConfigurationApplied");
        assert_eq!(c.status, conditions::FALSE);
        assert_eq!(c.reason, REASON_PARAMETERS_REFUSED);
        assert!(
            c.message.contains("main-2: work_mem = \"lots\""),
            "{}",
            c.message
        );
        let r = conditions::find_condition(&refused.conditions, conditions::READY).expect("Ready");
        assert!(r.message.contains("ConfigurationApplied"), "{}", r.message);

        // Nobody answers: what was seen stays.
        let silent = BTreeMap::from([("main-1".to_string(), Probe::Unreachable("refused".into()))]);
        let still = compute_at(&cluster(Some(refused.clone())), &silent, 150);
        assert!(!conditions::is_true(
            &still.conditions,
            conditions::CONFIGURATION_APPLIED
        ));

        let fixed = compute_at(&cluster(Some(refused)), &answering(Vec::new()), 200);
        let c = conditions::find_condition(&fixed.conditions, conditions::CONFIGURATION_APPLIED)
            .expect("ConfigurationApplied");
        assert_eq!(c.status, conditions::TRUE);
        assert_eq!(c.last_transition_time, at(200));
    }

    /// A Pod the scheduler found no node for.
    fn unplaced(name: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"containers": []},
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled",
                "status": "False", "reason": "Unschedulable",
                "message": "0/3 nodes are available: 2 node(s) didn't match pod anti-affinity rules."}]}
        }))
        .expect("pod")
    }

    #[test]
    fn an_instance_without_a_node_is_reported_and_a_serving_cluster_is_degraded() {
        let p = plan(3, &BTreeSet::from([1, 2, 3]), 4, Some(1));
        let short = [pod("main-1", true), pod("main-2", true), unplaced("main-3")];
        let s = compute_with(&cluster(None), &p, &short, at(100));
        assert_eq!(
            s.phase,
            Some(ClusterPhase::Degraded),
            "the primary serves, a standby waits for a node: degraded, not creating"
        );
        assert_eq!(s.ready_replicas, 2);
        let c = conditions::find_condition(&s.conditions, conditions::INSTANCES_SCHEDULED)
            .expect("InstancesScheduled");
        assert_eq!(c.status, conditions::FALSE);
        assert_eq!(c.reason, REASON_UNSCHEDULABLE);
        assert_eq!(
            c.message,
            "pod main-3 cannot be scheduled: \"0/3 nodes are available: 2 node(s) didn't match pod anti-affinity rules.\""
        );
        let d = conditions::find_condition(&s.conditions, conditions::DEGRADED).expect("Degraded");
        assert_eq!(
            (d.status.as_str(), d.reason.as_str()),
            ("True", "InstancesUnschedulable")
        );
        assert!(!conditions::is_true(&s.conditions, conditions::READY));

        // Placed and ready: scheduled again, Ready, and the condition's time moves.
        let placed = [
            pod("main-1", true),
            pod("main-2", true),
            pod("main-3", true),
        ];
        let healed = compute_with(&cluster(Some(s)), &p, &placed, at(200));
        assert_eq!(healed.phase, Some(ClusterPhase::Ready));
        let c = conditions::find_condition(&healed.conditions, conditions::INSTANCES_SCHEDULED)
            .expect("InstancesScheduled");
        assert_eq!(c.status, conditions::TRUE);
        assert_eq!(c.last_transition_time, at(200));
        assert!(!conditions::is_true(
            &healed.conditions,
            conditions::DEGRADED
        ));
    }

    #[test]
    fn without_a_ready_instance_an_unschedulable_cluster_is_still_creating() {
        let p = plan(2, &BTreeSet::from([1, 2]), 3, Some(1));
        let s = compute_with(
            &cluster(None),
            &p,
            &[unplaced("main-1"), unplaced("main-2")],
            at(100),
        );
        assert_eq!(s.phase, Some(ClusterPhase::Creating));
        let c = conditions::find_condition(&s.conditions, conditions::INSTANCES_SCHEDULED)
            .expect("InstancesScheduled");
        assert!(
            c.message.contains("pod main-1 cannot be scheduled"),
            "{}",
            c.message
        );
        assert!(
            c.message.contains("; pod main-2 cannot be scheduled"),
            "{}",
            c.message
        );
        // A Pod that is merely new (no verdict yet) or on a node is not unschedulable.
        let new: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "main-1"}, "spec": {"containers": []}
        }))
        .expect("pod");
        assert_eq!(unschedulable(&new), None);
        let mut bound = unplaced("main-1");
        if let Some(spec) = bound.spec.as_mut() {
            spec.node_name = Some("node-0".into());
        }
        assert_eq!(unschedulable(&bound), None);
    }
}
