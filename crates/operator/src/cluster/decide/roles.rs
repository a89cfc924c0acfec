//! Roles: which instance is the primary, as a pure decision over the old status, the Pods
//! and what each instance manager reported on `/pg/status`.
//!
//! The operator only ever writes two names, and in this order:
//! 1. `targetPrimary` — the instance that should be the primary. While it differs from
//!    `currentPrimary` a failover or switchover is in progress: no Pod carries the primary
//!    role label (the `-rw` Service has no endpoint, so the old primary is fenced from
//!    clients), the old primary's manager steps down (or is already dead), and the target's
//!    manager promotes once it holds the primary Lease.
//! 2. `currentPrimary` — set to the target once the target itself reports that it runs as
//!    a primary. The role labels then move and the other instances follow it.
//!
//! Everything is read back from the status, so an operator restarted in the middle of a
//! failover carries on where the last one stopped.
//!
//! A switchover whose target is gone, or that has not completed within
//! `spec.switchoverTimeout` (counted from `status.targetPrimarySince`), is given up: the old
//! primary stays when it still runs as the primary (it holds the Lease, so the target
//! cannot have promoted); when it has already stepped down, the switchover turns into a
//! failover, which chooses again if the target is gone.
//!
//! Why this file stays whole: it is one idea, `decide`, the choice of the primary, and the
//! checks it makes of candidates, fenced instances and switchover targets; about 470 of its
//! lines are the unit tests of that decision.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use pgop_api::cluster::{ClusterPhase, DataDurability};
use pgop_api::conditions::{self, find_condition};
use pgop_api::instance_status::{PgRole, PgStatus, parse_lsn};
use pgop_api::v1beta1::PostgresCluster;
use std::collections::BTreeMap;

use crate::cluster::pods::{REASON_FENCED, REASON_UNFENCING, pod_ready};
use crate::cluster::world::Probe;

/// An Event to publish once the status is written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    pub warning: bool,
    pub reason: &'static str,
    pub message: String,
    /// The instance the Event is about besides the cluster (its `related` object): Events
    /// of the same reason about different instances stay apart.
    pub instance: Option<String>,
}

/// Whether the current primary is available, for the PrimaryAvailable condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Availability {
    pub available: bool,
    pub reason: &'static str,
    pub message: String,
}

/// The decision of one reconcile.
#[derive(Clone, Debug, PartialEq)]
pub struct Roles {
    pub current: String,
    pub target: String,
    /// FailingOver or SwitchingOver while `target != current`.
    pub phase: Option<ClusterPhase>,
    pub primary: Availability,
    pub notes: Vec<Note>,
    /// The switchover annotation was read (acted on or refused): remove it.
    pub clear_switchover_request: bool,
}

impl Roles {
    pub fn in_transition(&self) -> bool {
        self.current != self.target
    }

    /// Starts a switchover another step decided (a drain, a rolling update that must move
    /// the primary): the new target, phase SwitchingOver, and the Event's note.
    pub fn start_switchover(&mut self, switchover: Switchover) {
        self.target = switchover.to;
        self.phase = Some(ClusterPhase::SwitchingOver);
        self.notes.push(switchover.note);
    }
}

/// A switchover decided outside [`decide`] (by the rollout), to be started with
/// [`Roles::start_switchover`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Switchover {
    /// The standby that becomes the primary.
    pub to: String,
    /// Its `SwitchoverStarted` Event, about `to`.
    pub note: Note,
}

/// What the decision reads.
pub struct Input<'a> {
    pub cluster: &'a PostgresCluster,
    /// The instances the cluster should have, by name, in serial order.
    pub instances: &'a [(String, i32)],
    /// The primary for a cluster that has none yet (the first planned instance).
    pub initial_primary: &'a str,
    pub pods: &'a [Pod],
    pub probes: &'a BTreeMap<String, Probe>,
    /// `metadata.annotations[switchover-to]`, if set.
    pub switchover_to: Option<&'a str>,
    pub now: Time,
}

