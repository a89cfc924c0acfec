use super::*;
use pgop_api::instance_status::PgStatus;

fn now() -> Time {
    Time("2026-12-04T10:00:00Z".parse().expect("time"))
}

/// A Ready cluster of three on 15 asking for `wanted`, with a store when `store`, and the
/// upgrade record `upgrade` (JSON) in its status.
fn cluster(wanted: i32, store: bool, upgrade: serde_json::Value) -> PostgresCluster {
    let mut spec = serde_json::json!({
        "instances": 3, "storage": {"size": "1Gi"},
        "postgresql": {"version": wanted},
    });
    if store {
        spec["backup"] = serde_json::json!({"store": {"volume": {"claimName": "backups"}}});
    }
    let mut c: PostgresCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "database.example.com/v1beta1", "kind": "PostgresCluster",
        "metadata": {"name": "db", "namespace": "ns", "generation": 2},
        "spec": spec,
        "status": {"phase": "Ready", "currentPrimary": "db-2", "targetPrimary": "db-2",
                   "postgresVersion": 15, "majorUpgrade": upgrade,
                   "instances": [
                       {"name": "db-1", "serial": 1, "ready": true, "postgresVersion": "15.14"},
                       {"name": "db-2", "serial": 2, "ready": true, "postgresVersion": "15.14"},
                       {"name": "db-3", "serial": 3, "ready": true, "postgresVersion": "15.14"}]}
    }))
    .expect("cluster");
    c.spec = pgop_api::v1beta1::with_defaults(c.spec);
    c
}

fn record(phase: &str, mode: &str, backup: Option<&str>) -> serde_json::Value {
    serde_json::json!({"from": 15, "to": 18, "phase": phase, "mode": mode, "primary": "db-2",
                       "startedAt": "2026-12-04T09:00:00Z", "backup": backup})
}

fn pod(name: &str) -> Pod {
    let mut p = Pod::default();
    p.metadata.name = Some(name.into());
    p
}

fn backup(name: &str, phase: BackupPhase, message: Option<&str>) -> PostgresBackup {
    let mut b: PostgresBackup = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name}, "spec": {"cluster": {"name": "db"}}}))
    .expect("backup");
    b.status = Some(pgop_api::backup::PostgresBackupStatus {
        phase: Some(phase),
        error: message.map(str::to_string),
        ..Default::default()
    });
    b
}

fn input<'a>(
    cluster: &'a PostgresCluster,
    pods: &'a [Pod],
    backups: &'a [PostgresBackup],
    probe: Option<&'a Probe>,
) -> Input<'a> {
    Input {
        cluster,
        held: cluster
            .status
            .as_ref()
            .and_then(|s| s.postgres_version)
            .unwrap_or(15),
        wanted: cluster.spec.postgresql.version.unwrap_or(15),
        instances: 3,
        pods,
        backups,
        primary_probe: probe,
        now: now(),
    }
}

fn probe(role: PgRole, version_num: i32, error: Option<&str>) -> Probe {
    let mut s = PgStatus::stopped("db-2", false);
    s.role = role;
    s.running = role != PgRole::Stopped;
    s.postgres_version_num = (version_num > 0).then_some(version_num);
    s.major_upgrade_error = error.map(str::to_string);
    Probe::Status(Box::new(s))
}

const THREE: [&str; 3] = ["db-1", "db-2", "db-3"];

fn pods(names: &[&str]) -> Vec<Pod> {
    names.iter().map(|n| pod(n)).collect()
}

#[test]
fn nothing_happens_on_the_held_major() {
    let c = cluster(15, true, serde_json::Value::Null);
    let d = decide(&input(&c, &pods(&THREE), &[], None));
    assert_eq!(d, Decision::ordinary(None, 15));
    assert_eq!(condition(None, None), None);
}

