//! RBAC proven minimal: every rule of the operator's published ClusterRole
//! (deploy/operator/rbac.yaml), and every verb in it, is needed. Each case installs the
//! ClusterRole less one verb (or one whole rule) for a ServiceAccount of its own, runs the
//! operator impersonating it on a scenario that exercises the verb, and shows that
//!
//! 1. the API server refuses a request of the operator (a 403, seen by a layer of the
//!    operator's client: a positive signal, not only a timeout), and
//! 2. a step of the scenario then does not happen within a bounded time, while it does
//!    happen with the whole ClusterRole (the scenario's control case).
//!
//! A verb no scenario here can reach would be listed in [`NOT_PROVEN_HERE`] with the
//! reason and where it is exercised (none is, at present: the scenarios that need an
//! instance manager answer its status probes and its mutual-TLS port in the test);
//! `every_verb_has_a_case_or_a_reason` checks that the table and that list cover the
//! published ClusterRole exactly. All cases share one
//! control plane, one namespace and one operator each, a few at a time.
//!
//! The table in [`cases`] doubles as documentation (docs/security.md summarises it).
//!
//! Why this file stays whole: it is one proof, that each verb of the published ClusterRole
//! is needed: the table in `cases` and the one harness that runs every case (`bind`,
//! `drive`, `happened`, `check`), with the stand-ins for instance managers (`serve_status`,
//! `serve_backups`) that only those scenarios use.

use crate::common;

use common::*;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::{
    PersistentVolume, PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use pgop_api::PostgresCluster;
use pgop_api::backup::PostgresBackup;
use pgop_testenv::{ControlPlane, TestNamespace};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

const RBAC: &str = include_str!("../../../../deploy/operator/rbac.yaml");

/// The cluster every scenario creates.
const DB: &str = "db";
/// How long a step may take with the whole ClusterRole.
const STEP_TIMEOUT: Duration = Duration::from_secs(45);
/// How long the first scheduled backup may take: the first firing of `* * * * *` after
/// the cluster's creation is up to a minute away.
const SCHEDULE_TIMEOUT: Duration = Duration::from_secs(100);

/// How long a step of `scenario` may take with the whole ClusterRole (and how long its
/// refusal is waited for without the verb).
fn step_timeout(scenario: Scenario) -> Duration {
    match scenario {
        Scenario::Schedule => SCHEDULE_TIMEOUT,
        _ => STEP_TIMEOUT,
    }
}
/// How long after the refusal a step that must not happen is watched for.
const NEVER: Duration = Duration::from_secs(8);
/// Cases run at the same time (2 cores, shared).
const PARALLEL: usize = 12;

const CORE: &str = "";
const DB_GROUP: &str = "database.example.com";

/// What a case runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scenario {
    /// A one-instance cluster created once the operator has listed what it watches, with
    /// leader election on: every child, the status, the `Created` Event, the Lease.
    Create,
    /// A one-instance cluster whose `switchover-to` annotation names no instance, twice:
    /// the operator refuses the request and removes the annotation each time, and the
    /// second identical `SwitchoverRefused` Event is a series (patched).
    Switchover,
    /// A one-instance cluster whose NetworkPolicy is then turned off: it is deleted.
    PolicyOff,
    /// A one-instance cluster with the pooler `p` (`spec.poolers`), which is then removed:
    /// its Deployment and Service are deleted.
    PoolerOff,
    /// A one-instance cluster with `credentials.superuserAccess`, then without: the
    /// `-superuser` Secret is deleted.
    SuperuserOff,
    /// A one-instance cluster whose Pod someone relabels (`app.kubernetes.io/name`): the
    /// operator puts the label back.
    PodRelabelled,
    /// A PostgresBackup of a cluster that does not exist: the backup controller marks it
    /// Failed, with an Event.
    Backup,
    /// A two-instance cluster whose standby's claim is bound to a PersistentVolume pinned
    /// to a node that does not exist: the operator reads Nodes and the volume, and removes
    /// the instance (Pod and claim) with a `VolumeLost` Event.
    LostVolume,
    /// A one-instance cluster with a volume backup store and the schedule `* * * * *`,
    /// whose Pod the driver marks Ready (playing kubelet): once the cluster is Ready the
    /// first firing after its creation (within a minute) is due, and the operator creates
    /// the scheduled PostgresBackup.
    Schedule,
    /// A cluster restored from a completed PostgresBackup (`spec.bootstrap.recovery.backup`)
    /// of a cluster with a store: the operator reads the backup and records the recovery
    /// source in the status.
    Recover,
    /// A two-instance cluster whose Pods the driver binds to a Node it creates and marks
    /// Ready with an address on the loopback, where it answers the operator's status
    /// probes as the managers would: `db-1` the primary, `db-2` a streaming standby. The
    /// operator creates the primary's budget (a switchover could move the primary); then
    /// `db-2` reports that it no longer streams, no switchover could, and the operator
    /// deletes the budget.
    PrimaryBudget,
    /// A one-instance cluster with a volume backup store, its Pod placed and probed as in
    /// PrimaryBudget, and its manager's mutual-TLS port played by the test (with the
    /// certificate the operator issued for it): the backup `old` completes (backup id
    /// `B1`), then `new`; the retention after `new` answers that `B1` was removed from the
    /// store, and the operator deletes the PostgresBackup `old`.
    Retention,
    /// A one-instance cluster, then a PostgresBackup of it whose ownerReference names it in
    /// `v1alpha1`, as a scheduled backup made before `v1beta1` does: the backup controller
    /// renames the reference to `v1beta1`.
    OldOwner,
}