pub fn decide(input: &Input) -> Roles {
    let old = input.cluster.status.clone().unwrap_or_default();
    let ever_served = matches!(
        old.phase,
        Some(
            ClusterPhase::Ready
                | ClusterPhase::Degraded
                | ClusterPhase::FailingOver
                | ClusterPhase::SwitchingOver
        )
    );
    let planned = |name: &String| input.instances.iter().any(|(n, _)| n == name);
    // A cluster that never served may name a primary that was never created (an operator
    // stopped between writing the status and creating the pod): start over with the plan.
    let current = old
        .current_primary
        .clone()
        .filter(|c| ever_served || planned(c))
        .unwrap_or_else(|| input.initial_primary.to_string());
    let target = old
        .target_primary
        .clone()
        .filter(|t| ever_served || planned(t))
        .unwrap_or_else(|| current.clone());
    let mut roles = Roles {
        primary: availability(input, &current),
        current,
        target,
        phase: None,
        notes: Vec::new(),
        clear_switchover_request: input.switchover_to.is_some(),
    };

    // 1. A change of primary in progress: done once the target reports it is primary.
    if roles.in_transition() {
        let kind = match old.phase {
            Some(ClusterPhase::SwitchingOver) => ClusterPhase::SwitchingOver,
            _ => ClusterPhase::FailingOver,
        };
        let promoted = status_of(input, &roles.target).is_some_and(|s| s.role.leads());
        if promoted {
            let (reason, what) = match kind {
                ClusterPhase::SwitchingOver => ("SwitchoverCompleted", "switchover"),
                _ => ("FailoverCompleted", "failover"),
            };
            roles.notes.push(Note {
                warning: false,
                reason,
                message: format!(
                    "{what} complete: {} is the primary (was {})",
                    roles.target, roles.current
                ),
                instance: Some(roles.target.clone()),
            });
            roles.current = roles.target.clone();
            roles.primary = availability(input, &roles.current);
        } else {
            roles.phase = Some(kind);
            // A failover target whose Pod is gone never promotes, nor does one whose manager
            // has not answered for switchoverTimeout: choose again among the others (it may
            // hold the Lease; the next target then waits for it to be released or expire).
            // A target fenced on request (spec.fencedInstances) never promotes either.
            let target_fenced = fenced(input, &roles.target);
            let target_gone = target_fenced
                || pod_of(input, &roles.target)
                    .is_none_or(|p| p.metadata.deletion_timestamp.is_some());
            let timed_out = waited_for_target(input, &old) > switchover_timeout(input);
            let silent = timed_out
                && matches!(
                    input.probes.get(&roles.target),
                    None | Some(Probe::Unreachable(_))
                );
            let kind = if kind == ClusterPhase::SwitchingOver {
                give_up_switchover(input, &mut roles, target_gone, timed_out)
            } else {
                kind
            };
            if roles.in_transition() && kind == ClusterPhase::FailingOver && (target_gone || silent)
            {
                let what = if target_fenced {
                    "is fenced (spec.fencedInstances)"
                } else if target_gone {
                    "is gone"
                } else {
                    "has not answered within switchoverTimeout"
                };
                let exclude = [roles.current.as_str(), roles.target.as_str()];
                match candidate(input, &exclude) {
                    Ok((name, why)) => {
                        roles.notes.push(Note {
                            warning: true,
                            reason: "FailoverStarted",
                            message: format!(
                                "failover target {} {what}; promoting {name} instead ({why})",
                                roles.target
                            ),
                            instance: Some(name.clone()),
                        });
                        roles.target = name;
                    }
                    Err(why) => {
                        let message = format!(
                            "failover target {} {what} and no other standby may replace the primary: {why}",
                            roles.target
                        );
                        let instance = Some(roles.target.clone());
                        blocked(&mut roles, &old, message, instance);
                    }
                }
            }
        }
        if input.switchover_to.is_some() {
            roles.notes.push(refused(
                input,
                "a change of primary is already in progress".to_string(),
            ));
        }
        return roles;
    }

    // A primary fenced on request (spec.fencedInstances) is down on purpose: no failover,
    // and no switchover (its standbys no longer stream); unfencing it brings it back.
    if !roles.primary.available && fenced(input, &roles.current) {
        roles.primary = Availability {
            available: false,
            reason: REASON_FENCED,
            message: format!(
                "spec.fencedInstances names the primary {}: PostgreSQL stays stopped and no \
                 standby takes over until it is unfenced",
                roles.current
            ),
        };
        if input.switchover_to.is_some() {
            roles.notes.push(refused(
                input,
                format!(
                    "the primary {} is fenced (spec.fencedInstances)",
                    roles.current
                ),
            ));
        }
        return roles;
    }

    // A primary unfenced a moment ago starts again on purpose: like a restart in place
    // (below), it gets switchoverTimeout from the end of the fence (when PrimaryAvailable
    // left reason Fenced, see status.rs) before a failover, unless its manager says
    // PostgreSQL failed to start.
    let old_reason = find_condition(&old.conditions, conditions::PRIMARY_AVAILABLE)
        .filter(|c| c.status == conditions::FALSE)
        .map(|c| c.reason.as_str());
    let unfencing = !roles.primary.available
        && matches!(old_reason, Some(REASON_FENCED | REASON_UNFENCING))
        && matches!(input.probes.get(&roles.current), Some(Probe::Status(s)) if s.last_error.is_none());
    if unfencing {
        roles.primary = Availability {
            available: false,
            reason: REASON_UNFENCING,
            message: format!(
                "{} is no longer fenced and starts PostgreSQL again",
                roles.current
            ),
        };
    }

    // 2. The primary failed: fail over once it has been unavailable for failoverDelay.
    if !roles.primary.available && ever_served {
        // Unfenced in this pass: the clock starts now (status.rs moves lastTransitionTime).
        let since = find_condition(&old.conditions, conditions::PRIMARY_AVAILABLE)
            .filter(|c| c.status == conditions::FALSE && c.reason != REASON_FENCED)
            .map(|c| c.last_transition_time.0)
            .unwrap_or(input.now.0);
        let waited = input.now.0.duration_since(since).as_secs_f64();
        let mut delay = f64::from(input.cluster.spec.ha.failover_delay.max(0));
        // A primary restarted in place on purpose (`restartInstance`, see rollout.rs), whose
        // manager answers, gets switchoverTimeout to come back before a failover; unless its
        // manager says PostgreSQL failed to start (`lastError`): then a standby takes over
        // after failoverDelay, as after a crash.
        let restarting = old.restart_instance.as_deref() == Some(roles.current.as_str())
            && matches!(input.probes.get(&roles.current), Some(Probe::Status(s)) if s.last_error.is_none());
        if restarting || unfencing {
            delay = delay.max(switchover_timeout(input));
        }
        if waited < delay {
            return roles;
        }
        match candidate(input, &[roles.current.as_str()]) {
            Ok((name, why)) => {
                roles.notes.push(Note {
                    warning: true,
                    reason: "FailoverStarted",
                    message: format!(
                        "primary {} is unavailable ({}); promoting {name} ({why})",
                        roles.current, roles.primary.message
                    ),
                    instance: Some(name.clone()),
                });
                roles.target = name;
                roles.phase = Some(ClusterPhase::FailingOver);
            }
            Err(why) => {
                let message = format!(
                    "primary {} is unavailable ({}) and no standby may replace it: {why}",
                    roles.current, roles.primary.message
                );
                let instance = Some(roles.current.clone());
                blocked(&mut roles, &old, message, instance);
            }
        }
        if input.switchover_to.is_some() {
            roles
                .notes
                .push(refused(input, "the primary is unavailable".to_string()));
        }
        return roles;
    }

    // 3. A switchover on request.
    if let Some(to) = input.switchover_to {
        match switchover_target(input, &roles.current, to) {
            Ok(()) => {
                roles.notes.push(Note {
                    warning: false,
                    reason: "SwitchoverStarted",
                    message: format!("switching the primary from {} to {to}", roles.current),
                    instance: Some(to.to_string()),
                });
                roles.target = to.to_string();
                roles.phase = Some(ClusterPhase::SwitchingOver);
            }
            Err(why) => roles.notes.push(refused(input, why)),
        }
    }
    roles
}

