//! Rollout: changes that need PostgreSQL or its Pod restarted (image, resources, any Pod
//! setting; parameters PostgreSQL applies only at start), one instance at a time, as a
//! pure decision.
//!
//! Order: the standbys one by one (each back, ready and streaming before the next), then a
//! switchover to
//! the standby with the most WAL, then the old primary, now a standby. The primary is thus
//! restarted in place only when it is the sole instance. Nothing moves while a failover or
//! switchover is in progress, while the primary is unavailable, or while any instance is
//! not ready: a rollout never takes a second instance down.
//!
//! - A Pod whose spec changed (its `spec-hash` annotation differs from the built one) is
//!   deleted; the next reconcile creates it anew on the same volume. A Pod that was never
//!   placed on a node (Pending: no node fits its anti-affinity or node selector) runs
//!   nothing, so when it is outdated it is replaced first, without waiting for anything;
//!   and once the scheduler has found no node for it for [`UNPLACED_GRACE`], the other
//!   instances are rolled without waiting for it ([`unplaced`]).
//! - An instance reporting parameters pending a restart is named in
//!   `status.restartInstance`; its manager restarts PostgreSQL, and the name moves on once
//!   it no longer reports the restart pending. Restarts wait until every instance reports
//!   the cluster's current generation applied: managers see a spec change at different
//!   moments, and a primary that reports its restart pending before the standbys do must
//!   not be switched over to a standby that is about to need one too.
//! - Lowering a parameter a hot standby needs at least at its primary's value
//!   (`max_connections`, ...: the primary reports it in `pendingRestartDecreases`) restarts
//!   the primary first, in place: a standby started with the lower value while the primary
//!   still runs with the higher one refuses to start. No Pod is replaced meanwhile (a new
//!   Pod would start with the lower value too).
//! - The instance being restarted stays named in `status.restartInstance` until it is back
//!   (ready and running), so that the failover decision knows the primary is down on
//!   purpose ([`super::roles`] then waits `switchoverTimeout` before failing over).
//! - The restart annotation (`database.example.com/restart`) is a restart like any other:
//!   the operator records when it saw the value (`status.restartRequested`), and every
//!   instance whose postmaster started before then needs a restart, in the same order.
//!   `database.example.com/restart-instance` does the same for the instances it names
//!   (`status.instanceRestarts`), each one alone: a standby restarts in place, a primary
//!   after a switchover.
//! - Health-gated: a step that does not come back blocks the rollout. Nothing else moves
//!   while an instance is not ready; once that has lasted `switchoverTimeout`, or when the
//!   instance refused its restart (its dry run failed), [`blocked`] says so
//!   (`RolloutBlocked`, with PostgreSQL's last error lines). The primary is never restarted
//!   in place while it has standbys, and never switched away from to an unhealthy one.
//!
//! Why this file stays whole: it is one idea, the rollout's next step (`next`) and what it
//! is decided with (`unplaced`, `instance_restarts`, `blocked`); about 640 of its lines are
//! the unit tests of that decision.

use super::roles::Roles;
use crate::cluster::pods::pod_ready;
use crate::cluster::world::Probe;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use pgop_api::constants::ANNOTATION_SPEC_HASH;
use pgop_api::instance_status::{PgRole, PgStatus, parse_lsn};
use std::collections::{BTreeMap, BTreeSet};

/// The next rollout step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing outdated, or not a safe moment.
    Idle,
    /// Delete this instance's Pod: its spec changed.
    Replace { instance: String },
    /// This instance restarts PostgreSQL: parameters pending a restart, or a restart requested.
    Restart { instance: String },
    /// Move the primary to this standby first, so the old primary can be updated.
    Switchover { to: String },
}

pub struct Input<'a> {
    /// The planned instances, by name and serial.
    pub instances: &'a [(String, i32)],
    pub pods: &'a [Pod],
    pub probes: &'a BTreeMap<String, Probe>,
    pub roles: &'a Roles,
    /// The spec hash each instance's Pod is built with now.
    pub desired_hashes: &'a BTreeMap<String, String>,
    /// The cluster's `metadata.generation`.
    pub generation: Option<i64>,
    /// `status.restartInstance` as last written: a restart that may still be under way.
    pub restarting: Option<&'a str>,
    /// When the restart annotation's current value was first seen
    /// (`status.restartRequested`): postmasters started before need a restart.
    pub restart_requested_at: Option<jiff::Timestamp>,
    /// Restarts of single instances on request (`status.instanceRestarts`): the instance
    /// needs a restart if its postmaster started before its time.
    pub instance_restarts: &'a BTreeMap<String, jiff::Timestamp>,
    /// Instances whose Pod the scheduler has found no node for since at least
    /// [`UNPLACED_GRACE`] ([`unplaced`]): they hold nothing back.
    pub unplaced: &'a BTreeSet<String>,
}

/// How long the scheduler must have found no node for an instance's Pod before the rollout
/// stops waiting for that instance. Shorter waits are normal (a volume being provisioned);
/// longer ones mean the Pod may never be placed (`required` anti-affinity with too few
/// nodes), and waiting for it would hold back, say, the very change that lets it be placed:
/// relaxing `required` to `preferred` must replace the other instances' Pods, whose
/// required anti-affinity keeps it out.
pub const UNPLACED_GRACE: std::time::Duration = std::time::Duration::from_secs(30);