/// A step of a scenario that the operator takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// The child of kind K named `db<suffix>` exists.
    Child(Kind, &'static str),
    /// `status.phase` is written.
    Status,
    /// An Event with this reason is about the cluster (or the backup).
    Event(&'static str),
    /// The Event with this reason is a series (published again, patched).
    EventSeries(&'static str),
    /// The second `switchover-to` annotation was removed.
    AnnotationRemoved,
    /// The NetworkPolicy was deleted after `spec.networkPolicy.enabled: false`.
    PolicyGone,
    /// The pooler's Deployment and Service were deleted after it left `spec.poolers`.
    PoolerGone,
    /// The `-superuser` Secret was deleted after `superuserAccess: false`.
    SuperuserSecretGone,
    /// `db-1`, relabelled by the driver (its annotation says so), has its label back.
    PodLabelRepaired,
    /// The PostgresBackup's status says Failed.
    BackupFailed,
    /// The lost instance's Pod was deleted.
    PodGone,
    /// The lost instance's claim was deleted (or is being deleted).
    ClaimGone,
    /// A PostgresBackup annotated as scheduled, of the cluster, exists.
    ScheduledBackup,
    /// `status.recoverySource` is written.
    RecoverySource,
    /// The primary's budget existed, the standby then stopped streaming, and the budget
    /// was deleted (or is being deleted).
    PrimaryBudgetGone,
    /// The backup `new` completed and the backup `old`, which retention removed from the
    /// store, was deleted (or is being deleted).
    OldBackupGone,
    /// The backup [`OLD_OWNER_BACKUP`]'s reference to its cluster names `v1beta1`.
    OwnerRenamed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    ServiceAccount,
    Role,
    RoleBinding,
    Secret,
    Service,
    PodDisruptionBudget,
    Claim,
    Pod,
    NetworkPolicy,
    Deployment,
}

/// One case: the ClusterRole less `verb` (every verb when `None`) of `resource` in
/// `group`; the scenario; the request the API server then refuses (`verb resource`, as
/// [`Recorded`] names requests); the step that then never happens (`None`: the refused
/// request is the whole effect, see its note).
struct Case {
    group: &'static str,
    resource: &'static str,
    verb: Option<&'static str>,
    scenario: Scenario,
    refused: &'static str,
    never: Option<Step>,
}

const fn case(
    group: &'static str,
    resource: &'static str,
    verb: &'static str,
    scenario: Scenario,
    refused: &'static str,
    never: Option<Step>,
) -> Case {
    Case {
        group,
        resource,
        verb: Some(verb),
        scenario,
        refused,
        never,
    }
}

/// The table: each verb of the ClusterRole, what breaks without it.
#[rustfmt::skip]
fn cases() -> Vec<Case> {
    use Kind::*;
    use Scenario::*;
    use Step::*;
    // A verb the instance Role grants: without it the operator may not grant it
    // (RBAC escalation prevention), so the instance Role is never written.
    let escalation = Some(Child(Role, ""));
    vec![
        // postgresclusters: the controller's list and watch; get is granted to the instance
        // Role (and read for a backup's cluster); patch removes the switchover annotation.
        case(DB_GROUP, "postgresclusters", "list", Create, "list postgresclusters.database.example.com", Some(Status)),
        // The cluster is created after the first list: only the watch would bring it.
        case(DB_GROUP, "postgresclusters", "watch", Create, "watch postgresclusters.database.example.com", Some(Status)),
        case(DB_GROUP, "postgresclusters", "get", Create, "patch roles.rbac.authorization.k8s.io", escalation),
        case(DB_GROUP, "postgresclusters", "patch", Switchover, "patch postgresclusters.database.example.com", Some(AnnotationRemoved)),
        // postgresbackups: the backup controller's list and watch.
        case(DB_GROUP, "postgresbackups", "list", Backup, "list postgresbackups.database.example.com", Some(BackupFailed)),
        case(DB_GROUP, "postgresbackups", "watch", Backup, "watch postgresbackups.database.example.com", Some(BackupFailed)),
        // Status subresources.
        case(DB_GROUP, "postgresclusters/status", "patch", Create, "patch postgresclusters.database.example.com/status", Some(Status)),
        case(DB_GROUP, "postgresbackups/status", "patch", Backup, "patch postgresbackups.database.example.com/status", Some(BackupFailed)),
        // Pods: listed (the watch cache's list, and a pass's own when the cache may be
        // behind: nothing is applied without it), watched (a refused watch only: the
        // cache re-lists on each retry, so passes still see changes, later), created,
        // patched (labels repaired, the role label moved), deleted with a lost volume, and get is
        // granted to the instance Role.
        case(CORE, "pods", "list", Create, "list pods", Some(Child(Pod, "-1"))),
        case(CORE, "pods", "watch", Create, "watch pods", None),
        case(CORE, "pods", "create", Create, "create pods", Some(Child(Pod, "-1"))),
        case(CORE, "pods", "patch", PodRelabelled, "patch pods", Some(PodLabelRepaired)),
        case(CORE, "pods", "get", Create, "patch roles.rbac.authorization.k8s.io", escalation),
        case(CORE, "pods", "delete", LostVolume, "delete pods", Some(PodGone)),
        case(CORE, "persistentvolumeclaims", "list", Create, "list persistentvolumeclaims", Some(Child(Claim, "-1"))),
        case(CORE, "persistentvolumeclaims", "watch", Create, "watch persistentvolumeclaims", None),
        case(CORE, "persistentvolumeclaims", "create", Create, "patch persistentvolumeclaims", Some(Child(Claim, "-1"))),
        case(CORE, "persistentvolumeclaims", "patch", Create, "patch persistentvolumeclaims", Some(Child(Claim, "-1"))),
        case(CORE, "persistentvolumeclaims", "delete", LostVolume, "delete persistentvolumeclaims", Some(ClaimGone)),
        case(CORE, "secrets", "list", Create, "list secrets", Some(Child(Secret, pgop_api::constants::CA_SECRET_SUFFIX))),
        case(CORE, "secrets", "watch", Create, "watch secrets", None),
        // Secrets: generated ones (passwords, authorities) are created, certificates are
        // server-side applied (patch), and the superuser's goes when access is turned off.
        case(CORE, "secrets", "create", Create, "create secrets", Some(Child(Secret, pgop_api::constants::CA_SECRET_SUFFIX))),
        case(CORE, "secrets", "patch", Create, "patch secrets", Some(Child(Secret, pgop_api::constants::MANAGER_TLS_SECRET_SUFFIX))),
        case(CORE, "secrets", "get", Create, "patch roles.rbac.authorization.k8s.io", escalation),
        case(CORE, "secrets", "delete", SuperuserOff, "delete secrets", Some(SuperuserSecretGone)),
        case(CORE, "services", "list", Create, "list services", Some(Child(Service, "-rw"))),
        case(CORE, "services", "watch", Create, "watch services", None),
        case(CORE, "services", "create", Create, "patch services", Some(Child(Service, "-rw"))),
        case(CORE, "services", "patch", Create, "patch services", Some(Child(Service, "-rw"))),
        case(CORE, "serviceaccounts", "list", Create, "list serviceaccounts", Some(Child(ServiceAccount, ""))),
        case(CORE, "serviceaccounts", "watch", Create, "watch serviceaccounts", None),
        case(CORE, "serviceaccounts", "create", Create, "patch serviceaccounts", Some(Child(ServiceAccount, ""))),
        case(CORE, "serviceaccounts", "patch", Create, "patch serviceaccounts", Some(Child(ServiceAccount, ""))),
        case("policy", "poddisruptionbudgets", "list", Create, "list poddisruptionbudgets.policy", Some(Child(PodDisruptionBudget, ""))),
        case("policy", "poddisruptionbudgets", "watch", Create, "watch poddisruptionbudgets.policy", None),
        case("policy", "poddisruptionbudgets", "create", Create, "patch poddisruptionbudgets.policy", Some(Child(PodDisruptionBudget, ""))),
        case("policy", "poddisruptionbudgets", "patch", Create, "patch poddisruptionbudgets.policy", Some(Child(PodDisruptionBudget, ""))),
        case("networking.k8s.io", "networkpolicies", "list", Create, "list networkpolicies.networking.k8s.io", Some(Child(NetworkPolicy, ""))),
        case("networking.k8s.io", "networkpolicies", "watch", Create, "watch networkpolicies.networking.k8s.io", None),
        case("networking.k8s.io", "networkpolicies", "create", Create, "patch networkpolicies.networking.k8s.io", Some(Child(NetworkPolicy, ""))),
        case("networking.k8s.io", "networkpolicies", "patch", Create, "patch networkpolicies.networking.k8s.io", Some(Child(NetworkPolicy, ""))),
        case("networking.k8s.io", "networkpolicies", "delete", PolicyOff, "delete networkpolicies.networking.k8s.io", Some(PolicyGone)),
        // The poolers' Deployments (spec.poolers): listed and watched (the cache), applied,
        // deleted with the pooler; its Service deleted too.
        case("apps", "deployments", "list", PoolerOff, "list deployments.apps", Some(Child(Deployment, "-pooler-p"))),
        case("apps", "deployments", "watch", PoolerOff, "watch deployments.apps", None),
        case("apps", "deployments", "create", PoolerOff, "patch deployments.apps", Some(Child(Deployment, "-pooler-p"))),
        case("apps", "deployments", "patch", PoolerOff, "patch deployments.apps", Some(Child(Deployment, "-pooler-p"))),
        case("apps", "deployments", "delete", PoolerOff, "delete deployments.apps", Some(PoolerGone)),
        case(CORE, "services", "delete", PoolerOff, "delete services", Some(PoolerGone)),
        case("rbac.authorization.k8s.io", "roles", "list", Create, "list roles.rbac.authorization.k8s.io", Some(Child(Role, ""))),
        case("rbac.authorization.k8s.io", "roles", "watch", Create, "watch roles.rbac.authorization.k8s.io", None),
        case("rbac.authorization.k8s.io", "roles", "create", Create, "patch roles.rbac.authorization.k8s.io", Some(Child(Role, ""))),
        case("rbac.authorization.k8s.io", "roles", "patch", Create, "patch roles.rbac.authorization.k8s.io", Some(Child(Role, ""))),
        case("rbac.authorization.k8s.io", "rolebindings", "list", Create, "list rolebindings.rbac.authorization.k8s.io", Some(Child(RoleBinding, ""))),
        case("rbac.authorization.k8s.io", "rolebindings", "watch", Create, "watch rolebindings.rbac.authorization.k8s.io", None),
        case("rbac.authorization.k8s.io", "rolebindings", "create", Create, "patch rolebindings.rbac.authorization.k8s.io", Some(Child(RoleBinding, ""))),
        case("rbac.authorization.k8s.io", "rolebindings", "patch", Create, "patch rolebindings.rbac.authorization.k8s.io", Some(Child(RoleBinding, ""))),
        // Leases: the leader election reads, creates and renews its Lease (without them
        // the operator never leads, or loses the lead at the first renewal); list and
        // watch are held only to grant them to the instance Role.
        case("coordination.k8s.io", "leases", "get", Create, "get leases.coordination.k8s.io", Some(Status)),
        case("coordination.k8s.io", "leases", "create", Create, "create leases.coordination.k8s.io", Some(Status)),
        case("coordination.k8s.io", "leases", "update", Create, "update leases.coordination.k8s.io", escalation),
        case("coordination.k8s.io", "leases", "list", Create, "patch roles.rbac.authorization.k8s.io", escalation),
        case("coordination.k8s.io", "leases", "watch", Create, "patch roles.rbac.authorization.k8s.io", escalation),
        // Events: published (create), and an identical one again within the recorder's
        // cache is a series (patch).
        case("events.k8s.io", "events", "create", Create, "create events.events.k8s.io", Some(Event("Created"))),
        case("events.k8s.io", "events", "patch", Switchover, "patch events.events.k8s.io", Some(EventSeries("SwitchoverRefused"))),
        // Nodes: without list the watch cache never fills, every node is Unknown and the
        // node features stay off (no lost volume is acted on); a refused watch only.
        case(CORE, "nodes", "list", LostVolume, "list nodes", Some(Event("VolumeLost"))),
        case(CORE, "nodes", "watch", LostVolume, "watch nodes", None),
        case(CORE, "persistentvolumes", "get", LostVolume, "get persistentvolumes", Some(Event("VolumeLost"))),
        // postgresbackups: the scheduled backups are created; a recovery's source backup
        // is read (without it the source is never resolved and the restore never starts).
        case(DB_GROUP, "postgresbackups", "create", Schedule, "create postgresbackups.database.example.com", Some(ScheduledBackup)),
        case(DB_GROUP, "postgresbackups", "get", Recover, "get postgresbackups.database.example.com", Some(RecoverySource)),
        // The primary's budget, once no switchover could move the primary: it stays.
        case("policy", "poddisruptionbudgets", "delete", PrimaryBudget, "delete poddisruptionbudgets.policy", Some(PrimaryBudgetGone)),
        // The object of a backup retention removed from the store: it stays.
        case(DB_GROUP, "postgresbackups", "delete", Retention, "delete postgresbackups.database.example.com", Some(OldBackupGone)),
        // A backup's ownerReference naming v1alpha1: it keeps it.
        case(DB_GROUP, "postgresbackups", "patch", OldOwner, "patch postgresbackups.database.example.com", Some(OwnerRenamed)),
    ]
}

/// Verbs of the ClusterRole no scenario here reaches, with the code that uses them: none.
const NOT_PROVEN_HERE: &[(&str, &str, &str, &str)] = &[];

/// The rules of the published ClusterRole.
fn published_rules() -> Result<Vec<PolicyRule>> {
    for doc in serde_yaml::Deserializer::from_str(RBAC) {
        let value: serde_yaml::Value = serde::Deserialize::deserialize(doc)?;
        if value["kind"].as_str() == Some("ClusterRole") {
            let role: ClusterRole = serde_yaml::from_value(value)?;
            return Ok(role.rules.unwrap_or_default());
        }
    }
    Err("no ClusterRole in deploy/operator/rbac.yaml".into())
}

/// Every (group, resource, verb) the rules grant.
fn triples(rules: &[PolicyRule]) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for rule in rules {
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    out.push((group.clone(), resource.clone(), verb.clone()));
                }
            }
        }
    }
    out.sort();
    out
}