#[test]
fn with_a_store_a_backup_comes_first_then_the_pods_go_primary_first_with_link() {
    let c = cluster(18, true, serde_json::Value::Null);
    let all = pods(&THREE);
    let d = decide(&input(&c, &all, &[], None));
    let r = d.record.clone().expect("started");
    assert_eq!((r.from, r.to), (15, 18));
    assert_eq!(r.phase, MajorUpgradePhase::BackingUp);
    assert_eq!(r.mode, MajorUpgradeMode::Link);
    assert_eq!(r.primary, "db-2");
    assert_eq!(r.backup.as_deref(), Some("db-upgrade-15-18-20261204100000"));
    assert_eq!(d.create_backup, r.backup);
    // The cluster serves meanwhile, on 15.
    assert_eq!(d.pass, Pass::Ordinary { major: 15 });
    let (ok, reason, message) = condition(d.record.as_ref(), None).expect("condition");
    assert!(!ok);
    assert_eq!(reason, "BackingUp");
    assert!(
        message.contains("db-upgrade-15-18-20261204100000"),
        "{message}"
    );

    // Running: wait, nothing created twice.
    let name = "db-upgrade-15-18-x";
    let c = cluster(18, true, record("BackingUp", "link", Some(name)));
    let running = [backup(name, BackupPhase::Running, None)];
    let d = decide(&input(&c, &all, &running, None));
    assert_eq!(d.create_backup, None);
    assert_eq!(d.pass, Pass::Ordinary { major: 15 });
    // Completed: the primary's Pod is deleted first.
    let done = [backup(name, BackupPhase::Completed, None)];
    let d = decide(&input(&c, &all, &done, None));
    assert_eq!(
        d.record.as_ref().map(|r| r.phase),
        Some(MajorUpgradePhase::Stopping)
    );
    assert_eq!(
        d.pass,
        Pass::Stop(hibernation::Step::Delete(vec!["db-2".into()]))
    );
    // A failover during the backup: the new primary's volume is the one upgraded, and
    // nothing stops while the primary changes.
    let mut moved = c.clone();
    if let Some(s) = moved.status.as_mut() {
        s.target_primary = Some("db-3".into());
    }
    let d = decide(&input(&moved, &all, &done, None));
    assert_eq!(
        d.record.as_ref().map(|r| r.phase),
        Some(MajorUpgradePhase::BackingUp)
    );
    assert_eq!(d.pass, Pass::Ordinary { major: 15 });
    if let Some(s) = moved.status.as_mut() {
        s.current_primary = Some("db-3".into());
    }
    let d = decide(&input(&moved, &all, &done, None));
    assert_eq!(d.record.as_ref().map(|r| r.primary.as_str()), Some("db-3"));
    assert_eq!(
        d.pass,
        Pass::Stop(hibernation::Step::Delete(vec!["db-3".into()]))
    );
}

#[test]
fn a_failed_backup_fails_the_upgrade_and_the_cluster_serves_on() {
    let name = "db-upgrade-15-18-x";
    let c = cluster(18, true, record("BackingUp", "link", Some(name)));
    let failed = [backup(name, BackupPhase::Failed, Some("the store refused"))];
    let d = decide(&input(&c, &pods(&THREE), &failed, None));
    let r = d.record.clone().expect("record");
    assert_eq!(r.phase, MajorUpgradePhase::Failed);
    assert!(
        r.message
            .as_deref()
            .is_some_and(|m| m.contains("the store refused"))
    );
    assert_eq!(d.pass, Pass::Ordinary { major: 15 });
    // Failed stays failed for that target; the next pass changes nothing.
    let mut again = c.clone();
    if let Some(s) = again.status.as_mut() {
        s.major_upgrade = d.record.clone();
    }
    let d2 = decide(&input(&again, &pods(&THREE), &failed, None));
    assert_eq!(d2, Decision::ordinary(d.record.clone(), 15));
    let (ok, reason, message) = condition(d2.record.as_ref(), None).expect("condition");
    assert!(!ok);
    assert_eq!(reason, "Failed");
    assert!(
        message.contains("set spec.postgresVersion back to 15"),
        "{message}"
    );
    // Back to 15: the failure is cleared, the condition goes.
    let mut back = again.clone();
    back.spec.postgresql.version = Some(15);
    let d3 = decide(&input(&back, &pods(&THREE), &failed, None));
    assert_eq!(d3, Decision::ordinary(None, 15));
    let mut status = again.status.clone().unwrap_or_default();
    upgrade_condition_set(&mut status, &d2);
    assert!(conditions::find_condition(&status.conditions, conditions::MAJOR_UPGRADED).is_some());
    upgrade_condition_set(&mut status, &d3);
    assert!(conditions::find_condition(&status.conditions, conditions::MAJOR_UPGRADED).is_none());
    assert_eq!(status.major_upgrade, None);
}

fn upgrade_condition_set(status: &mut PostgresClusterStatus, d: &Decision) {
    set_status(status, d, Some(2), &now());
}