/// The instances whose Pod has had no node for [`UNPLACED_GRACE`]: the scheduler declared
/// it Unschedulable at least that long before `now`.
pub fn unplaced(pods: &[Pod], now: jiff::Timestamp) -> BTreeSet<String> {
    let Ok(grace) = jiff::SignedDuration::try_from(UNPLACED_GRACE) else {
        return BTreeSet::new();
    };
    pods.iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            crate::cluster::pods::unschedulable_since(p)
                .is_some_and(|since| now.duration_since(since) >= grace)
        })
        .map(ResourceExt::name_any)
        .collect()
}

/// Longest instance list read from `database.example.com/restart-instance`.
const MAX_RESTART_NAMES: usize = 16;
/// Longest part of a refused name quoted back in an Event.
const MAX_QUOTED_NAME: usize = 80;

/// What `database.example.com/restart-instance` asked for, once read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InstanceRestartRequest {
    /// Instances of the cluster now recorded for a restart.
    pub accepted: Vec<String>,
    /// What was refused, each quoted with the reason.
    pub refused: Vec<String>,
}

/// `status.instanceRestarts` for this pass: the old entries of instances still planned
/// that have not restarted since (their manager reports a later postmaster start, or does
/// not answer), and the instances the annotation names (`annotation`: its value), each
/// recorded at `now` (a second request for an instance moves its time). A name that is not
/// an instance of the cluster is refused, quoted and cut short.
pub fn instance_restarts(
    old: &[pgop_api::cluster::InstanceRestart],
    annotation: Option<&str>,
    instances: &[(String, i32)],
    probes: &BTreeMap<String, Probe>,
    now: jiff::Timestamp,
) -> (
    Vec<pgop_api::cluster::InstanceRestart>,
    Option<InstanceRestartRequest>,
) {
    let planned = |name: &str| instances.iter().any(|(n, _)| n == name);
    let restarted = |entry: &pgop_api::cluster::InstanceRestart| {
        let at = entry.requested_at.parse::<jiff::Timestamp>().ok();
        let started = probes
            .get(&entry.instance)
            .and_then(Probe::status)
            .and_then(|s| s.postmaster_start_time.as_deref())
            .and_then(|t| t.parse::<jiff::Timestamp>().ok());
        matches!((at, started), (Some(at), Some(started)) if started >= at)
    };
    let mut kept: Vec<pgop_api::cluster::InstanceRestart> = old
        .iter()
        .filter(|e| planned(&e.instance) && !restarted(e))
        .cloned()
        .collect();
    let Some(value) = annotation else {
        return (kept, None);
    };
    let mut request = InstanceRestartRequest::default();
    let names: Vec<&str> = value
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .collect();
    if names.is_empty() {
        request
            .refused
            .push("an empty value (name one or more instances, separated by commas)".into());
    }
    if names.len() > MAX_RESTART_NAMES {
        request.refused.push(format!(
            "{} names (at most {MAX_RESTART_NAMES})",
            names.len()
        ));
        return (kept, Some(request));
    }
    for name in names {
        if !planned(name) {
            let quoted: String = name.chars().take(MAX_QUOTED_NAME).collect();
            request
                .refused
                .push(format!("{quoted:?}: not an instance of this cluster"));
            continue;
        }
        kept.retain(|e| e.instance != name);
        kept.push(pgop_api::cluster::InstanceRestart {
            instance: name.to_string(),
            requested_at: now.to_string(),
        });
        if !request.accepted.iter().any(|a| a == name) {
            request.accepted.push(name.to_string());
        }
    }
    kept.sort_by(|a, b| a.instance.cmp(&b.instance));
    (kept, Some(request))
}

impl Input<'_> {
    /// Whether an instance needs a restart: parameters pending one, or a restart requested
    /// after its postmaster started.
    pub fn needs_restart(&self, s: &PgStatus) -> bool {
        let started_before = |at: &jiff::Timestamp| {
            s.postmaster_start_time
                .as_deref()
                .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                .is_some_and(|started| started < *at)
        };
        s.pending_restart
            || self
                .restart_requested_at
                .as_ref()
                .is_some_and(started_before)
            || self
                .instance_restarts
                .get(&s.instance)
                .is_some_and(started_before)
    }

    /// Whether this instance's Pod is built from an older spec than now.
    fn outdated(&self, name: &str, pod: &Pod) -> bool {
        let live = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_SPEC_HASH));
        self.desired_hashes
            .get(name)
            .is_some_and(|d| live != Some(d))
    }

    /// Whether some instance still waits for a restart or a new Pod.
    pub fn work_left(&self) -> bool {
        self.restarting.is_some()
            || self.instances.iter().any(|(name, _)| {
                let pod = self.pods.iter().find(|p| p.name_any() == *name);
                let pg = self.probes.get(name).and_then(Probe::status);
                pod.is_some_and(|p| self.outdated(name, p))
                    || pg.is_some_and(|s| self.needs_restart(s))
            })
    }
}