/// `rules` less `verb` (all verbs when `None`) of `resource` in `group`; an error when
/// they do not grant it.
fn without(
    rules: &[PolicyRule],
    group: &str,
    resource: &str,
    verb: Option<&str>,
) -> Result<Vec<PolicyRule>> {
    let before = triples(rules);
    let mut out = Vec::new();
    for rule in rules {
        let groups = rule.api_groups.clone().unwrap_or_default();
        let resources = rule.resources.clone().unwrap_or_default();
        if !groups.iter().any(|g| g == group) || !resources.iter().any(|r| r == resource) {
            out.push(rule.clone());
            continue;
        }
        let other_groups: Vec<String> = groups.iter().filter(|g| *g != group).cloned().collect();
        if !other_groups.is_empty() {
            out.push(PolicyRule {
                api_groups: Some(other_groups),
                ..rule.clone()
            });
        }
        let other_resources: Vec<String> = resources
            .iter()
            .filter(|r| *r != resource)
            .cloned()
            .collect();
        if !other_resources.is_empty() {
            out.push(PolicyRule {
                api_groups: Some(vec![group.to_string()]),
                resources: Some(other_resources),
                ..rule.clone()
            });
        }
        let verbs: Vec<String> = match verb {
            Some(v) => rule.verbs.iter().filter(|x| *x != v).cloned().collect(),
            None => Vec::new(),
        };
        if !verbs.is_empty() {
            out.push(PolicyRule {
                api_groups: Some(vec![group.to_string()]),
                resources: Some(vec![resource.to_string()]),
                verbs,
                ..rule.clone()
            });
        }
    }
    let after = triples(&out);
    let removed: Vec<_> = before.iter().filter(|t| !after.contains(t)).collect();
    let wanted = |t: &&(String, String, String)| {
        t.0 == group && t.1 == resource && verb.is_none_or(|v| t.2 == v)
    };
    if removed.is_empty() || !removed.iter().all(wanted) || after.iter().any(|t| wanted(&t)) {
        return Err(
            format!("{group}/{resource} {verb:?} is not granted as expected: {removed:?}").into(),
        );
    }
    Ok(out)
}

#[test]
fn every_verb_has_a_case_or_a_reason() -> Result {
    let granted = triples(&published_rules()?);
    let mut covered: Vec<(String, String, String)> = cases()
        .iter()
        .map(|c| {
            (
                c.group.to_string(),
                c.resource.to_string(),
                c.verb.unwrap_or_default().to_string(),
            )
        })
        .chain(
            NOT_PROVEN_HERE
                .iter()
                .map(|(g, r, v, _)| (g.to_string(), r.to_string(), v.to_string())),
        )
        .collect();
    covered.sort();
    let duplicates: Vec<_> = covered.windows(2).filter(|w| w[0] == w[1]).collect();
    assert!(duplicates.is_empty(), "{duplicates:?}");
    let missing: Vec<_> = granted.iter().filter(|t| !covered.contains(t)).collect();
    let extra: Vec<_> = covered.iter().filter(|t| !granted.contains(t)).collect();
    assert!(
        missing.is_empty(),
        "granted without a case or a reason: {missing:?}"
    );
    assert!(
        extra.is_empty(),
        "a case or reason for what is not granted: {extra:?}"
    );
    // Every rule (entry of `rules:`) loses at least one verb in some case.
    for rule in published_rules()? {
        let proven = triples(std::slice::from_ref(&rule))
            .iter()
            .any(|(g, r, v)| {
                cases()
                    .iter()
                    .any(|c| c.group == g && c.resource == r && c.verb == Some(v.as_str()))
            });
        assert!(proven, "no case removes a verb of {rule:?}");
    }
    for case in cases() {
        without(&published_rules()?, case.group, case.resource, case.verb)?;
    }
    Ok(())
}

