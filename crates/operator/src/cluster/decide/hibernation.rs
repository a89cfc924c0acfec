//! `spec.hibernate`: the cluster's instance Pods go, everything else stays (volumes,
//! Services, Secrets, the status with its primary), until the flag is cleared.
//!
//! The order, one pass at a time (each decided here as a pure function):
//! 1. a change of primary under way finishes first (the caller checks
//!    `targetPrimary == currentPrimary` before coming here);
//! 2. no Pod is deleted while a base or logical backup of the cluster runs: it would fail
//!    with its instance;
//! 3. the primary's Pod is deleted first: its manager writes a checkpoint and shuts
//!    PostgreSQL down fast, and the walsenders ship every WAL record, the shutdown
//!    checkpoint included, to the standbys still running, so every volume is left
//!    consistent and the standbys need no catching up when the cluster resumes;
//! 4. then the standbys' Pods;
//! 5. phase `Hibernated` once no instance Pod is left.
//!
//! Resuming (the flag cleared) is the ordinary reconcile: the Pods are created again on
//! their volumes, and the status still names the primary, whose manager starts it as the
//! primary; the others start as its standbys. While the cluster is `Resuming` no failover
//! is started ([`super::roles`] counts only a cluster that has served since), so an
//! instance that comes back before the primary cannot take its place.

use super::serials::{Plan, instance_name};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use pgop_api::PostgresClusterStatus;
use pgop_api::backup::{BackupPhase, PostgresBackup};
use pgop_api::cluster::{ClusterPhase, InstanceStatus};
use pgop_api::conditions::{self, new_condition, set_condition};
use pgop_api::labels;
use pgop_api::v1beta1::PostgresCluster;

/// The next step of a hibernation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Backups of the cluster are running (their names): no Pod is deleted until they end.
    WaitForBackups(Vec<String>),
    /// Delete these Pods now.
    Delete(Vec<String>),
    /// These Pods are being deleted (their managers are shutting PostgreSQL down).
    WaitForPods(Vec<String>),
    /// No instance Pod is left.
    Done,
}

impl Step {
    /// The cluster's phase while at this step.
    pub fn phase(&self) -> ClusterPhase {
        match self {
            Step::Done => ClusterPhase::Hibernated,
            _ => ClusterPhase::Hibernating,
        }
    }

    /// The Hibernated condition's reason and message.
    pub fn explain(&self, primary: &str) -> (&'static str, String) {
        match self {
            Step::WaitForBackups(backups) => (
                "Hibernating",
                format!(
                    "spec.hibernate: waiting for running backups to finish before the Pods are \
                     deleted: {}",
                    backups.join(", ")
                ),
            ),
            Step::Delete(pods) | Step::WaitForPods(pods) => (
                "Hibernating",
                format!(
                    "spec.hibernate: deleting the instance Pods, the primary {primary} first: {}; \
                     the volumes are kept",
                    pods.join(", ")
                ),
            ),
            Step::Done => (
                "Hibernated",
                format!(
                    "spec.hibernate: no instance Pod runs; the volumes are kept and {primary} \
                     is the primary again when the cluster resumes"
                ),
            ),
        }
    }
}

/// The next step, from the cluster's instance Pods, the primary the status names, and
/// the cluster's backups.
pub fn next(pods: &[Pod], primary: &str, backups: &[PostgresBackup]) -> Step {
    let running: Vec<String> = backups
        .iter()
        .filter(|b| b.status.as_ref().and_then(|s| s.phase) == Some(BackupPhase::Running))
        .map(ResourceExt::name_any)
        .collect();
    let live: Vec<&Pod> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    if !running.is_empty() && !live.is_empty() {
        return Step::WaitForBackups(running);
    }
    if let Some(p) = live.iter().find(|p| p.name_any() == primary) {
        return Step::Delete(vec![p.name_any()]);
    }
    let primary_going = pods.iter().any(|p| p.name_any() == primary);
    if !primary_going && !live.is_empty() {
        return Step::Delete(live.iter().map(|p| p.name_any()).collect());
    }
    if pods.is_empty() {
        Step::Done
    } else {
        Step::WaitForPods(pods.iter().map(ResourceExt::name_any).collect())
    }
}

