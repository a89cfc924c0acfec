//! Rollout: changes that need PostgreSQL or its Pod restarted (image, resources, any Pod
//! setting; parameters PostgreSQL applies only at start), one instance at a time, as a
//! pure decision.
//!
//! Order: the standbys one by one (each back ready before the next), then a switchover to
//! the standby with the most WAL, then the old primary, now a standby. The primary is thus
//! restarted in place only when it is the sole instance. Nothing moves while a failover or
//! switchover is in progress, while the primary is unavailable, or while any instance is
//! not ready: a rollout never takes a second instance down.
//!
//! - A Pod whose spec changed (its `spec-hash` annotation differs from the built one) is
//!   deleted; the next reconcile creates it anew on the same volume.
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

use super::probe::Probe;
use super::roles::Roles;
use super::status::pod_ready;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use pgop_api::constants::ANNOTATION_SPEC_HASH;
use pgop_api::instance_status::{PgRole, PgStatus, parse_lsn};
use std::collections::BTreeMap;

/// The next rollout step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing outdated, or not a safe moment.
    Idle,
    /// Delete this instance's Pod: its spec changed.
    Replace { instance: String },
    /// This instance restarts PostgreSQL for parameters pending a restart.
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
}

pub fn next(input: &Input) -> Step {
    let roles = input.roles;
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
                .is_some_and(|s| s.running && s.role != PgRole::Stopped);
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
        let pod = input.pods.iter().find(|p| p.name_any() == *name);
        let pg = input.probes.get(name).and_then(Probe::status);
        match (pod, pg) {
            (Some(pod), Some(pg))
                if pod.metadata.deletion_timestamp.is_none()
                    && pod_ready(pod)
                    && pg.role != PgRole::Stopped =>
            {
                live.push((name, pod, pg))
            }
            _ => return Step::Idle,
        }
    }
    let outdated = |name: &str, pod: &Pod| {
        let live = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_SPEC_HASH));
        input
            .desired_hashes
            .get(name)
            .is_some_and(|d| live != Some(d))
    };
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
    if let Some((n, _, _)) = standbys.iter().find(|(_, _, s)| s.pending_restart) {
        return Step::Restart {
            instance: n.to_string(),
        };
    }
    let Some((name, pod, pg)) = primary.first() else {
        return Step::Idle;
    };
    let replace = outdated(name, pod);
    if !replace && !pg.pending_restart {
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
    use crate::cluster::roles::Availability;

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
            }
        }

        fn next(&self, roles: &Roles) -> Step {
            next(&Input {
                instances: &self.instances,
                pods: &self.pods,
                probes: &self.probes,
                roles,
                desired_hashes: &self.hashes,
                generation: self.generation,
                restarting: self.restarting.as_deref(),
            })
        }
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