#[test]
fn without_a_store_it_copies_and_stops_at_once() {
    let c = cluster(18, false, serde_json::Value::Null);
    let d = decide(&input(&c, &pods(&THREE), &[], None));
    let r = d.record.clone().expect("started");
    assert_eq!(r.phase, MajorUpgradePhase::Stopping);
    assert_eq!(r.mode, MajorUpgradeMode::Copy);
    assert_eq!(r.backup, None);
    assert_eq!(d.create_backup, None);
    assert_eq!(
        d.pass,
        Pass::Stop(hibernation::Step::Delete(vec!["db-2".into()]))
    );
}

#[test]
fn it_waits_for_a_ready_cluster_without_a_change_of_primary_or_fencing() {
    let mut c = cluster(18, false, serde_json::Value::Null);
    if let Some(s) = c.status.as_mut() {
        s.phase = Some(ClusterPhase::Degraded);
    }
    let d = decide(&input(&c, &pods(&THREE), &[], None));
    assert_eq!(d.record, None);
    assert_eq!(d.pass, Pass::Ordinary { major: 15 });
    assert!(
        d.waiting.as_deref().is_some_and(|w| w.contains("Degraded")),
        "{d:?}"
    );
    let (_, reason, _) = condition(None, d.waiting.as_deref()).expect("condition");
    assert_eq!(reason, "Waiting");

    let mut c = cluster(18, false, serde_json::Value::Null);
    if let Some(s) = c.status.as_mut() {
        s.target_primary = Some("db-1".into());
    }
    let d = decide(&input(&c, &pods(&THREE), &[], None));
    assert!(
        d.waiting
            .as_deref()
            .is_some_and(|w| w.contains("change of primary"))
    );

    let mut c = cluster(18, false, serde_json::Value::Null);
    c.spec.fenced_instances = vec!["db-3".into()];
    let d = decide(&input(&c, &pods(&THREE), &[], None));
    assert!(d.waiting.as_deref().is_some_and(|w| w.contains("db-3")));
}

#[test]
fn stopping_deletes_the_standbys_after_the_primary_then_upgrades_the_primary_alone() {
    let c = cluster(18, false, record("Stopping", "copy", None));
    let d = decide(&input(&c, &pods(&["db-1", "db-3"]), &[], None));
    assert_eq!(
        d.pass,
        Pass::Stop(hibernation::Step::Delete(vec![
            "db-1".into(),
            "db-3".into()
        ]))
    );
    let d = decide(&input(&c, &[], &[], None));
    assert_eq!(
        d.record.as_ref().map(|r| r.phase),
        Some(MajorUpgradePhase::Upgrading)
    );
    assert_eq!(d.pass, Pass::Upgrade);
}

#[test]
fn the_new_major_running_as_primary_is_recorded_and_the_standbys_clone() {
    let c = cluster(18, false, record("Upgrading", "copy", None));
    let primary = pods(&["db-2"]);
    // Not answering yet (pg_upgrade runs), or still stopped: keep upgrading.
    for p in [None, Some(probe(PgRole::Stopped, 0, None))] {
        let d = decide(&input(&c, &primary, &[], p.as_ref()));
        assert_eq!(d.pass, Pass::Upgrade);
    }
    let up = probe(PgRole::Primary, 180001, None);
    let d = decide(&input(&c, &primary, &[], Some(&up)));
    assert_eq!(
        d.record.as_ref().map(|r| r.phase),
        Some(MajorUpgradePhase::Cloning)
    );
    assert_eq!(d.pass, Pass::Ordinary { major: 18 });
}

#[test]
fn a_reported_failure_or_a_manager_that_keeps_exiting_rolls_back() {
    let c = cluster(18, false, record("Upgrading", "copy", None));
    let primary = pods(&["db-2"]);
    let refused = probe(
        PgRole::Stopped,
        0,
        Some("pg_upgrade --check failed: ... aclitem ..."),
    );
    let d = decide(&input(&c, &primary, &[], Some(&refused)));
    assert_eq!(d.pass, Pass::RollBack);
    let r = d.record.clone().expect("record");
    assert_eq!(r.phase, MajorUpgradePhase::Failed);
    assert!(r.message.as_deref().is_some_and(|m| m.contains("aclitem")));
    assert!(r.finished_at.is_some());

    let mut crashing = pod("db-2");
    crashing.status = serde_json::from_value(serde_json::json!({"containerStatuses": [
        {"name": "postgres", "image": "pgop", "imageID": "", "ready": false,
         "restartCount": MAX_RESTARTS,
         "state": {"waiting": {"reason": "CrashLoopBackOff"}},
         "lastState": {"terminated": {"exitCode": 1, "message": "PostgreSQL 18 not found"}}}]}))
    .expect("status");
    let unreachable = Probe::Unreachable("connection refused".into());
    let d = decide(&input(&c, &[crashing], &[], Some(&unreachable)));
    assert_eq!(d.pass, Pass::RollBack);
    assert!(
        d.record
            .and_then(|r| r.message)
            .is_some_and(|m| m.contains("PostgreSQL 18 not found"))
    );
    assert_eq!(cut(&"é".repeat(MAX_MESSAGE)).len(), MAX_MESSAGE + "…".len());
    // The start and the end survive: the step that failed, and the log's last lines.
    let long = format!("pg_upgrade failed\n{}\nERROR: the reason", "x".repeat(5000));
    let short = cut(&long);
    assert!(short.starts_with("pg_upgrade failed") && short.ends_with("ERROR: the reason"));
    assert!(short.len() <= MAX_MESSAGE + "…".len());
}