/// The requests of one operator's client: each as `verb resource` (`get pods`, `watch
/// postgresclusters.database.example.com`, `patch postgresclusters.database.example.com/status`)
/// with its status code.
#[derive(Clone, Default)]
struct Recorded(Arc<Mutex<Vec<(String, u16)>>>);

impl Recorded {
    fn push(&self, request: String, code: u16) {
        if let Ok(mut all) = self.0.lock() {
            all.push((request, code));
        }
    }

    fn any(&self, f: impl Fn(&str, u16) -> bool) -> bool {
        self.0
            .lock()
            .map(|all| all.iter().any(|(r, c)| f(r, *c)))
            .unwrap_or(false)
    }

    fn refused(&self, request: &str) -> bool {
        self.any(|r, c| r == request && c == 403)
    }

    fn all_refused(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .0
            .lock()
            .map(|all| {
                all.iter()
                    .filter(|(_, c)| *c == 403)
                    .map(|(r, _)| r.clone())
                    .collect()
            })
            .unwrap_or_default();
        out.sort();
        out.dedup();
        out
    }
}

/// `verb resource[.group][/subresource]` of a request, as RBAC sees it.
fn describe(method: &http::Method, uri: &http::Uri) -> String {
    let parts: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    let (group, rest) = match parts.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => ("?", &parts[..]),
    };
    let rest = match rest {
        ["namespaces", _ns, rest @ ..] if !rest.is_empty() => rest,
        other => other,
    };
    let (resource, name, sub) = match rest {
        [resource] => (*resource, None, None),
        [resource, name] => (*resource, Some(*name), None),
        [resource, name, sub, ..] => (*resource, Some(*name), Some(*sub)),
        [] => ("?", None, None),
    };
    let watch = uri
        .query()
        .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
    let verb = match (method.as_str(), name) {
        ("GET", _) if watch => "watch",
        ("GET", Some(_)) => "get",
        ("GET", None) => "list",
        ("POST", _) => "create",
        ("PATCH", _) => "patch",
        ("PUT", _) => "update",
        ("DELETE", Some(_)) => "delete",
        ("DELETE", None) => "deletecollection",
        (other, _) => other,
    };
    let mut out = format!("{verb} {resource}");
    if !group.is_empty() {
        out.push('.');
        out.push_str(group);
    }
    if let Some(sub) = sub {
        out.push('/');
        out.push_str(sub);
    }
    out
}

/// A client layer that records every request's description and status.
struct Recording<S> {
    inner: S,
    recorded: Recorded,
}

impl<S, B> tower::Service<http::Request<kube::client::Body>> for Recording<S>
where
    S: tower::Service<http::Request<kube::client::Body>, Response = http::Response<B>>,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<kube::client::Body>) -> Self::Future {
        let what = describe(request.method(), request.uri());
        let recorded = self.recorded.clone();
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            recorded.push(what, response.status().as_u16());
            Ok(response)
        })
    }
}

/// A client impersonating `user`, recording its requests.
fn recording_client(plane: &ControlPlane, user: String) -> Result<(Client, Recorded)> {
    let mut config = plane.config().clone();
    config.auth_info.impersonate = Some(user);
    let recorded = Recorded::default();
    let layer_recorded = recorded.clone();
    let client = kube::client::ClientBuilder::try_from(config)?
        .with_layer(&tower::layer::layer_fn(move |inner| Recording {
            inner,
            recorded: layer_recorded.clone(),
        }))
        .build();
    Ok((client, recorded))
}

/// The ServiceAccount `pgop-operator` in `ns`, bound to a ClusterRole of `rules`; the
/// cluster-scoped objects are named after `ns` and removed by [`unbind`].
async fn bind(admin: &Client, ns: &str, rules: Vec<PolicyRule>) -> Result {
    let sa: ServiceAccount = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "pgop-operator", "namespace": ns}
    }))?;
    Api::<ServiceAccount>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &sa)
        .await?;
    let name = format!("pgop-minimal-{ns}");
    let role = ClusterRole {
        metadata: kube::api::ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        },
        rules: Some(rules),
        ..Default::default()
    };
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &role)
        .await?;
    let binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": "pgop-operator", "namespace": ns}]
    }))?;
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await?;
    // The API server authorizes from a cache of the RBAC objects: wait until it grants
    // the first of these verbs, so that the operator's first requests are not refused
    // only because the binding is brand new.
    let (group, resource, verb) = triples(role.rules.as_deref().unwrap_or_default())
        .into_iter()
        .next()
        .ok_or("no rules")?;
    let (resource, subresource) = match resource.split_once('/') {
        Some((r, s)) => (r.to_string(), Some(s.to_string())),
        None => (resource, None),
    };
    let review: SubjectAccessReview = serde_json::from_value(serde_json::json!({
        "spec": {
            "user": format!("system:serviceaccount:{ns}:pgop-operator"),
            "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{ns}"), "system:authenticated"],
            "resourceAttributes": {
                "namespace": ns, "group": group, "resource": resource,
                "subresource": subresource, "verb": verb
            }
        }
    }))?;
    let reviews: Api<SubjectAccessReview> = Api::all(admin.clone());
    let granted = within(Duration::from_secs(20), || async {
        reviews
            .create(&PostParams::default(), &review)
            .await
            .is_ok_and(|r| r.status.is_some_and(|s| s.allowed))
    })
    .await;
    if !granted {
        return Err(format!("{verb} {group}/{resource} never granted to the new binding").into());
    }
    Ok(())
}

async fn unbind(admin: &Client, ns: &str) {
    let name = format!("pgop-minimal-{ns}");
    let _ = Api::<ClusterRoleBinding>::all(admin.clone())
        .delete(&name, &DeleteParams::default())
        .await;
    let _ = Api::<ClusterRole>::all(admin.clone())
        .delete(&name, &DeleteParams::default())
        .await;
}