/// Why a rollout stopped, for the `RolloutBlocked` condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocked {
    /// `RestartRefused`, `InstanceCannotStart` or `InstanceNotBack`.
    pub reason: &'static str,
    pub message: String,
}

/// Whether the rollout is blocked: the instance named for a restart refused it (its dry
/// run failed), or some instance has not been ready for longer than `bound` (the cluster's
/// Ready condition has been False since `not_ready_since`) while an update waits. The
/// message names the instances and PostgreSQL's last error lines.
pub fn blocked(
    input: &Input,
    restart_instance: Option<&str>,
    not_ready_since: Option<jiff::Timestamp>,
    now: jiff::Timestamp,
    bound: std::time::Duration,
) -> Option<Blocked> {
    if let Some(name) = restart_instance
        && let Some(why) = input
            .probes
            .get(name)
            .and_then(Probe::status)
            .and_then(|s| s.restart_refused.clone())
    {
        return Some(Blocked {
            reason: "RestartRefused",
            message: format!("{name} refused its restart, the rollout stops here: {why}"),
        });
    }
    // An instance that a restart for the spec's parameters left down will not come back
    // with them: the rollout stops at once, without waiting for the bound.
    let cannot_start: Vec<String> = input
        .instances
        .iter()
        .filter_map(|(name, _)| {
            let down = input
                .probes
                .get(name)
                .and_then(Probe::status)
                .and_then(|s| s.down.as_ref())
                .filter(|d| d.cannot_start_with_parameters())?;
            Some(format!(
                "{name} {}",
                crate::cluster::pods::down_message(down)
            ))
        })
        .collect();
    if !cannot_start.is_empty() {
        return Some(Blocked {
            reason: crate::cluster::pods::REASON_INSTANCE_CANNOT_START,
            message: pgop_api::instance_status::printable(
                &format!(
                    "cannot start, the rollout stops here and leaves the other instances \
                     alone: {}; set the parameter(s) back to go on",
                    cannot_start.join("; ")
                ),
                2048,
            ),
        });
    }
    let since = not_ready_since?;
    let waited = now.duration_since(since);
    let bound = jiff::SignedDuration::try_from(bound).ok()?;
    if waited < bound || !input.work_left() {
        return None;
    }
    let not_back: Vec<String> = input
        .instances
        .iter()
        .filter(|(name, _)| !input.unplaced.contains(name))
        .filter(|(name, _)| {
            let pod = input.pods.iter().find(|p| p.name_any() == *name);
            let running = input
                .probes
                .get(name)
                .and_then(Probe::status)
                .is_some_and(|s| s.role != PgRole::Stopped);
            !(pod.is_some_and(pod_ready) && running)
        })
        .map(|(name, _)| {
            let pg = input.probes.get(name).and_then(Probe::status);
            if pg.is_some_and(|s| s.fenced) {
                return format!("{name} (fenced: spec.fencedInstances; unfence it to go on)");
            }
            match pg.and_then(|s| s.last_error.clone()) {
                Some(words) => format!("{name} ({})", words.replace('\n', " | ")),
                None => name.clone(),
            }
        })
        .collect();
    if not_back.is_empty() {
        return None;
    }
    Some(Blocked {
        reason: "InstanceNotBack",
        message: format!(
            "not back after {}s, the rollout stops here and leaves the other instances alone: {}",
            waited.as_secs(),
            not_back.join("; ")
        ),
    })
}

/// Whether an instance is healthy for a rollout step: PostgreSQL answers, and a standby
/// streams from its primary.
fn healthy(s: &PgStatus) -> bool {
    match s.role {
        // A designated primary answers; whether it keeps up with its source is reported
        // apart (a source that is down must not stall a rollout of the cluster).
        PgRole::Primary | PgRole::DesignatedPrimary => true,
        PgRole::Replica => s.streaming,
        PgRole::Stopped => false,
    }
}