/// The status of a hibernating cluster: the instances keep their names and last
/// positions but no role; the primary stays named; the phase and the Hibernated, Ready and
/// PrimaryAvailable conditions say what is happening.
pub fn status(
    cluster: &PostgresCluster,
    plan: &Plan,
    pods: &[Pod],
    step: &Step,
    now: Time,
) -> PostgresClusterStatus {
    let name = cluster.name_any();
    let generation = cluster.metadata.generation;
    let old = cluster.status.clone().unwrap_or_default();
    let mut status = old.clone();
    let primary = old.current_primary.clone().unwrap_or_default();
    status.instances = plan
        .serials
        .iter()
        .map(|serial| {
            let instance = instance_name(&name, *serial);
            let previous = old.instances.iter().find(|i| i.name == instance);
            InstanceStatus {
                role: None,
                ready: false,
                fenced: false,
                timeline: previous.and_then(|p| p.timeline),
                received_lsn: previous.and_then(|p| p.received_lsn.clone()),
                replayed_lsn: previous.and_then(|p| p.replayed_lsn.clone()),
                manager_version: None,
                postgres_version: None,
                reason: None,
                message: None,
                down_since: None,
                name: instance,
                serial: *serial,
            }
        })
        .collect();
    status.replicas = i32::try_from(pods.len()).unwrap_or(i32::MAX);
    status.ready_replicas = 0;
    status.selector = Some(labels::instance_selector(&name));
    status.next_serial = plan.next_serial.max(old.next_serial);
    status.observed_generation = generation;
    status.phase = Some(step.phase());
    status.restart_instance = None;
    let (reason, message) = step.explain(&primary);
    let c = &mut status.conditions;
    let cond = |t, s, r, m: String| new_condition(t, s, r, m, generation, now.clone());
    set_condition(
        c,
        cond(conditions::HIBERNATED, true, reason, message),
        now.clone(),
    );
    set_condition(
        c,
        cond(
            conditions::READY,
            false,
            "Hibernated",
            "spec.hibernate: the cluster is hibernated".into(),
        ),
        now.clone(),
    );
    set_condition(
        c,
        cond(
            conditions::PRIMARY_AVAILABLE,
            false,
            "Hibernated",
            format!("spec.hibernate: {primary} does not run while the cluster is hibernated"),
        ),
        now.clone(),
    );
    pgop_api::conditions::set_spec_valid(c, generation, &now);
    status
}