#[test]
fn completed_once_every_instance_is_ready_on_the_new_major_then_a_backup_of_it() {
    let mut c = cluster(
        18,
        true,
        record("Cloning", "link", Some("db-upgrade-15-18-x")),
    );
    if let Some(s) = c.status.as_mut() {
        s.postgres_version = Some(18);
        s.instances[0].postgres_version = Some("18.1".into());
        s.instances[1].postgres_version = Some("18.1".into());
    }
    let d = decide(&input(&c, &pods(&THREE), &[], None));
    assert_eq!(d.pass, Pass::Ordinary { major: 18 });
    assert_eq!(
        d.record.as_ref().map(|r| r.phase),
        Some(MajorUpgradePhase::Cloning)
    );
    if let Some(s) = c.status.as_mut() {
        s.instances[2].postgres_version = Some("18.1".into());
    }
    let d = decide(&input(&c, &pods(&THREE), &[], None));
    let r = d.record.clone().expect("record");
    assert_eq!(r.phase, MajorUpgradePhase::Completed);
    assert_eq!(r.finished_at, Some(now()));
    assert_eq!(
        d.create_backup.as_deref(),
        Some("db-upgraded-18-20261204090000")
    );
    let (ok, reason, _) = condition(d.record.as_ref(), None).expect("condition");
    assert!(ok);
    assert_eq!(reason, "Completed");
}

#[test]
fn setting_the_version_back_calls_the_upgrade_off_until_pg_upgrade_runs() {
    for phase in ["BackingUp", "Stopping"] {
        let c = cluster(15, true, record(phase, "link", Some("b")));
        let d = decide(&input(&c, &pods(&THREE), &[], None));
        let r = d.record.clone().expect("record");
        assert_eq!(r.phase, MajorUpgradePhase::Failed, "{phase}");
        assert!(
            r.message
                .as_deref()
                .is_some_and(|m| m.contains("called off"))
        );
        assert_eq!(d.pass, Pass::Ordinary { major: 15 });
    }
    // Past that point the upgrade goes on (the webhook refuses the change).
    let c = cluster(15, false, record("Upgrading", "copy", None));
    let d = decide(&input(&c, &[], &[], None));
    assert_eq!(d.pass, Pass::Upgrade);
    // A failed upgrade's target asked for again after going back: a new attempt.
    let mut c = cluster(18, false, record("Failed", "copy", None));
    if let Some(s) = c.status.as_mut() {
        s.major_upgrade = None;
    }
    let d = decide(&input(&c, &pods(&THREE), &[], None));
    assert_eq!(
        d.record.as_ref().map(|r| r.phase),
        Some(MajorUpgradePhase::Stopping)
    );
}

#[test]
fn the_status_while_down_says_upgrading_and_events_follow_the_reason() {
    let c = cluster(18, false, record("Stopping", "copy", None));
    let d = decide(&input(&c, &pods(&["db-1"]), &[], None));
    let s = status_while_down(&c, &pods(&["db-1"]), &d, &now());
    assert_eq!(s.phase, Some(ClusterPhase::Upgrading));
    assert_eq!(s.ready_replicas, 0);
    assert!(s.instances.iter().all(|i| !i.ready && i.role.is_none()));
    let find = |t| conditions::find_condition(&s.conditions, t).expect("condition");
    assert_eq!(find(conditions::MAJOR_UPGRADED).reason, "Stopping");
    assert_eq!(find(conditions::READY).reason, "Upgrading");
    let (kind, reason, _) = event(c.status.as_ref(), &s).expect("an event");
    assert_eq!(kind, EventType::Normal);
    assert_eq!(reason, "MajorUpgradeStopping");
    assert_eq!(event(Some(&s), &s), None);
}