/// Whether `step` has happened in `ns`.
async fn happened(admin: &Client, ns: &str, step: Step) -> bool {
    async fn exists<K>(admin: &Client, ns: &str, name: &str) -> bool
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        matches!(
            Api::<K>::namespaced(admin.clone(), ns).get_opt(name).await,
            Ok(Some(_))
        )
    }
    async fn gone<K>(admin: &Client, ns: &str, name: &str) -> bool
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        match Api::<K>::namespaced(admin.clone(), ns).get_opt(name).await {
            Ok(None) => true,
            Ok(Some(o)) => o.meta().deletion_timestamp.is_some(),
            Err(_) => false,
        }
    }
    let events = || async {
        Api::<Event>::namespaced(admin.clone(), ns)
            .list(&Default::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
    };
    match step {
        Step::Child(kind, suffix) => {
            let name = format!("{DB}{suffix}");
            match kind {
                Kind::ServiceAccount => exists::<ServiceAccount>(admin, ns, &name).await,
                Kind::Role => exists::<Role>(admin, ns, &name).await,
                Kind::RoleBinding => exists::<RoleBinding>(admin, ns, &name).await,
                Kind::Secret => exists::<Secret>(admin, ns, &name).await,
                Kind::Service => exists::<Service>(admin, ns, &name).await,
                Kind::PodDisruptionBudget => exists::<PodDisruptionBudget>(admin, ns, &name).await,
                Kind::Claim => exists::<PersistentVolumeClaim>(admin, ns, &name).await,
                Kind::Pod => exists::<Pod>(admin, ns, &name).await,
                Kind::NetworkPolicy => exists::<NetworkPolicy>(admin, ns, &name).await,
                Kind::Deployment => exists::<Deployment>(admin, ns, &name).await,
            }
        }
        Step::ScheduledBackup => Api::<PostgresBackup>::namespaced(admin.clone(), ns)
            .list(&Default::default())
            .await
            .is_ok_and(|l| {
                l.items.iter().any(|b| {
                    b.spec.cluster.name == DB
                        && b.annotations()
                            .contains_key(pgop_api::constants::ANNOTATION_SCHEDULED)
                })
            }),
        Step::PrimaryBudgetGone => {
            get(admin, ns, DB)
                .await
                .is_ok_and(|c| c.annotations().contains_key(STANDBY_STOPPED))
                && gone::<PodDisruptionBudget>(admin, ns, "db-primary").await
        }
        Step::OldBackupGone => {
            Api::<PostgresBackup>::namespaced(admin.clone(), ns)
                .get_opt(NEW_BACKUP)
                .await
                .ok()
                .flatten()
                .and_then(|b| b.status?.phase)
                == Some(pgop_api::backup::BackupPhase::Completed)
                && gone::<PostgresBackup>(admin, ns, OLD_BACKUP).await
        }
        Step::RecoverySource => get(admin, ns, DB)
            .await
            .is_ok_and(|c| c.status.is_some_and(|s| s.recovery_source.is_some())),
        Step::Status => get(admin, ns, DB).await.is_ok_and(|c| phase(&c).is_some()),
        Step::Event(reason) => events()
            .await
            .iter()
            .any(|e| e.reason.as_deref() == Some(reason)),
        Step::EventSeries(reason) => events()
            .await
            .iter()
            .any(|e| e.reason.as_deref() == Some(reason) && e.series.is_some()),
        Step::AnnotationRemoved => {
            // The second request has been made (the driver counts it in an annotation of
            // its own) and removed.
            get(admin, ns, DB).await.is_ok_and(|c| {
                let a = c.annotations();
                a.get(ASKED).map(String::as_str) == Some("2")
                    && !a.contains_key(pgop_api::constants::ANNOTATION_SWITCHOVER_TO)
            })
        }
        Step::PolicyGone => {
            get(admin, ns, DB)
                .await
                .is_ok_and(|c| !c.spec.network_policy.enabled)
                && gone::<NetworkPolicy>(admin, ns, DB).await
        }
        Step::PoolerGone => {
            let name = format!("{DB}-pooler-p");
            get(admin, ns, DB)
                .await
                .is_ok_and(|c| c.spec.poolers.is_empty())
                && gone::<Deployment>(admin, ns, &name).await
                && gone::<Service>(admin, ns, &name).await
        }
        Step::SuperuserSecretGone => {
            get(admin, ns, DB)
                .await
                .is_ok_and(|c| !c.spec.credentials.superuser_access)
                && gone::<Secret>(admin, ns, "db-superuser").await
        }
        Step::PodLabelRepaired => Api::<Pod>::namespaced(admin.clone(), ns)
            .get_opt("db-1")
            .await
            .ok()
            .flatten()
            .is_some_and(|p| {
                p.annotations().contains_key(RELABELLED)
                    && p.labels().get(pgop_api::labels::NAME).map(String::as_str)
                        == Some(pgop_api::labels::NAME_VALUE)
            }),
        Step::BackupFailed => Api::<PostgresBackup>::namespaced(admin.clone(), ns)
            .get_opt(BACKUP)
            .await
            .ok()
            .flatten()
            .and_then(|b| b.status)
            .and_then(|s| s.phase)
            .is_some_and(|p| p == pgop_api::backup::BackupPhase::Failed),
        Step::OwnerRenamed => Api::<PostgresBackup>::namespaced(admin.clone(), ns)
            .get_opt(OLD_OWNER_BACKUP)
            .await
            .ok()
            .flatten()
            .is_some_and(|b| {
                b.owner_references().iter().any(|o| {
                    o.kind == "PostgresCluster"
                        && o.api_version == pgop_api::constants::CLUSTER_OWNER_API_VERSION
                })
            }),
        Step::PodGone => lost_marked(admin, ns).await && gone::<Pod>(admin, ns, LOST).await,
        Step::ClaimGone => {
            lost_marked(admin, ns).await && gone::<PersistentVolumeClaim>(admin, ns, LOST).await
        }
    }
}

/// The annotation the PodRelabelled driver marks the Pod it relabelled with.
const RELABELLED: &str = "test.pgop/relabelled";
/// The annotation a driver counts its switchover requests in.
const ASKED: &str = "test.pgop/switchover-requests";
const BACKUP: &str = "orphan";
/// The OldOwner scenario's backup.
const OLD_OWNER_BACKUP: &str = "made-before-v1beta1";
/// The cluster a restored cluster's source backup is of, and that backup.
const SOURCE: &str = "src";
const SOURCE_BACKUP: &str = "src-1";
/// The annotation the PrimaryBudget driver sets once the primary's budget exists and its
/// standby has stopped streaming.
const STANDBY_STOPPED: &str = "test.pgop/standby-stopped";

/// The loopback network of the next PrimaryBudget run (`127.88.<n>.0/24`): each run
/// answers probes on addresses of its own.
static PROBE_NET: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(1);

/// Answers `GET /pg/status` on `ip:8000` (the manager port the operator probes) as
/// instance `name` would: the primary, or a standby streaming while `streaming` holds.
async fn serve_status(
    ip: String,
    name: &'static str,
    primary: bool,
    streaming: Arc<std::sync::atomic::AtomicBool>,
) -> Result<tokio::task::JoinHandle<()>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener =
        tokio::net::TcpListener::bind((ip.as_str(), pgop_api::constants::MANAGER_PORT)).await?;
    Ok(tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut request = [0u8; 4096];
            let _ = stream.read(&mut request).await;
            let status = if primary {
                serde_json::json!({"instance": name, "role": "primary", "running": true,
                    "timeline": 1, "currentLsn": "0/3000060"})
            } else {
                let on = streaming.load(std::sync::atomic::Ordering::SeqCst);
                serde_json::json!({"instance": name, "role": "replica", "running": true,
                    "inRecovery": true, "timeline": 1, "streaming": on,
                    "receivedLsn": "0/3000060", "replayedLsn": "0/3000060"})
            };
            let body = status.to_string();
            let answer = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(answer.as_bytes()).await;
            let _ = stream.shutdown().await;
        }
    }))
}

/// The backups of the Retention scenario: retention after `new` removes `old`'s data.
const OLD_BACKUP: &str = "old";
const NEW_BACKUP: &str = "new";