/// Whether the cluster was hibernating or hibernated when last seen, or is resuming:
/// it has not served since, so no failover may start (see [`super::roles`]).
pub fn resuming_from(phase: Option<ClusterPhase>) -> bool {
    matches!(
        phase,
        Some(ClusterPhase::Hibernating | ClusterPhase::Hibernated | ClusterPhase::Resuming)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, deleting: bool) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        if deleting {
            p.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        }
        p
    }

    fn backup(name: &str, phase: BackupPhase) -> PostgresBackup {
        let mut b: PostgresBackup =
            serde_json::from_value(serde_json::json!({"metadata": {"name": name},
                "spec": {"cluster": {"name": "demo"}}}))
            .expect("backup");
        b.status = Some(pgop_api::backup::PostgresBackupStatus {
            phase: Some(phase),
            ..Default::default()
        });
        b
    }

    #[test]
    fn the_primary_goes_first_then_the_standbys() {
        let pods = [
            pod("demo-1", false),
            pod("demo-2", false),
            pod("demo-3", false),
        ];
        assert_eq!(
            next(&pods, "demo-2", &[]),
            Step::Delete(vec!["demo-2".into()])
        );
        let pods = [
            pod("demo-1", false),
            pod("demo-2", true),
            pod("demo-3", false),
        ];
        assert_eq!(
            next(&pods, "demo-2", &[]),
            Step::WaitForPods(vec!["demo-1".into(), "demo-2".into(), "demo-3".into()])
        );
        let pods = [pod("demo-1", false), pod("demo-3", false)];
        assert_eq!(
            next(&pods, "demo-2", &[]),
            Step::Delete(vec!["demo-1".into(), "demo-3".into()])
        );
        let pods = [pod("demo-1", true)];
        assert_eq!(
            next(&pods, "demo-2", &[]),
            Step::WaitForPods(vec!["demo-1".into()])
        );
        assert_eq!(next(&[], "demo-2", &[]), Step::Done);
        assert_eq!(Step::Done.phase(), ClusterPhase::Hibernated);
        assert_eq!(Step::WaitForPods(vec![]).phase(), ClusterPhase::Hibernating);
    }

    #[test]
    fn running_backups_hold_every_pod() {
        let pods = [pod("demo-1", false), pod("demo-2", false)];
        let backups = [
            backup("nightly", BackupPhase::Running),
            backup("old", BackupPhase::Completed),
        ];
        assert_eq!(
            next(&pods, "demo-1", &backups),
            Step::WaitForBackups(vec!["nightly".into()])
        );
        let (reason, message) = next(&pods, "demo-1", &backups).explain("demo-1");
        assert_eq!(reason, "Hibernating");
        assert!(message.contains("nightly"), "{message}");
        // Finished backups hold nothing; with no Pod left there is nothing to hold.
        assert_eq!(
            next(&pods, "demo-1", &backups[1..]),
            Step::Delete(vec!["demo-1".into()])
        );
        assert_eq!(next(&[], "demo-1", &backups), Step::Done);
    }

    #[test]
    fn the_status_keeps_the_primary_and_positions_and_says_hibernated() {
        let cluster: PostgresCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "database.example.com/v1beta1", "kind": "PostgresCluster",
            "metadata": {"name": "demo", "namespace": "ns", "generation": 4},
            "spec": {"instances": 2, "storage": {"size": "1Gi"}, "hibernate": true},
            "status": {"phase": "Ready", "currentPrimary": "demo-2", "targetPrimary": "demo-2",
                "nextSerial": 3, "readyReplicas": 2, "replicas": 2,
                "instances": [
                    {"name": "demo-1", "serial": 1, "role": "replica", "ready": true,
                     "timeline": 2, "receivedLsn": "0/5000000", "replayedLsn": "0/5000000"},
                    {"name": "demo-2", "serial": 2, "role": "primary", "ready": true,
                     "timeline": 2, "receivedLsn": "0/5000000"}]}
        }))
        .expect("cluster");
        let plan = Plan {
            serials: vec![1, 2],
            remove: vec![],
            primary: 2,
            next_serial: 3,
        };
        let now = Time(jiff::Timestamp::UNIX_EPOCH);
        let s = status(&cluster, &plan, &[], &Step::Done, now);
        assert_eq!(s.phase, Some(ClusterPhase::Hibernated));
        assert_eq!(s.current_primary.as_deref(), Some("demo-2"));
        assert_eq!(s.target_primary.as_deref(), Some("demo-2"));
        assert_eq!((s.replicas, s.ready_replicas), (0, 0));
        assert!(s.instances.iter().all(|i| i.role.is_none() && !i.ready));
        assert_eq!(s.instances[0].replayed_lsn.as_deref(), Some("0/5000000"));
        let c = |t| conditions::find_condition(&s.conditions, t).expect("condition");
        assert_eq!(c(conditions::HIBERNATED).status, conditions::TRUE);
        assert_eq!(c(conditions::HIBERNATED).reason, "Hibernated");
        assert_eq!(c(conditions::READY).status, conditions::FALSE);
        assert_eq!(c(conditions::PRIMARY_AVAILABLE).reason, "Hibernated");
        assert!(resuming_from(s.phase));
        assert!(!resuming_from(Some(ClusterPhase::Ready)));
    }
}