pub fn next(input: &Input) -> Step {
    let roles = input.roles;
    // A Pod no node was found for runs nothing: when it is outdated (the anti-affinity or
    // node selector that kept it Pending was changed, say), it is replaced at once. The
    // steps below wait for every instance to be ready, which this one never would be.
    let never_placed = input.instances.iter().find(|(name, _)| {
        input.pods.iter().any(|p| {
            p.name_any() == *name
                && p.metadata.deletion_timestamp.is_none()
                && p.spec.as_ref().is_some_and(|s| s.node_name.is_none())
                && input.outdated(name, p)
        })
    });
    if let Some((name, _)) = never_placed {
        return Step::Replace {
            instance: name.clone(),
        };
    }
    if roles.in_transition() {
        return Step::Idle;
    }
    if let Some(name) = input.restarting
        && input.instances.iter().any(|(n, _)| n == name)
    {
        let pod = input.pods.iter().find(|p| p.name_any() == name);
        let back = pod.is_some_and(pod_ready)
            && input
                .probes
                .get(name)
                .and_then(Probe::status)
                .is_some_and(|s| s.running && healthy(s));
        if pod.is_some() && !back {
            return Step::Restart {
                instance: name.to_string(),
            };
        }
    }
    if !roles.primary.available {
        return Step::Idle;
    }
    let mut live: Vec<(&str, &Pod, &PgStatus)> = Vec::new();
    for (name, _) in input.instances {
        if input.unplaced.contains(name) {
            // No node for a while: it runs nothing, and the others are rolled without it.
            continue;
        }
        let pod = input.pods.iter().find(|p| p.name_any() == *name);
        let pg = input.probes.get(name).and_then(Probe::status);
        match (pod, pg) {
            (Some(pod), Some(pg))
                if pod.metadata.deletion_timestamp.is_none() && pod_ready(pod) && healthy(pg) =>
            {
                live.push((name, pod, pg))
            }
            _ => return Step::Idle,
        }
    }
    let outdated = |name: &str, pod: &Pod| input.outdated(name, pod);
    let (primary, standbys): (Vec<_>, Vec<_>) =
        live.iter().partition(|(n, _, _)| *n == roles.current);
    let behind = |s: &PgStatus| match (s.applied_generation, input.generation) {
        (Some(applied), Some(current)) => applied < current,
        _ => false,
    };
    if live.iter().any(|(_, _, s)| behind(s)) {
        // Some manager has not applied the current parameters yet: what is pending a
        // restart (and whether a value goes down) is not known everywhere.
        return Step::Idle;
    }
    if let Some((name, _, pg)) = primary.first()
        && !pg.pending_restart_decreases.is_empty()
    {
        return Step::Restart {
            instance: name.to_string(),
        };
    }
    if let Some((n, _, _)) = standbys.iter().find(|(n, p, _)| outdated(n, p)) {
        return Step::Replace {
            instance: n.to_string(),
        };
    }
    if let Some((n, _, _)) = standbys.iter().find(|(_, _, s)| input.needs_restart(s)) {
        return Step::Restart {
            instance: n.to_string(),
        };
    }
    let Some((name, pod, pg)) = primary.first() else {
        return Step::Idle;
    };
    let replace = outdated(name, pod);
    if !replace && !input.needs_restart(pg) {
        return Step::Idle;
    }
    let best = standbys
        .iter()
        .filter(|(_, _, s)| s.role == PgRole::Replica && s.streaming)
        .max_by_key(|(n, _, s)| {
            let serial = input
                .instances
                .iter()
                .find(|(i, _)| i == n)
                .map_or(0, |(_, s)| *s);
            (
                s.wal_position().unwrap_or(0),
                s.replayed_lsn.as_deref().and_then(parse_lsn).unwrap_or(0),
                -serial,
            )
        });
    match best {
        Some((to, _, _)) => Step::Switchover { to: to.to_string() },
        // Standbys, but none healthy enough to take over: the primary stays as it is.
        None if !standbys.is_empty() => Step::Idle,
        None if replace => Step::Replace {
            instance: name.to_string(),
        },
        None => Step::Restart {
            instance: name.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::decide::roles::Availability;

    fn pod(name: &str, hash: &str, ready: bool) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "annotations": {ANNOTATION_SPEC_HASH: hash}},
            "status": {"conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}
        }))
        .expect("pod")
    }

    fn pg(name: &str, role: PgRole, lsn: &str, pending: bool) -> Probe {
        let mut s = PgStatus::stopped(name, false);
        s.role = role;
        s.running = true;
        s.streaming = role == PgRole::Replica;
        s.pending_restart = pending;
        if role == PgRole::Replica {
            s.received_lsn = Some(lsn.into());
        } else {
            s.current_lsn = Some(lsn.into());
        }
        Probe::Status(Box::new(s))
    }

    fn roles(current: &str, target: &str) -> Roles {
        Roles {
            current: current.into(),
            target: target.into(),
            phase: None,
            primary: Availability {
                available: true,
                reason: "PrimaryRunning",
                message: String::new(),
            },
            notes: Vec::new(),
            clear_switchover_request: false,
        }
    }

    struct World {
        instances: Vec<(String, i32)>,
        pods: Vec<Pod>,
        probes: BTreeMap<String, Probe>,
        hashes: BTreeMap<String, String>,
        generation: Option<i64>,
        restarting: Option<String>,
        requested_at: Option<jiff::Timestamp>,
        instance_restarts: BTreeMap<String, jiff::Timestamp>,
        unplaced: BTreeSet<String>,
    }

    impl World {
        fn new() -> Self {
            let names = ["db-1", "db-2", "db-3"];
            Self {
                instances: names
                    .iter()
                    .zip(1..)
                    .map(|(n, s)| (n.to_string(), s))
                    .collect(),
                pods: names.iter().map(|n| pod(n, "old", true)).collect(),
                probes: BTreeMap::from([
                    ("db-1".into(), pg("db-1", PgRole::Primary, "0/9", false)),
                    ("db-2".into(), pg("db-2", PgRole::Replica, "0/7", false)),
                    ("db-3".into(), pg("db-3", PgRole::Replica, "0/8", false)),
                ]),
                hashes: names
                    .iter()
                    .map(|n| (n.to_string(), "old".into()))
                    .collect(),
                generation: Some(1),
                restarting: None,
                requested_at: None,
                instance_restarts: BTreeMap::new(),
                unplaced: BTreeSet::new(),
            }
        }

        fn next(&self, roles: &Roles) -> Step {
            next(&self.input(roles))
        }

        fn input<'a>(&'a self, roles: &'a Roles) -> Input<'a> {
            Input {
                instances: &self.instances,
                pods: &self.pods,
                probes: &self.probes,
                roles,
                desired_hashes: &self.hashes,
                generation: self.generation,
                restarting: self.restarting.as_deref(),
                restart_requested_at: self.requested_at,
                instance_restarts: &self.instance_restarts,
                unplaced: &self.unplaced,
            }
        }

        fn started_at(&mut self, name: &str, at: &str) {
            if let Some(Probe::Status(s)) = self.probes.get_mut(name) {
                s.postmaster_start_time = Some(at.into());
            }
        }
    }

    fn t(s: &str) -> jiff::Timestamp {
        s.parse().expect("timestamp")
    }

    /// A Pod the scheduler could not place: a spec without a node, PodScheduled False.
    fn pending(name: &str, hash: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "annotations": {ANNOTATION_SPEC_HASH: hash}},
            "spec": {"containers": []},
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled",
                "status": "False", "reason": "Unschedulable",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
                "message": "0/3 nodes are available"}]}
        }))
        .expect("pod")
    }

    #[test]
    fn an_outdated_pod_that_was_never_placed_is_replaced_first_and_at_once() {
        let mut w = World::new();
        let r = roles("db-1", "db-1");
        w.pods[2] = pending("db-3", "old");
        w.probes
            .insert("db-3".into(), Probe::Unreachable("no pod IP".into()));
        assert_eq!(
            w.next(&r),
            Step::Idle,
            "up to date: nothing to do, and nothing moves while db-3 is not ready"
        );
        // The spec changed (anti-affinity relaxed): every Pod is outdated. The Pending one
        // goes first, although it is not ready and others would be replaced before it.
        for hash in w.hashes.values_mut() {
            *hash = "new".into();
        }
        assert_eq!(
            w.next(&r),
            Step::Replace {
                instance: "db-3".into()
            }
        );
        // Even during a change of primary: it runs nothing.
        assert_eq!(
            w.next(&roles("db-1", "db-2")),
            Step::Replace {
                instance: "db-3".into()
            }
        );
        // Once it is built anew (still Pending, now up to date), the others wait for it.
        w.pods[2] = pending("db-3", "new");
        assert_eq!(w.next(&r), Step::Idle);
        // A Pod on a node is never replaced while it is not ready.
        let mut placed = pod("db-3", "old", false);
        placed.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            node_name: Some("node-1".into()),
            ..Default::default()
        });
        w.pods[2] = placed;
        assert_eq!(w.next(&r), Step::Idle);
    }

    #[test]
    fn an_instance_without_a_node_for_long_no_longer_holds_the_others_back() {
        let mut w = World::new();
        let r = roles("db-1", "db-1");
        // db-3 is up to date but has no node (its own, or the others', required
        // anti-affinity); db-1 and db-2 are outdated.
        w.hashes.insert("db-1".into(), "new".into());
        w.hashes.insert("db-2".into(), "new".into());
        w.hashes.insert("db-3".into(), "old".into());
        w.pods[2] = pending("db-3", "old");
        w.probes
            .insert("db-3".into(), Probe::Unreachable("no pod IP".into()));
        let since = t("2026-01-01T00:00:00Z");
        assert!(unplaced(&w.pods, t("2026-01-01T00:00:10Z")).is_empty());
        assert_eq!(w.next(&r), Step::Idle, "a short wait for a node is normal");
        let input = w.input(&r);
        let stuck = blocked(
            &input,
            None,
            Some(since),
            t("2026-01-01T00:02:00Z"),
            std::time::Duration::from_secs(60),
        );
        assert_eq!(
            stuck.map(|b| b.reason),
            Some("InstanceNotBack"),
            "without the grace, the rollout waits for db-3 and says so"
        );

        w.unplaced = unplaced(&w.pods, t("2026-01-01T00:00:31Z"));
        assert_eq!(w.unplaced, BTreeSet::from(["db-3".to_string()]));
        assert_eq!(
            w.next(&r),
            Step::Replace {
                instance: "db-2".into()
            },
            "the running instances are rolled as if db-3 were not there"
        );
        let input = w.input(&r);
        let stuck = blocked(
            &input,
            None,
            Some(since),
            t("2026-01-01T00:02:00Z"),
            std::time::Duration::from_secs(60),
        );
        assert_eq!(
            stuck, None,
            "an instance with no node is not a step that did not come back"
        );
        w.pods[1] = pod("db-2", "new", true);
        assert_eq!(w.next(&r), Step::Switchover { to: "db-2".into() });
    }

    #[test]
    fn the_restart_annotation_restarts_one_instance_at_a_time_standbys_first() {
        let mut w = World::new();
        let r = roles("db-1", "db-1");
        for n in ["db-1", "db-2", "db-3"] {
            w.started_at(n, "2026-01-01T00:00:00Z");
        }
        assert_eq!(w.next(&r), Step::Idle, "no request yet");
        w.requested_at = Some(t("2026-01-01T00:01:00Z"));
        assert_eq!(
            w.next(&r),
            Step::Restart {
                instance: "db-2".into()
            }
        );
        w.started_at("db-2", "2026-01-01T00:01:05Z");
        assert_eq!(
            w.next(&r),
            Step::Restart {
                instance: "db-3".into()
            }
        );
        w.started_at("db-3", "2026-01-01T00:01:10Z");
        assert_eq!(
            w.next(&r),
            Step::Switchover { to: "db-3".into() },
            "the primary last, through a switchover to the standby with the most WAL"
        );
        w.started_at("db-1", "2026-01-01T00:01:20Z");
        assert_eq!(w.next(&r), Step::Idle);
    }

    #[test]
    fn an_instance_restart_restarts_that_instance_only_and_a_primary_after_a_switchover() {
        let mut w = World::new();
        let r = roles("db-1", "db-1");
        for n in ["db-1", "db-2", "db-3"] {
            w.started_at(n, "2026-01-01T00:00:00Z");
        }
        w.instance_restarts
            .insert("db-2".into(), t("2026-01-01T00:01:00Z"));
        assert_eq!(
            w.next(&r),
            Step::Restart {
                instance: "db-2".into()
            }
        );
        w.started_at("db-2", "2026-01-01T00:01:05Z");
        assert_eq!(
            w.next(&r),
            Step::Idle,
            "db-3 and the primary are left alone"
        );
        // The primary: moved first, then restarted as a standby.
        w.instance_restarts
            .insert("db-1".into(), t("2026-01-01T00:02:00Z"));
        assert_eq!(w.next(&r), Step::Switchover { to: "db-3".into() });
        w.started_at("db-1", "2026-01-01T00:02:10Z");
        assert_eq!(w.next(&r), Step::Idle);
    }

    #[test]
    fn the_restart_instance_annotation_is_recorded_checked_and_pruned() {
        let w = World::new();
        let now = t("2026-01-01T00:05:00Z");
        // Names checked, trimmed, deduplicated; hostile ones refused, quoted and cut.
        let (entries, request) = instance_restarts(
            &[],
            Some(" db-2 ,db-2, db-9,$(id)\nx,"),
            &w.instances,
            &w.probes,
            now,
        );
        let request = request.expect("read");
        assert_eq!(request.accepted, ["db-2"]);
        assert_eq!(request.refused.len(), 2, "{:?}", request.refused);
        assert!(request.refused[0].starts_with("\"db-9\""));
        assert!(request.refused[1].contains("\\n"), "{:?}", request.refused);
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].instance, "db-2");
        assert_eq!(entries[0].requested_at, now.to_string());
        let (_, request) = instance_restarts(&[], Some(" , "), &w.instances, &w.probes, now);
        assert!(request.expect("read").accepted.is_empty());
        let many = vec!["db-1"; 17].join(",");
        let (entries, request) = instance_restarts(&[], Some(&many), &w.instances, &w.probes, now);
        assert!(entries.is_empty());
        assert!(request.expect("read").refused[0].contains("at most 16"));

        // Kept while not restarted or not answering; gone once restarted, or with its
        // instance.
        let entry = |i: &str| pgop_api::cluster::InstanceRestart {
            instance: i.into(),
            requested_at: "2026-01-01T00:01:00Z".into(),
        };
        let mut w = World::new();
        w.started_at("db-2", "2026-01-01T00:00:30Z");
        w.started_at("db-3", "2026-01-01T00:01:30Z");
        w.probes.remove("db-1");
        let old = [entry("db-1"), entry("db-2"), entry("db-3"), entry("db-7")];
        let (entries, request) = instance_restarts(&old, None, &w.instances, &w.probes, now);
        assert_eq!(request, None);
        let names: Vec<&str> = entries.iter().map(|e| e.instance.as_str()).collect();
        assert_eq!(names, ["db-1", "db-2"]);
    }

    #[test]
    fn a_restarted_standby_is_back_only_once_it_streams_again() {
        let mut w = World::new();
        let r = roles("db-1", "db-1");
        w.restarting = Some("db-2".into());
        for n in ["db-2", "db-3"] {
            if let Some(Probe::Status(s)) = w.probes.get_mut(n) {
                s.pending_restart = true;
            }
        }
        if let Some(Probe::Status(s)) = w.probes.get_mut("db-2") {
            s.pending_restart = false;
            s.streaming = false;
        }
        assert_eq!(
            w.next(&r),
            Step::Restart {
                instance: "db-2".into()
            },
            "answering, but not streaming yet: db-3 waits"
        );
        if let Some(Probe::Status(s)) = w.probes.get_mut("db-2") {
            s.streaming = true;
        }
        assert_eq!(
            w.next(&r),
            Step::Restart {
                instance: "db-3".into()
            }
        );
    }

    #[test]
    fn a_primary_with_standbys_is_never_restarted_in_place_for_lack_of_a_healthy_one() {
        let mut w = World::new();
        w.probes
            .insert("db-1".into(), pg("db-1", PgRole::Primary, "0/9", true));
        for n in ["db-2", "db-3"] {
            if let Some(Probe::Status(s)) = w.probes.get_mut(n) {
                s.streaming = false;
            }
        }
        assert_eq!(w.next(&roles("db-1", "db-1")), Step::Idle);
    }

    #[test]
    fn an_instance_that_cannot_start_after_a_restart_for_parameters_blocks_at_once() {
        use pgop_api::instance_status::{Down, DownReason};
        let mut w = World::new();
        let r = roles("db-1", "db-1");
        let bound = std::time::Duration::from_secs(60);
        let now = t("2026-01-01T00:10:00Z");
        let mut down = PgStatus::stopped("db-2", false);
        down.down = Some(Down {
            reason: DownReason::StartFailed,
            message: "FATAL:  could not load library \"/nope.so\"".into(),
            parameters: vec!["shared_preload_libraries".into()],
            since: Some("2026-01-01T00:09:58Z".into()),
        });
        w.probes
            .insert("db-2".into(), Probe::Status(Box::new(down)));
        w.pods[1] = pod("db-2", "old", false);
        w.restarting = Some("db-2".into());
        // Not ready for two seconds only: blocked all the same, naming the instance, the
        // parameter and PostgreSQL's words.
        let since = Some(t("2026-01-01T00:09:58Z"));
        let b = blocked(&w.input(&r), None, since, now, bound).expect("blocked");
        assert_eq!(b.reason, "InstanceCannotStart");
        for part in [
            "db-2 after the restart for shared_preload_libraries",
            "could not load library",
            "set the parameter(s) back",
        ] {
            assert!(b.message.contains(part), "{part:?} in {}", b.message);
        }
        assert!(!b.message.contains("db-3"), "{}", b.message);
        // Down for another reason (no restart for parameters first): the bound applies.
        if let Some(Probe::Status(s)) = w.probes.get_mut("db-2")
            && let Some(d) = s.down.as_mut()
        {
            d.parameters.clear();
        }
        assert_eq!(blocked(&w.input(&r), None, since, now, bound), None);
    }

    #[test]
    fn a_rollout_is_blocked_by_a_refused_restart_or_an_instance_not_back_in_time() {
        let mut w = World::new();
        let r = roles("db-1", "db-1");
        let bound = std::time::Duration::from_secs(60);
        let now = t("2026-01-01T00:10:00Z");
        // db-2 was named for a restart and refused it (dry run).
        if let Some(Probe::Status(s)) = w.probes.get_mut("db-2") {
            s.pending_restart = true;
            s.restart_refused = Some("shared_preload_libraries names \"nope\"".into());
        }
        let b = blocked(&w.input(&r), Some("db-2"), None, now, bound).expect("blocked");
        assert_eq!(b.reason, "RestartRefused");
        assert!(
            b.message.contains("db-2") && b.message.contains("nope"),
            "{}",
            b.message
        );

        // db-2 restarted and did not come back.
        let mut down = PgStatus::stopped("db-2", false);
        down.last_error = Some("FATAL:  could not access file \"nope\"".into());
        w.probes
            .insert("db-2".into(), Probe::Status(Box::new(down)));
        w.pods[1] = pod("db-2", "old", false);
        w.restarting = Some("db-2".into());
        let since = Some(t("2026-01-01T00:09:30Z"));
        assert_eq!(
            blocked(&w.input(&r), Some("db-2"), since, now, bound),
            None,
            "not yet"
        );
        let since = Some(t("2026-01-01T00:08:30Z"));
        let b = blocked(&w.input(&r), Some("db-2"), since, now, bound).expect("blocked");
        assert_eq!(b.reason, "InstanceNotBack");
        assert!(
            b.message
                .contains("db-2 (FATAL:  could not access file \"nope\")"),
            "{}",
            b.message
        );
        assert!(!b.message.contains("db-3"), "{}", b.message);

        // A fenced instance holds the rollout, and is named as fenced.
        w.probes.insert(
            "db-2".into(),
            Probe::Status(Box::new(PgStatus::stopped("db-2", true))),
        );
        let b = blocked(&w.input(&r), Some("db-2"), since, now, bound).expect("blocked");
        assert!(b.message.contains("db-2 (fenced"), "{}", b.message);

        // Not ready, but nothing to roll out: no rollout to block.
        w.restarting = None;
        w.probes.insert(
            "db-2".into(),
            Probe::Status(Box::new(PgStatus::stopped("db-2", false))),
        );
        assert_eq!(blocked(&w.input(&r), None, since, now, bound), None);
    }

    #[test]
    fn a_new_spec_replaces_standbys_first_then_switches_over_then_the_old_primary() {
        let mut w = World::new();
        let r = roles("db-1", "db-1");
        assert_eq!(w.next(&r), Step::Idle);
        for h in w.hashes.values_mut() {
            *h = "new".into();
        }
        assert_eq!(
            w.next(&r),
            Step::Replace {
                instance: "db-2".into()
            }
        );
        // While the replaced standby is not ready, nothing else moves.
        w.pods[1] = pod("db-2", "new", false);
        assert_eq!(w.next(&r), Step::Idle);
        w.pods[1] = pod("db-2", "new", true);
        assert_eq!(
            w.next(&r),
            Step::Replace {
                instance: "db-3".into()
            }
        );
        w.pods[2] = pod("db-3", "new", true);
        // The most WAL wins the switchover.
        assert_eq!(w.next(&r), Step::Switchover { to: "db-3".into() });
        assert_eq!(w.next(&roles("db-1", "db-3")), Step::Idle, "in transition");
        // After it, the old primary is a standby with an old spec.
        w.probes
            .insert("db-3".into(), pg("db-3", PgRole::Primary, "0/9", false));
        w.probes
            .insert("db-1".into(), pg("db-1", PgRole::Replica, "0/9", false));
        assert_eq!(
            w.next(&roles("db-3", "db-3")),
            Step::Replace {
                instance: "db-1".into()
            }
        );
    }

    #[test]
    fn pending_restarts_go_standby_by_standby_and_a_lone_primary_restarts_in_place() {
        let mut w = World::new();
        for n in ["db-2", "db-3"] {
            w.probes
                .insert(n.into(), pg(n, PgRole::Replica, "0/7", true));
        }
        w.probes
            .insert("db-1".into(), pg("db-1", PgRole::Primary, "0/9", true));
        let r = roles("db-1", "db-1");
        assert_eq!(
            w.next(&r),
            Step::Restart {
                instance: "db-2".into()
            }
        );
        w.probes
            .insert("db-2".into(), pg("db-2", PgRole::Replica, "0/7", false));
        w.probes
            .insert("db-3".into(), pg("db-3", PgRole::Replica, "0/7", false));
        assert_eq!(w.next(&r), Step::Switchover { to: "db-2".into() });

        let mut lone = World::new();
        lone.instances.truncate(1);
        lone.probes
            .insert("db-1".into(), pg("db-1", PgRole::Primary, "0/9", true));
        assert_eq!(
            lone.next(&r),
            Step::Restart {
                instance: "db-1".into()
            }
        );
    }

    fn applied(w: &mut World, name: &str, generation: i64, pending: bool) {
        if let Some(Probe::Status(s)) = w.probes.get_mut(name) {
            s.applied_generation = Some(generation);
            s.pending_restart = pending;
        }
    }

    #[test]
    fn a_restart_waits_until_every_instance_applied_the_new_generation() {
        // Found in CI: the primary reloaded the new shared_buffers first and reported it
        // pending while the standbys had not seen the change yet; the rollout switched
        // over to a standby that then needed a restart itself, and switched back.
        let mut w = World::new();
        for n in ["db-1", "db-2", "db-3"] {
            applied(&mut w, n, 1, false);
        }
        w.generation = Some(2);
        applied(&mut w, "db-1", 2, true);
        let r = roles("db-1", "db-1");
        assert_eq!(w.next(&r), Step::Idle, "db-2 and db-3 have not applied 2");
        applied(&mut w, "db-2", 2, true);
        assert_eq!(w.next(&r), Step::Idle, "db-3 has not applied 2");
        applied(&mut w, "db-3", 2, true);
        assert_eq!(
            w.next(&r),
            Step::Restart {
                instance: "db-2".into()
            }
        );
        // Managers that never report a generation do not hold a rollout up forever.
        let mut old = World::new();
        applied(&mut old, "db-1", 0, true);
        if let Some(Probe::Status(s)) = old.probes.get_mut("db-1") {
            s.applied_generation = None;
        }
        assert_eq!(old.next(&r), Step::Switchover { to: "db-3".into() });
    }

    #[test]
    fn a_lowered_hot_standby_parameter_restarts_the_primary_first_and_waits_for_it() {
        let mut w = World::new();
        for n in ["db-1", "db-2", "db-3"] {
            applied(&mut w, n, 1, true);
        }
        if let Some(Probe::Status(s)) = w.probes.get_mut("db-1") {
            s.pending_restart_decreases = vec!["max_connections".into()];
        }
        // Even a Pod change waits: a new standby Pod would start with the lower value.
        w.hashes.insert("db-2".into(), "new".into());
        let r = roles("db-1", "db-1");
        assert_eq!(
            w.next(&r),
            Step::Restart {
                instance: "db-1".into()
            }
        );
        // While it restarts (Pod not ready, primary unavailable), it stays named.
        w.restarting = Some("db-1".into());
        w.pods[0] = pod("db-1", "old", false);
        let mut down = roles("db-1", "db-1");
        down.primary.available = false;
        assert_eq!(
            w.next(&down),
            Step::Restart {
                instance: "db-1".into()
            }
        );
        // Back with the lower value: the standbys follow, the replacement first.
        w.pods[0] = pod("db-1", "old", true);
        applied(&mut w, "db-1", 1, false);
        if let Some(Probe::Status(s)) = w.probes.get_mut("db-1") {
            s.pending_restart_decreases.clear();
        }
        assert_eq!(
            w.next(&r),
            Step::Replace {
                instance: "db-2".into()
            }
        );
        // A restart named once, of an instance already back, is not repeated.
        w.hashes.insert("db-2".into(), "old".into());
        for n in ["db-2", "db-3"] {
            applied(&mut w, n, 1, false);
        }
        assert_eq!(w.next(&r), Step::Idle);
    }

    #[test]
    fn nothing_moves_while_the_primary_is_unavailable() {
        let mut w = World::new();
        for h in w.hashes.values_mut() {
            *h = "new".into();
        }
        let mut r = roles("db-1", "db-1");
        r.primary.available = false;
        assert_eq!(w.next(&r), Step::Idle);
    }
}