/// One HTTP/1.1 request read from `stream`: its head and body (by Content-Length).
async fn read_request<S: tokio::io::AsyncRead + Unpin>(stream: &mut S) -> (String, Vec<u8>) {
    use tokio::io::AsyncReadExt;
    let mut raw = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&raw[..end]).to_string();
            let length = head
                .lines()
                .filter_map(|l| l.split_once(':'))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
                .and_then(|(_, v)| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if raw.len() >= end + 4 + length {
                return (head, raw[end + 4..end + 4 + length].to_vec());
            }
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return (String::from_utf8_lossy(&raw).to_string(), Vec::new()),
            Ok(n) => raw.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Plays the manager's mutual-TLS port on `ip` with the cluster's manager certificate:
/// every backup completes at once (`old` as `B1`, any other as `B2`); retention answers
/// that `B1` was removed once `new` has been taken.
async fn serve_backups(
    ip: String,
    config: Arc<rustls::ServerConfig>,
) -> Result<tokio::task::JoinHandle<()>> {
    use tokio::io::AsyncWriteExt;
    let listener =
        tokio::net::TcpListener::bind((ip.as_str(), pgop_api::constants::MANAGER_TLS_PORT)).await?;
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let new_taken = Arc::new(std::sync::atomic::AtomicBool::new(false));
    Ok(tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let Ok(mut stream) = acceptor.accept(tcp).await else {
                continue;
            };
            let (head, body) = read_request(&mut stream).await;
            let answer = if head
                .starts_with(&format!("POST {} ", pgop_api::constants::PATH_BACKUPS))
            {
                let name = serde_json::from_slice::<serde_json::Value>(&body)
                    .ok()
                    .and_then(|v| v["name"].as_str().map(str::to_string))
                    .unwrap_or_default();
                if name == NEW_BACKUP {
                    new_taken.store(true, std::sync::atomic::Ordering::SeqCst);
                }
                let id = if name == OLD_BACKUP { "B1" } else { "B2" };
                serde_json::json!({"name": name, "phase": "completed",
                    "startedAt": "2026-01-01T00:00:00Z", "backupId": id})
            } else if head.starts_with(&format!("POST {} ", pgop_api::constants::PATH_RETENTION)) {
                let removed: Vec<&str> = if new_taken.load(std::sync::atomic::Ordering::SeqCst) {
                    vec!["B1"]
                } else {
                    Vec::new()
                };
                serde_json::json!({"baseBackups": removed, "logicalBackups": [], "walFiles": 0})
            } else {
                serde_json::json!({})
            };
            let body = answer.to_string();
            let response = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.shutdown().await;
        }
    }))
}

/// A Node `pdb-<ns>` for the scenarios that place Pods (removed with the case).
async fn create_node(admin: &Client, ns: &str) -> Result<String> {
    let node = format!("pdb-{ns}");
    let node_object: k8s_openapi::api::core::v1::Node =
        serde_json::from_value(serde_json::json!({"metadata": {"name": node}}))?;
    Api::<k8s_openapi::api::core::v1::Node>::all(admin.clone())
        .create(&PostParams::default(), &node_object)
        .await?;
    Ok(node)
}

/// Tasks aborted when this is dropped (a driver is dropped when its case ends).
struct AbortOnDrop(Vec<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Binds Pod `name` to `node` (as the scheduler would) and marks it Running and Ready at
/// `ip` (as the kubelet would).
async fn place(admin: &Client, ns: &str, name: &str, node: &str, ip: &str) -> Result {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    let binding = serde_json::json!({
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": name},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node}
    });
    pods.create_subresource::<_, serde_json::Value>(
        "binding",
        name,
        &PostParams::default(),
        &binding,
    )
    .await?;
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let patch = serde_json::json!({"status": {
        "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
        "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": now},
            {"type": "ContainersReady", "status": "True", "lastTransitionTime": now}
        ]
    }});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}
/// The standby whose volume is lost.
const LOST: &str = "db-2";

/// Whether the LostVolume driver has created the pinned volume (it binds the standby's
/// claim to it next), so that a Pod or claim never created does not count as deleted.
async fn lost_marked(admin: &Client, ns: &str) -> bool {
    matches!(
        Api::<PersistentVolume>::all(admin.clone())
            .get_opt(&format!("lost-{ns}"))
            .await,
        Ok(Some(_))
    )
}