/// A switchover that cannot finish (its target is gone, or `switchoverTimeout` has passed
/// since `targetPrimarySince`) is given up: back to the old primary while it still runs as
/// the primary, else on as a failover. Returns the kind of change still in progress.
fn give_up_switchover(
    input: &Input,
    roles: &mut Roles,
    target_gone: bool,
    timed_out: bool,
) -> ClusterPhase {
    let why = if target_gone {
        format!("its target {} is gone", roles.target)
    } else if timed_out {
        format!(
            "{} has not become the primary within switchoverTimeout ({}s)",
            roles.target,
            switchover_timeout(input)
        )
    } else {
        return ClusterPhase::SwitchingOver;
    };
    let old_primary_runs = status_of(input, &roles.current).is_some_and(|s| s.role.leads());
    if old_primary_runs {
        roles.notes.push(Note {
            warning: true,
            reason: "SwitchoverFailed",
            message: format!(
                "switchover from {} to {} given up: {why}; {} stays the primary",
                roles.current, roles.target, roles.current
            ),
            instance: Some(roles.target.clone()),
        });
        roles.target = roles.current.clone();
        roles.phase = None;
        roles.primary = availability(input, &roles.current);
        return ClusterPhase::SwitchingOver;
    }
    roles.notes.push(Note {
        warning: true,
        reason: "SwitchoverFailed",
        message: format!(
            "switchover from {} to {} given up: {why}; {} has stepped down, so this is now a failover",
            roles.current, roles.target, roles.current
        ),
        instance: Some(roles.target.clone()),
    });
    roles.phase = Some(ClusterPhase::FailingOver);
    ClusterPhase::FailingOver
}

/// `spec.switchoverTimeout` in seconds.
fn switchover_timeout(input: &Input) -> f64 {
    f64::from(input.cluster.spec.ha.switchover_timeout.max(1))
}

/// Seconds since `targetPrimary` last changed (0 when not recorded).
fn waited_for_target(input: &Input, old: &pgop_api::PostgresClusterStatus) -> f64 {
    old.target_primary_since.as_ref().map_or(0.0, |since| {
        input.now.0.duration_since(since.0).as_secs_f64()
    })
}

/// A failover that cannot happen: the reason goes into the PrimaryAvailable condition, and
/// an Event is published only when that reason is new (not on every poll).
fn blocked(
    roles: &mut Roles,
    old: &pgop_api::PostgresClusterStatus,
    message: String,
    instance: Option<String>,
) {
    let known = find_condition(&old.conditions, conditions::PRIMARY_AVAILABLE)
        .is_some_and(|c| c.message == message);
    roles.primary.message = message.clone();
    if !known {
        roles.notes.push(Note {
            warning: true,
            reason: "FailoverBlocked",
            message,
            instance,
        });
    }
}

fn refused(input: &Input, why: String) -> Note {
    Note {
        warning: true,
        reason: "SwitchoverRefused",
        message: format!(
            "switchover to {} refused: {why}",
            input.switchover_to.unwrap_or_default()
        ),
        instance: input.switchover_to.map(str::to_string),
    }
}

fn pod_of<'a>(input: &'a Input, name: &str) -> Option<&'a Pod> {
    input.pods.iter().find(|p| p.name_any() == name)
}

fn status_of<'a>(input: &'a Input, name: &str) -> Option<&'a PgStatus> {
    input.probes.get(name).and_then(Probe::status)
}

fn availability(input: &Input, primary: &str) -> Availability {
    let down = |reason, message: String| Availability {
        available: false,
        reason,
        message,
    };
    let Some(pod) = pod_of(input, primary) else {
        return down("PodMissing", format!("pod {primary} does not exist"));
    };
    if pod.metadata.deletion_timestamp.is_some() {
        return down("PodDeleting", format!("pod {primary} is being deleted"));
    }
    match input.probes.get(primary) {
        None => down("NotProbed", format!("{primary} was not probed")),
        Some(Probe::Unreachable(e)) => down("Unreachable", format!("{primary}: {e}")),
        Some(Probe::Status(s)) if s.role == PgRole::Primary => Availability {
            available: true,
            reason: "PrimaryRunning",
            message: format!("{primary} runs as the primary"),
        },
        Some(Probe::Status(s)) if s.role == PgRole::DesignatedPrimary => Availability {
            available: true,
            reason: "PrimaryRunning",
            message: format!("{primary} runs as the designated primary of the replica cluster"),
        },
        Some(Probe::Status(s)) if s.fenced => down(REASON_FENCED, format!("{primary} is fenced")),
        Some(Probe::Status(s)) => down(
            "NotRunning",
            format!(
                "{primary} reports role {}",
                serde_json::to_value(s.role)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default()
            ),
        ),
    }
}

/// A standby that can be promoted: its Pod exists and is not being deleted, and its
/// manager reports it running as a standby.
fn promotable<'a>(input: &'a Input, name: &str) -> Option<&'a PgStatus> {
    let pod = pod_of(input, name)?;
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    if fenced(input, name) {
        return None;
    }
    status_of(input, name).filter(|s| s.role == PgRole::Replica && !s.fenced)
}

/// The standby to promote: the most WAL received, then the most replayed, then the lowest
/// serial. With `dataDurability: required` only when enough standbys answer that one of
/// them must hold every acknowledged commit.
/// `exclude` starts with the primary; the rest are standbys not to choose.
fn candidate(input: &Input, exclude: &[&str]) -> Result<(String, String), String> {
    let primary = exclude.first().copied().unwrap_or_default();
    let standbys: Vec<&(String, i32)> = input
        .instances
        .iter()
        .filter(|(n, _)| n != primary)
        .collect();
    if standbys.is_empty() {
        return Err("the cluster has no standby".to_string());
    }
    let mut ranked: Vec<(u64, u64, i32, &str, &PgStatus)> = standbys
        .iter()
        .filter(|(name, _)| !exclude.contains(&name.as_str()))
        .filter_map(|(name, serial)| {
            let s = promotable(input, name)?;
            let received = s.wal_position().unwrap_or(0);
            let replayed = s.replayed_lsn.as_deref().and_then(parse_lsn).unwrap_or(0);
            Some((received, replayed, *serial, name.as_str(), s))
        })
        .collect();
    ranked.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
    let Some((_, _, _, best, status)) = ranked.first() else {
        return Err(format!(
            "none of the {} standbys answers as a running standby",
            standbys.len()
        ));
    };
    let synchronous = &input.cluster.spec.ha.synchronous;
    if synchronous.standbys > 0 && synchronous.data_durability == DataDurability::Required {
        // Each commit was confirmed by `synchronous` of the standbys ("ANY k (all)"), so
        // any n - k + 1 of them include one that has it; the one with the most WAL among
        // those has every acknowledged commit.
        let n = standbys.len();
        let k = usize::try_from(synchronous.standbys).unwrap_or(n).min(n);
        let needed = n - k + 1;
        if ranked.len() < needed {
            return Err(format!(
                "dataDurability is required and only {} of {n} standbys answer; {needed} must, so that one of them is sure to hold every acknowledged commit",
                ranked.len()
            ));
        }
    }
    Ok((
        best.to_string(),
        format!(
            "received WAL up to {}",
            status
                .received_lsn
                .as_deref()
                .unwrap_or("an unknown position")
        ),
    ))
}

/// Whether `spec.fencedInstances` names `instance`.
fn fenced(input: &Input, instance: &str) -> bool {
    input
        .cluster
        .spec
        .fenced_instances
        .iter()
        .any(|f| f == instance)
}