/// Polls `check` every 250 ms until it holds or `timeout` passes.
async fn within<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// What the admin does in a scenario, once the operator has listed what it watches (or
/// could not). Waits are bounded; a step the operator never takes ends the driver early.
async fn drive(admin: &Client, ns: &str, scenario: Scenario) -> Result {
    let clusters: Api<PostgresCluster> = Api::namespaced(admin.clone(), ns);
    match scenario {
        Scenario::Create | Scenario::PolicyOff | Scenario::Switchover | Scenario::PodRelabelled => {
            create(admin, ns, &cluster(DB, 1)).await?;
        }
        Scenario::PoolerOff => {
            let mut c = cluster(DB, 1);
            c.spec.poolers = vec![serde_json::from_value(serde_json::json!({"name": "p"}))?];
            create(admin, ns, &c).await?;
        }
        Scenario::SuperuserOff => {
            let mut c = cluster(DB, 1);
            c.spec.credentials.superuser_access = true;
            create(admin, ns, &c).await?;
        }
        Scenario::LostVolume => {
            create(admin, ns, &cluster(DB, 2)).await?;
        }
        Scenario::PrimaryBudget => {
            create(admin, ns, &cluster(DB, 2)).await?;
        }
        Scenario::Retention => {
            let mut c = cluster(DB, 1);
            c.spec.backup = Some(serde_json::from_value(serde_json::json!({
                "retentionDays": 1,
                "store": {"volume": {"claimName": "store"}}
            }))?);
            create(admin, ns, &c).await?;
        }
        Scenario::Schedule => {
            let mut c = cluster(DB, 1);
            c.spec.backup = Some(serde_json::from_value(serde_json::json!({
                "schedule": "* * * * *",
                "store": {"volume": {"claimName": "store"}}
            }))?);
            create(admin, ns, &c).await?;
        }
        Scenario::Recover => {
            // The source backup names a cluster that does not exist yet: the backup
            // controller marks it Failed and leaves it alone from then on, so that the
            // driver's Completed below is not overwritten by a backup being taken.
            let backup: PostgresBackup = serde_json::from_value(serde_json::json!({
                "apiVersion": "database.example.com/v1alpha1",
                "kind": "PostgresBackup",
                "metadata": {"name": SOURCE_BACKUP},
                "spec": {"cluster": {"name": SOURCE}}
            }))?;
            Api::<PostgresBackup>::namespaced(admin.clone(), ns)
                .create(&PostParams::default(), &backup)
                .await?;
        }
        Scenario::OldOwner => {
            create(admin, ns, &cluster(DB, 1)).await?;
            let uid = clusters.get(DB).await?.metadata.uid.ok_or("no uid")?;
            // Owned by a cluster that exists (the garbage collector would take the backup
            // of a missing one), named in v1alpha1.
            let backup: PostgresBackup = serde_json::from_value(serde_json::json!({
                "apiVersion": "database.example.com/v1alpha1",
                "kind": "PostgresBackup",
                "metadata": {"name": OLD_OWNER_BACKUP, "ownerReferences": [{
                    "apiVersion": "database.example.com/v1alpha1", "kind": "PostgresCluster",
                    "name": DB, "uid": uid, "controller": false}]},
                "spec": {"cluster": {"name": DB}}
            }))?;
            Api::<PostgresBackup>::namespaced(admin.clone(), ns)
                .create(&PostParams::default(), &backup)
                .await?;
        }
        Scenario::Backup => {
            let backup: PostgresBackup = serde_json::from_value(serde_json::json!({
                "apiVersion": "database.example.com/v1alpha1",
                "kind": "PostgresBackup",
                "metadata": {"name": BACKUP},
                "spec": {"cluster": {"name": "does-not-exist"}}
            }))?;
            Api::<PostgresBackup>::namespaced(admin.clone(), ns)
                .create(&PostParams::default(), &backup)
                .await?;
        }
    }
    match scenario {
        Scenario::Create | Scenario::Backup | Scenario::OldOwner => {}
        Scenario::Schedule => {
            if !within(STEP_TIMEOUT, || {
                happened(admin, ns, Step::Child(Kind::Pod, "-1"))
            })
            .await
            {
                return Ok(());
            }
            make_ready(admin, ns, "db-1", true).await?;
        }
        Scenario::PrimaryBudget => {
            let net = PROBE_NET.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let streaming = Arc::new(std::sync::atomic::AtomicBool::new(true));
            let mut servers = AbortOnDrop(Vec::new());
            let node = create_node(admin, ns).await?;
            let result = async {
                for (i, name) in [(1, "db-1"), (2, "db-2")] {
                    let ip = format!("127.88.{net}.{i}");
                    servers
                        .0
                        .push(serve_status(ip.clone(), name, i == 1, streaming.clone()).await?);
                    if !within(STEP_TIMEOUT, || async {
                        matches!(
                            Api::<Pod>::namespaced(admin.clone(), ns)
                                .get_opt(name)
                                .await,
                            Ok(Some(_))
                        )
                    })
                    .await
                    {
                        return Ok(());
                    }
                    place(admin, ns, name, &node, &ip).await?;
                }
                if !within(STEP_TIMEOUT, || {
                    happened(
                        admin,
                        ns,
                        Step::Child(Kind::PodDisruptionBudget, "-primary"),
                    )
                })
                .await
                {
                    return Ok(());
                }
                streaming.store(false, std::sync::atomic::Ordering::SeqCst);
                let patch =
                    serde_json::json!({"metadata": {"annotations": {STANDBY_STOPPED: "true"}}});
                clusters
                    .patch(DB, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                // The probes are answered until the case ends (this future is dropped).
                std::future::pending::<Result>().await
            }
            .await;
            drop(servers);
            return result;
        }
        Scenario::Retention => {
            let net = PROBE_NET.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let ip = format!("127.88.{net}.1");
            let mut servers = AbortOnDrop(Vec::new());
            let node = create_node(admin, ns).await?;
            let streaming = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let backups: Api<PostgresBackup> = Api::namespaced(admin.clone(), ns);
            let completed = |name: &'static str| {
                let backups = backups.clone();
                async move {
                    backups
                        .get_opt(name)
                        .await
                        .ok()
                        .flatten()
                        .and_then(|b| b.status?.phase)
                        == Some(pgop_api::backup::BackupPhase::Completed)
                }
            };
            let result = async {
                servers
                    .0
                    .push(serve_status(ip.clone(), "db-1", true, streaming).await?);
                let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
                if !within(STEP_TIMEOUT, || async {
                    matches!(pods.get_opt("db-1").await, Ok(Some(_)))
                })
                .await
                {
                    return Ok(());
                }
                place(admin, ns, "db-1", &node, &ip).await?;
                // The certificate the operator issued for the managers (before the Pod).
                let secret = Api::<Secret>::namespaced(admin.clone(), ns)
                    .get(&format!(
                        "{DB}{}",
                        pgop_api::constants::MANAGER_TLS_SECRET_SUFFIX
                    ))
                    .await?;
                let text = |key: &str| -> Result<String> {
                    let bytes = secret
                        .data
                        .as_ref()
                        .and_then(|d| d.get(key))
                        .ok_or_else(|| format!("no {key} in the manager Secret"))?;
                    Ok(String::from_utf8(bytes.0.clone())?)
                };
                let config = pgop_tls::server_config(
                    &text("tls.crt")?,
                    &text("tls.key")?,
                    &text("ca.crt")?,
                )?;
                servers.0.push(serve_backups(ip.clone(), config).await?);
                for name in [OLD_BACKUP, NEW_BACKUP] {
                    let backup: PostgresBackup = serde_json::from_value(serde_json::json!({
                        "apiVersion": "database.example.com/v1alpha1",
                        "kind": "PostgresBackup",
                        "metadata": {"name": name},
                        "spec": {"cluster": {"name": DB}}
                    }))?;
                    backups.create(&PostParams::default(), &backup).await?;
                    if !within(STEP_TIMEOUT, || completed(name)).await {
                        return Ok(());
                    }
                }
                // The managers are played until the case ends (this future is dropped).
                std::future::pending::<Result>().await
            }
            .await;
            drop(servers);
            return result;
        }
        Scenario::Recover => {
            let backups: Api<PostgresBackup> = Api::namespaced(admin.clone(), ns);
            let failed = within(STEP_TIMEOUT, || async {
                backups
                    .get_opt(SOURCE_BACKUP)
                    .await
                    .ok()
                    .flatten()
                    .and_then(|b| b.status?.phase)
                    == Some(pgop_api::backup::BackupPhase::Failed)
            })
            .await;
            if !failed {
                return Ok(());
            }
            let status = serde_json::json!({"status": {
                "phase": "Completed", "backupId": "20260101T000000", "error": null
            }});
            backups
                .patch_status(
                    SOURCE_BACKUP,
                    &PatchParams::default(),
                    &Patch::Merge(&status),
                )
                .await?;
            let mut source = cluster(SOURCE, 1);
            source.spec.backup = Some(serde_json::from_value(serde_json::json!({
                "store": {"volume": {"claimName": "store"}}
            }))?);
            create(admin, ns, &source).await?;
            let mut restored = cluster(DB, 1);
            restored.spec.bootstrap = Some(serde_json::from_value(serde_json::json!({
                "recovery": {"backup": SOURCE_BACKUP}
            }))?);
            create(admin, ns, &restored).await?;
        }
        Scenario::Switchover => {
            for asked in ["1", "2"] {
                if !within(STEP_TIMEOUT, || happened(admin, ns, Step::Status)).await {
                    return Ok(());
                }
                let patch = serde_json::json!({"metadata": {"annotations": {
                    pgop_api::constants::ANNOTATION_SWITCHOVER_TO: "db-99",
                    ASKED: asked,
                }}});
                clusters
                    .patch(DB, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                let removed = within(STEP_TIMEOUT, || async {
                    get(admin, ns, DB).await.is_ok_and(|c| {
                        !c.annotations()
                            .contains_key(pgop_api::constants::ANNOTATION_SWITCHOVER_TO)
                    })
                })
                .await;
                if !removed {
                    return Ok(());
                }
            }
        }
        Scenario::PoolerOff => {
            if !within(STEP_TIMEOUT, || {
                happened(admin, ns, Step::Child(Kind::Deployment, "-pooler-p"))
            })
            .await
            {
                return Ok(());
            }
            let patch = serde_json::json!({"spec": {"poolers": null}});
            clusters
                .patch(DB, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        Scenario::PolicyOff => {
            if !within(STEP_TIMEOUT, || {
                happened(admin, ns, Step::Child(Kind::NetworkPolicy, ""))
            })
            .await
            {
                return Ok(());
            }
            let patch = serde_json::json!({"spec": {"networkPolicy": {"enabled": false}}});
            clusters
                .patch(DB, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        Scenario::PodRelabelled => {
            if !within(STEP_TIMEOUT, || {
                happened(admin, ns, Step::Child(Kind::Pod, "-1"))
            })
            .await
            {
                return Ok(());
            }
            let patch = serde_json::json!({"metadata": {
                "labels": {pgop_api::labels::NAME: "relabelled"},
                "annotations": {RELABELLED: "true"},
            }});
            Api::<Pod>::namespaced(admin.clone(), ns)
                .patch("db-1", &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        Scenario::SuperuserOff => {
            if !within(STEP_TIMEOUT, || {
                happened(admin, ns, Step::Child(Kind::Secret, "-superuser"))
            })
            .await
            {
                return Ok(());
            }
            let patch = serde_json::json!({"spec": {"credentials": {"superuserAccess": false}}});
            clusters
                .patch(DB, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        Scenario::LostVolume => {
            if !within(STEP_TIMEOUT, || {
                happened(admin, ns, Step::Child(Kind::Claim, "-2"))
            })
            .await
            {
                return Ok(());
            }
            // A local volume pinned to a node that does not exist, bound to the standby's
            // claim as the scheduler and the volume binder would have. Its claimRef keeps
            // the binder from giving it to a claim of a case running beside this one (a
            // run in CI saw that: this claim's volumeName was then taken, and the patch
            // below refused as a change of an immutable spec).
            let node = format!("gone-{ns}");
            let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("lost-{ns}")},
                "spec": {
                    "claimRef": {"namespace": ns, "name": LOST},
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "local": {"path": "/nowhere"},
                    "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                        {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
                    ]}]}}
                }
            }))?;
            Api::<PersistentVolume>::all(admin.clone())
                .create(&PostParams::default(), &pv)
                .await?;
            let patch = serde_json::json!({
                "metadata": {"annotations": {"volume.kubernetes.io/selected-node": node}},
                "spec": {"volumeName": format!("lost-{ns}")}
            });
            Api::<PersistentVolumeClaim>::namespaced(admin.clone(), ns)
                .patch(LOST, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
    }
    Ok(())
}

/// The steps a scenario's control case must see with the whole ClusterRole.
fn control_steps(scenario: Scenario) -> Vec<Step> {
    let mut steps: Vec<Step> = cases()
        .iter()
        .filter(|c| c.scenario == scenario)
        .filter_map(|c| c.never)
        .collect();
    steps.dedup();
    steps
}

/// The outcome of one case (or control), for the report.
struct Outcome {
    label: String,
    elapsed: Duration,
    failure: Option<String>,
}

/// Runs one case: `removed` is `None` for a scenario's control.
async fn run_case(
    plane: &'static ControlPlane,
    admin: Client,
    label: String,
    scenario: Scenario,
    rules: Vec<PolicyRule>,
    expect: Option<(&'static str, Option<Step>)>,
) -> Outcome {
    let started = Instant::now();
    let failure = match run_case_inner(plane, &admin, scenario, rules, expect).await {
        Ok(()) => None,
        Err(e) => Some(e.to_string()),
    };
    Outcome {
        label,
        elapsed: started.elapsed(),
        failure,
    }
}

async fn run_case_inner(
    plane: &'static ControlPlane,
    admin: &Client,
    scenario: Scenario,
    rules: Vec<PolicyRule>,
    expect: Option<(&'static str, Option<Step>)>,
) -> Result {
    let ns = TestNamespace::create(plane.config(), "rbac-min").await?;
    let n = ns.name().to_string();
    let n = n.as_str();
    bind(admin, n, rules).await?;
    let (client, recorded) =
        recording_client(plane, format!("system:serviceaccount:{n}:pgop-operator"))?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let operator = tokio::spawn(pgop_operator::run(
        client,
        pgop_operator::Options {
            namespaces: vec![n.to_string()],
            leader_election: Some(pgop_operator::LeaderElection::new(n, "pgop-operator-0")),
            ..pgop_operator::Options::default()
        },
        async move {
            let _ = stopped.await;
        },
    ));
    let result = async {
        // Once the operator's watches are up (or refused, or it cannot lead), the scenario
        // starts: objects created later reach it through its watches only.
        within(Duration::from_secs(20), || async {
            let up = |resource: &str| recorded.any(|r, _| r == format!("watch {resource}"));
            (up("postgresclusters.database.example.com")
                && up("postgresbackups.database.example.com"))
                || expect.is_some_and(|(refused, _)| recorded.refused(refused))
        })
        .await;
        // The admin's part runs beside the checks, which end the case.
        let driver = async {
            drive(admin, n, scenario).await?;
            std::future::pending::<Result>().await
        };
        tokio::select! {
            result = driver => result,
            result = check(admin, n, scenario, &recorded, expect) => result,
        }
    }
    .await;
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(15), operator).await;
    unbind(admin, n).await;
    if scenario == Scenario::LostVolume {
        let _ = Api::<PersistentVolume>::all(admin.clone())
            .delete(&format!("lost-{n}"), &DeleteParams::default())
            .await;
    }
    if matches!(scenario, Scenario::PrimaryBudget | Scenario::Retention) {
        let _ = Api::<k8s_openapi::api::core::v1::Node>::all(admin.clone())
            .delete(&format!("pdb-{n}"), &DeleteParams::default())
            .await;
    }
    let _ = ns.delete().await;
    result
}

/// A control sees every step of its scenario and no refusal; a case sees its refusal,
/// then not its step.
async fn check(
    admin: &Client,
    n: &str,
    scenario: Scenario,
    recorded: &Recorded,
    expect: Option<(&'static str, Option<Step>)>,
) -> Result {
    {
        match expect {
            None => {
                for step in control_steps(scenario) {
                    if !within(step_timeout(scenario), || happened(admin, n, step)).await {
                        return Err(format!(
                            "{step:?} did not happen with the whole ClusterRole; refused: {:?}",
                            recorded.all_refused()
                        )
                        .into());
                    }
                }
                let refused = recorded.all_refused();
                if !refused.is_empty() {
                    return Err(format!("refused with the whole ClusterRole: {refused:?}").into());
                }
            }
            Some((refused, step)) => {
                if !within(step_timeout(scenario), || async {
                    recorded.refused(refused)
                })
                .await
                {
                    return Err(format!(
                        "no 403 on `{refused}`; refused: {:?}",
                        recorded.all_refused()
                    )
                    .into());
                }
                if let Some(step) = step
                    && within(NEVER, || happened(admin, n, step)).await
                {
                    return Err(format!("{step:?} happened all the same").into());
                }
            }
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_verb_of_the_cluster_role_is_needed() -> Result {
    let (plane, admin, home) = setup("rbac-min-home").await?;
    let rules = published_rules()?;
    let started = Instant::now();
    // The scheduled backup's scenario waits up to a minute for its firing: its runs start
    // first, so that the others run meanwhile.
    let mut runs = Vec::new();
    for scenario in [
        Scenario::Schedule,
        Scenario::Create,
        Scenario::Switchover,
        Scenario::PolicyOff,
        Scenario::PoolerOff,
        Scenario::SuperuserOff,
        Scenario::PodRelabelled,
        Scenario::Backup,
        Scenario::LostVolume,
        Scenario::Recover,
        Scenario::PrimaryBudget,
        Scenario::Retention,
        Scenario::OldOwner,
    ] {
        runs.push(run_case(
            plane,
            admin.clone(),
            format!("control {scenario:?}"),
            scenario,
            rules.clone(),
            None,
        ));
    }
    let mut table = cases();
    table.sort_by_key(|c| c.scenario != Scenario::Schedule);
    for case in table {
        let label = format!(
            "{} {}/{} → {:?}: refused `{}`, never {:?}",
            case.verb.unwrap_or("*"),
            case.group,
            case.resource,
            case.scenario,
            case.refused,
            case.never
        );
        let less = without(&rules, case.group, case.resource, case.verb)?;
        runs.push(run_case(
            plane,
            admin.clone(),
            label,
            case.scenario,
            less,
            Some((case.refused, case.never)),
        ));
    }
    let outcomes: Vec<Outcome> = futures::stream::iter(runs)
        .buffer_unordered(PARALLEL)
        .collect()
        .await;
    let mut failures = Vec::new();
    for o in &outcomes {
        eprintln!(
            "{:>6.1}s {} {}",
            o.elapsed.as_secs_f64(),
            if o.failure.is_none() { "ok  " } else { "FAIL" },
            o.label
        );
        if let Some(f) = &o.failure {
            failures.push(format!("{}: {f}", o.label));
        }
    }
    eprintln!(
        "{} cases in {:.1}s",
        outcomes.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    home.delete().await?;
    Ok(())
}