fn switchover_target(input: &Input, primary: &str, to: &str) -> Result<(), String> {
    if to == primary {
        return Err(format!("{to} is already the primary"));
    }
    if fenced(input, to) {
        return Err(format!("{to} is fenced (spec.fencedInstances)"));
    }
    if !input.instances.iter().any(|(n, _)| n == to) {
        let names: Vec<&str> = input.instances.iter().map(|(n, _)| n.as_str()).collect();
        return Err(format!(
            "{to} is not an instance of this cluster (instances: {})",
            names.join(", ")
        ));
    }
    if !pod_of(input, to).is_some_and(pod_ready) {
        return Err(format!("{to} is not ready"));
    }
    match promotable(input, to) {
        Some(s) if s.streaming => Ok(()),
        Some(_) => Err(format!("{to} does not stream from the primary")),
        None => Err(format!("{to} does not answer as a running standby")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn cluster(spec: &str, status: &str) -> PostgresCluster {
        let mut c: PostgresCluster = serde_yaml::from_str(&format!(
            "apiVersion: database.example.com/v1beta1\nkind: PostgresCluster\nmetadata: {{name: db, namespace: ns}}\nspec: {spec}\n"
        ))
        .expect("cluster fixture");
        c.status = Some(serde_yaml::from_str(status).expect("status fixture"));
        c
    }

    fn pod(name: &str, ready: bool, deleting: bool) -> Pod {
        let mut v = serde_json::json!({
            "metadata": {"name": name},
            "status": {"conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}
        });
        if deleting {
            v["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z".into();
        }
        serde_json::from_value(v).expect("pod")
    }

    fn pg(name: &str, role: PgRole, received: &str) -> Probe {
        let mut s = PgStatus::stopped(name, false);
        s.role = role;
        s.running = role != PgRole::Stopped;
        s.streaming = role == PgRole::Replica;
        match role {
            PgRole::Primary => s.current_lsn = Some(received.into()),
            _ => {
                s.received_lsn = Some(received.into());
                s.replayed_lsn = Some(received.into());
            }
        }
        Probe::Status(Box::new(s))
    }

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).expect("time"))
    }

    const READY3: &str = "{phase: Ready, currentPrimary: db-1, targetPrimary: db-1, instances: []}";

    struct World {
        cluster: PostgresCluster,
        instances: Vec<(String, i32)>,
        pods: Vec<Pod>,
        probes: BTreeMap<String, Probe>,
    }

    impl World {
        fn new(spec: &str, status: &str) -> Self {
            let names = ["db-1", "db-2", "db-3"];
            Self {
                cluster: cluster(spec, status),
                instances: names
                    .iter()
                    .enumerate()
                    .map(|(i, n)| (n.to_string(), i as i32 + 1))
                    .collect(),
                pods: names.iter().map(|n| pod(n, true, false)).collect(),
                probes: BTreeMap::from([
                    ("db-1".to_string(), pg("db-1", PgRole::Primary, "0/5000000")),
                    ("db-2".to_string(), pg("db-2", PgRole::Replica, "0/4000000")),
                    ("db-3".to_string(), pg("db-3", PgRole::Replica, "0/5000000")),
                ]),
            }
        }

        fn decide(&self, switchover_to: Option<&str>, now: i64) -> Roles {
            decide(&Input {
                cluster: &self.cluster,
                instances: &self.instances,
                initial_primary: "db-1",
                pods: &self.pods,
                probes: &self.probes,
                switchover_to,
                now: at(now),
            })
        }
    }

    const SPEC: &str = "{instances: 3, storage: {size: 1Gi}}";

    #[test]
    fn a_healthy_primary_stays() {
        let w = World::new(SPEC, READY3);
        let r = w.decide(None, 100);
        assert_eq!((r.current.as_str(), r.target.as_str()), ("db-1", "db-1"));
        assert!(r.primary.available);
        assert!(r.notes.is_empty());
        assert_eq!(r.phase, None);
    }

    #[test]
    fn an_unreachable_primary_fails_over_to_the_standby_with_the_most_wal() {
        let mut w = World::new(SPEC, READY3);
        w.probes
            .insert("db-1".into(), Probe::Unreachable("refused".into()));
        let r = w.decide(None, 100);
        assert_eq!(
            r.current, "db-1",
            "current moves only once the target reports"
        );
        assert_eq!(r.target, "db-3");
        assert_eq!(r.phase, Some(ClusterPhase::FailingOver));
        assert_eq!(r.notes[0].reason, "FailoverStarted");
        assert!(!r.primary.available);
    }

    #[test]
    fn ties_go_to_the_lowest_serial_and_a_deleted_pod_counts_as_failed() {
        let mut w = World::new(SPEC, READY3);
        w.probes
            .insert("db-3".into(), pg("db-3", PgRole::Replica, "0/4000000"));
        w.pods[0] = pod("db-1", true, true);
        let r = w.decide(None, 100);
        assert_eq!(r.primary.reason, "PodDeleting");
        assert_eq!(r.target, "db-2");
    }

    #[test]
    fn failover_waits_for_the_failover_delay() {
        let mut w = World::new(
            "{instances: 3, storage: {size: 1Gi}, ha: {failoverDelay: 30}}",
            "{phase: Ready, currentPrimary: db-1, targetPrimary: db-1, conditions: [{type: PrimaryAvailable, status: 'False', reason: Unreachable, message: x, lastTransitionTime: '1970-01-01T00:01:40Z'}]}",
        );
        w.probes
            .insert("db-1".into(), Probe::Unreachable("refused".into()));
        assert_eq!(w.decide(None, 110).target, "db-1");
        assert_eq!(w.decide(None, 131).target, "db-3");
    }

    #[test]
    fn a_fenced_primary_is_not_failed_over_and_a_fenced_standby_is_never_chosen() {
        let fenced = |names: &str| {
            format!("{{instances: 3, storage: {{size: 1Gi}}, fencedInstances: [{names}]}}")
        };
        // The primary fenced on request: down on purpose, no failover however long.
        let mut stopped = PgStatus::stopped("db-1", true);
        stopped.fenced = true;
        let mut w = World::new(&fenced("db-1"), READY3);
        w.probes
            .insert("db-1".into(), Probe::Status(Box::new(stopped)));
        let r = w.decide(None, 10_000);
        assert_eq!((r.current.as_str(), r.target.as_str()), ("db-1", "db-1"));
        assert_eq!(r.primary.reason, "Fenced");
        assert_eq!(r.phase, None);
        // Nor a switchover away from it (its standbys no longer stream).
        let r = w.decide(Some("db-3"), 10_000);
        assert_eq!(r.target, "db-1");
        assert_eq!(r.notes[0].reason, "SwitchoverRefused");
        assert!(r.notes[0].message.contains("fenced"), "{:?}", r.notes);
        // A standby fenced (still running, its manager not there yet): never the target.
        let mut w = World::new(&fenced("db-3"), READY3);
        w.probes
            .insert("db-1".into(), Probe::Unreachable("refused".into()));
        assert_eq!(w.decide(None, 100).target, "db-2");
        let r = World::new(&fenced("db-3"), READY3).decide(Some("db-3"), 100);
        assert_eq!(r.target, "db-1");
        assert!(r.notes[0].message.contains("fenced"), "{:?}", r.notes);
        // A failover whose target is fenced meanwhile chooses again.
        let mut w = World::new(
            &fenced("db-3"),
            "{phase: FailingOver, currentPrimary: db-1, targetPrimary: db-3}",
        );
        w.probes
            .insert("db-1".into(), Probe::Unreachable("refused".into()));
        let r = w.decide(None, 100);
        assert_eq!(r.target, "db-2");
        assert!(r.notes[0].message.contains("is fenced"), "{:?}", r.notes);
    }

    #[test]
    fn an_unfenced_primary_gets_switchover_timeout_to_start_again() {
        // Fenced until a moment ago (PrimaryAvailable False, reason Fenced, since long
        // ago); its manager answers, PostgreSQL not started yet.
        let spec =
            "{instances: 3, storage: {size: 1Gi}, ha: {failoverDelay: 1, switchoverTimeout: 30}}";
        let status = |reason: &str, since: &str| {
            format!(
                "{{phase: Degraded, currentPrimary: db-1, targetPrimary: db-1, conditions: [{{type: PrimaryAvailable, status: 'False', reason: {reason}, message: x, lastTransitionTime: '{since}'}}]}}"
            )
        };
        let mut w = World::new(spec, &status("Fenced", "1970-01-01T00:00:10Z"));
        w.probes
            .insert("db-1".into(), pg("db-1", PgRole::Stopped, "0/5000000"));
        let r = w.decide(None, 1_000);
        assert_eq!(r.target, "db-1");
        assert_eq!(r.primary.reason, "Unfencing");
        // The next passes count from the end of the fence (lastTransitionTime moved).
        let mut w = World::new(spec, &status("Unfencing", "1970-01-01T00:16:40Z"));
        w.probes
            .insert("db-1".into(), pg("db-1", PgRole::Stopped, "0/5000000"));
        assert_eq!(w.decide(None, 1_020).target, "db-1");
        assert_eq!(w.decide(None, 1_031).target, "db-3");
        // A start that failed: failoverDelay as after a crash.
        let mut failed = PgStatus::stopped("db-1", false);
        failed.last_error = Some("could not start".into());
        w.probes
            .insert("db-1".into(), Probe::Status(Box::new(failed)));
        assert_eq!(w.decide(None, 1_002).target, "db-3");
    }

    #[test]
    fn a_cluster_resuming_from_hibernation_does_not_fail_over() {
        let mut w = World::new(
            SPEC,
            "{phase: Resuming, currentPrimary: db-1, targetPrimary: db-1}",
        );
        w.probes
            .insert("db-1".into(), Probe::Unreachable("refused".into()));
        let r = w.decide(None, 10_000);
        assert_eq!((r.current.as_str(), r.target.as_str()), ("db-1", "db-1"));
        assert_eq!(r.phase, None);
    }

    #[test]
    fn a_cluster_that_never_served_does_not_fail_over() {
        let mut w = World::new(
            SPEC,
            "{phase: Creating, currentPrimary: db-1, targetPrimary: db-1}",
        );
        w.probes
            .insert("db-1".into(), pg("db-1", PgRole::Stopped, "0/0"));
        let r = w.decide(None, 100);
        assert_eq!(r.target, "db-1");
        assert!(!r.primary.available);
    }

    #[test]
    fn a_primary_that_was_never_created_is_replanned_before_the_cluster_served() {
        let w = World::new(
            SPEC,
            "{phase: Creating, currentPrimary: db-7, targetPrimary: db-7}",
        );
        let r = w.decide(None, 100);
        assert_eq!((r.current.as_str(), r.target.as_str()), ("db-1", "db-1"));
        // Once it served, a missing primary is a failover, never a silent rename.
        let mut w = World::new(
            SPEC,
            "{phase: Ready, currentPrimary: db-7, targetPrimary: db-7}",
        );
        w.probes
            .insert("db-7".into(), Probe::Unreachable("gone".into()));
        let r = w.decide(None, 100);
        assert_eq!((r.current.as_str(), r.target.as_str()), ("db-7", "db-3"));
    }

    #[test]
    fn required_durability_needs_enough_standbys_to_be_sure_of_every_commit() {
        let spec = "{instances: 3, storage: {size: 1Gi}, ha: {synchronous: {standbys: 1, dataDurability: required}}}";
        let mut w = World::new(spec, READY3);
        w.probes
            .insert("db-1".into(), Probe::Unreachable("refused".into()));
        assert_eq!(w.decide(None, 100).target, "db-3", "both standbys answer");
        w.probes
            .insert("db-3".into(), Probe::Unreachable("refused".into()));
        let r = w.decide(None, 100);
        assert_eq!(
            r.target, "db-1",
            "db-2 alone may miss commits db-3 confirmed"
        );
        assert_eq!(r.notes[0].reason, "FailoverBlocked");
        assert!(r.notes[0].message.contains("only 1 of 2 standbys"));
        // Told once: the reason is kept in PrimaryAvailable, and the next pass is quiet.
        let mut status = w.cluster.status.clone().expect("status");
        status.conditions.push(pgop_api::conditions::new_condition(
            conditions::PRIMARY_AVAILABLE,
            false,
            r.primary.reason,
            r.primary.message.clone(),
            None,
            at(100),
        ));
        w.cluster.status = Some(status);
        let again = w.decide(None, 101);
        assert_eq!(again.primary.message, r.primary.message);
        assert!(again.notes.is_empty(), "{:?}", again.notes);
        // Preferred durability promotes the best standby that answers.
        let mut w = World::new(SPEC, READY3);
        w.probes
            .insert("db-1".into(), Probe::Unreachable("refused".into()));
        w.probes
            .insert("db-3".into(), Probe::Unreachable("refused".into()));
        assert_eq!(w.decide(None, 100).target, "db-2");
    }

    #[test]
    fn a_failover_in_progress_completes_only_when_the_target_reports_primary() {
        let status = "{phase: FailingOver, currentPrimary: db-1, targetPrimary: db-3}";
        let mut w = World::new(SPEC, status);
        w.probes
            .insert("db-1".into(), Probe::Unreachable("refused".into()));
        let r = w.decide(None, 100);
        assert_eq!((r.current.as_str(), r.target.as_str()), ("db-1", "db-3"));
        assert_eq!(r.phase, Some(ClusterPhase::FailingOver));
        w.probes
            .insert("db-3".into(), pg("db-3", PgRole::Primary, "0/6000000"));
        let r = w.decide(None, 101);
        assert_eq!((r.current.as_str(), r.target.as_str()), ("db-3", "db-3"));
        assert_eq!(r.phase, None);
        assert_eq!(r.notes[0].reason, "FailoverCompleted");
        assert!(r.primary.available);
    }

    #[test]
    fn a_failover_target_whose_pod_is_gone_is_replaced() {
        let status = "{phase: FailingOver, currentPrimary: db-1, targetPrimary: db-3}";
        let mut w = World::new(SPEC, status);
        w.probes
            .insert("db-1".into(), Probe::Unreachable("refused".into()));
        w.pods.retain(|p| p.name_any() != "db-3");
        w.probes.remove("db-3");
        let r = w.decide(None, 100);
        assert_eq!((r.current.as_str(), r.target.as_str()), ("db-1", "db-2"));
        assert_eq!(r.phase, Some(ClusterPhase::FailingOver));
        assert!(r.notes[0].message.contains("db-3 is gone"));
    }

    #[test]
    fn switchover_on_request_and_refusals_name_the_reason() {
        let w = World::new(SPEC, READY3);
        let r = w.decide(Some("db-2"), 100);
        assert_eq!(r.target, "db-2");
        assert_eq!(r.phase, Some(ClusterPhase::SwitchingOver));
        assert!(r.clear_switchover_request);
        for (to, why) in [
            ("db-1", "already the primary"),
            ("db-9", "not an instance of this cluster"),
        ] {
            let r = w.decide(Some(to), 100);
            assert_eq!(r.target, "db-1");
            assert_eq!(r.notes[0].reason, "SwitchoverRefused");
            assert!(r.notes[0].message.contains(why), "{}", r.notes[0].message);
            assert!(r.clear_switchover_request);
        }
        let mut w = World::new(SPEC, READY3);
        w.pods[1] = pod("db-2", false, false);
        assert!(
            w.decide(Some("db-2"), 100).notes[0]
                .message
                .contains("not ready")
        );
        // Completed by the same rule as a failover, with its own event.
        let w = World::new(
            SPEC,
            "{phase: SwitchingOver, currentPrimary: db-1, targetPrimary: db-2}",
        );
        let r = w.decide(None, 100);
        assert_eq!(r.phase, Some(ClusterPhase::SwitchingOver));
        let mut w = w;
        w.probes
            .insert("db-2".into(), pg("db-2", PgRole::Primary, "0/6000000"));
        let r = w.decide(None, 100);
        assert_eq!(r.current, "db-2");
        assert_eq!(r.notes[0].reason, "SwitchoverCompleted");
    }

    #[test]
    fn a_primary_restarted_in_place_on_purpose_gets_switchover_timeout_before_a_failover() {
        let spec = "{instances: 3, storage: {size: 1Gi}, ha: {switchoverTimeout: 30}}";
        let status = |restart: &str| {
            format!(
                "{{phase: Ready, currentPrimary: db-1, targetPrimary: db-1, restartInstance: {restart}, conditions: [{{type: PrimaryAvailable, status: 'False', reason: PrimaryNotRunning, message: '', lastTransitionTime: '1970-01-01T00:01:40Z'}}]}}"
            )
        };
        let mut w = World::new(spec, &status("db-1"));
        w.probes
            .insert("db-1".into(), pg("db-1", PgRole::Stopped, "0/5000000"));
        let r = w.decide(None, 120);
        assert_eq!((r.target.as_str(), r.phase), ("db-1", None), "restarting");
        let r = w.decide(None, 131);
        assert_eq!(r.phase, Some(ClusterPhase::FailingOver), "past the timeout");
        // Its manager silent: no reason to wait.
        w.probes
            .insert("db-1".into(), Probe::Unreachable("refused".into()));
        assert_eq!(w.decide(None, 101).phase, Some(ClusterPhase::FailingOver));
        // Another instance restarting: the primary's failure is a failure.
        let mut w = World::new(spec, &status("db-2"));
        w.probes
            .insert("db-1".into(), pg("db-1", PgRole::Stopped, "0/5000000"));
        assert_eq!(w.decide(None, 101).phase, Some(ClusterPhase::FailingOver));
    }

    #[test]
    fn a_switchover_past_its_timeout_or_without_its_target_is_given_up() {
        const SWITCHING: &str = "{phase: SwitchingOver, currentPrimary: db-1, targetPrimary: db-2, targetPrimarySince: '1970-01-01T00:01:40Z'}";
        let spec = "{instances: 3, storage: {size: 1Gi}, ha: {switchoverTimeout: 30}}";
        // Within the timeout: still switching over.
        let w = World::new(spec, SWITCHING);
        let r = w.decide(None, 129);
        assert_eq!(
            (r.target.as_str(), r.phase),
            ("db-2", Some(ClusterPhase::SwitchingOver))
        );
        assert!(r.notes.is_empty());
        // Past it, with the old primary still running as the primary: it stays.
        let r = w.decide(None, 131);
        assert_eq!((r.current.as_str(), r.target.as_str()), ("db-1", "db-1"));
        assert_eq!(r.phase, None);
        assert_eq!(r.notes[0].reason, "SwitchoverFailed");
        assert!(
            r.notes[0].message.contains("switchoverTimeout"),
            "{}",
            r.notes[0].message
        );
        assert!(r.notes[0].message.contains("db-1 stays the primary"));
        // Past it, the old primary already stepped down: a failover to the same target.
        let mut w = World::new(spec, SWITCHING);
        w.probes
            .insert("db-1".into(), pg("db-1", PgRole::Stopped, "0/5000000"));
        let r = w.decide(None, 131);
        assert_eq!(
            (r.target.as_str(), r.phase),
            ("db-2", Some(ClusterPhase::FailingOver))
        );
        assert!(
            r.notes[0].message.contains("now a failover"),
            "{}",
            r.notes[0].message
        );
        // The target's Pod gone, the old primary stopped: at once, to another standby.
        w.pods[1] = pod("db-2", false, true);
        let r = w.decide(None, 101);
        assert_eq!(
            (r.target.as_str(), r.phase),
            ("db-3", Some(ClusterPhase::FailingOver))
        );
        assert_eq!(
            r.notes.iter().map(|n| n.reason).collect::<Vec<_>>(),
            ["SwitchoverFailed", "FailoverStarted"]
        );
        // The failover's target does not answer either: another standby, once past the
        // timeout (the Lease keeps the two from both promoting).
        let mut silent = World::new(
            spec,
            "{phase: FailingOver, currentPrimary: db-1, targetPrimary: db-2, targetPrimarySince: '1970-01-01T00:01:40Z'}",
        );
        silent
            .probes
            .insert("db-1".into(), pg("db-1", PgRole::Stopped, "0/5000000"));
        silent
            .probes
            .insert("db-2".into(), Probe::Unreachable("timed out".into()));
        assert_eq!(
            silent.decide(None, 120).target,
            "db-2",
            "within the timeout"
        );
        let r = silent.decide(None, 131);
        assert_eq!(r.target, "db-3");
        assert!(
            r.notes[0].message.contains("has not answered"),
            "{}",
            r.notes[0].message
        );
        // The target's Pod gone, the old primary running: it stays, without waiting.
        let mut w = World::new(spec, SWITCHING);
        w.pods[1] = pod("db-2", false, true);
        let r = w.decide(None, 101);
        assert_eq!((r.target.as_str(), r.phase), ("db-1", None));
    }
}
