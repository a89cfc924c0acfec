//! Steps 5 to 11 of an ordinary pass, decided at once: from the [`World`] the pass read,
//! the volumes' size, the roles, the passwords and certificates, the rollout's next step, the children, the status and its
//! Events, the request annotations to clear, the backups due, the Lease to release, what to
//! apply and delete, and when to look again. [`crate::cluster::write::carry_out`] carries it
//! out.

use super::instances::{children, specs};
use super::serials as instances;
use super::{Requests, Rollout, RolloutInput, StatusInput, next_pass, requests, rollout, status};
use super::{credentials, nodes, roles, storage, upgrade};
use crate::backup;
use crate::cluster::build;
use crate::cluster::error::Error;
use crate::cluster::notes::Note;
use crate::cluster::pods::unschedulable_since;
use crate::cluster::world::Probe;
use crate::cluster::world::World;
use kube::ResourceExt;
use kube::runtime::events::EventType;
use pgop_api::PostgresClusterStatus;
use pgop_api::backup::{BackupMethod, PostgresBackup};
use pgop_api::cluster::ClusterPhase;
use pgop_api::constants::ANNOTATION_SWITCHOVER_TO;
use pgop_api::instance_status::{PgRole, VolumeUsage};
use std::collections::BTreeMap;
use std::time::Duration;

/// An ordinary pass, decided: what [`crate::cluster::write::carry_out`] writes, in its order.
pub(in crate::cluster) struct Ordinary {
    /// Step 6: a Warning for each Secret of the user's refused, published first.
    pub refused: Vec<Note>,
    /// Step 8: the status to write (`targetPrimary` and the reserved serials in it before
    /// anything else is written), and the Events of what changed in it.
    pub status: PostgresClusterStatus,
    pub status_notes: Vec<Note>,
    /// The request annotations acted on, and their Events.
    pub requests: Requests,
    /// Step 9: the scheduled backups due now, by name (created only if missing).
    pub scheduled: Vec<(String, BackupMethod)>,
    /// Step 10: the primary whose Lease goes if the kubelet reports its container stopped
    /// (during a failover only).
    pub release_lease: Option<String>,
    /// Step 11, first: instances whose volume was lost with its node, and that node; when
    /// there are any, they are removed and nothing else is applied in this pass.
    pub lost: Vec<(String, String)>,
    /// Step 11: the children to apply, the instances the plan removed, the Pod the
    /// rollout replaces, and the Events of the instances added and removed.
    pub children: build::Children,
    pub removed: Vec<String>,
    pub replace: Option<String>,
    pub scaled: Option<Note>,
    /// What a refused resize is checked against after the apply (the resize amend).
    pub storage: storage::Storage,
    /// When to look at the cluster again.
    pub requeue: Duration,
}

/// What steps 1 to 4 decided, which an ordinary pass goes on from.
#[derive(Clone, Copy)]
pub(in crate::cluster) struct Settled<'a> {
    /// Step 4: the planned instances (name and serial), the plan, and the serials that
    /// have a Pod or a claim now.
    pub named: &'a [(String, i32)],
    pub plan: &'a instances::Plan,
    pub existing: &'a std::collections::BTreeSet<i32>,
    /// The major the instances are built for, and the upgrade's decision.
    pub major: i32,
    pub upgrade: &'a upgrade::Decision,
}

/// Decides steps 5 to 11 of an ordinary pass from what it read and what steps 1 to 4
/// settled.
pub(in crate::cluster) fn ordinary(
    world: &World<'_>,
    settled: Settled<'_>,
) -> Result<Ordinary, Error> {
    let (cluster, observed) = (world.cluster, world.observed);
    let Settled {
        named,
        plan,
        existing,
        major,
        upgrade,
    } = settled;
    let name = cluster.name_any();
    let now = &world.now;
    let probes = &world.reads.probes;
    // The volumes' size: auto-grow when an instance reports its volume filling up.
    let mut defaulted = world.defaulted.clone();
    let usage = volume_usage(probes);
    let storage = storage::decide(
        &defaulted.spec.storage,
        defaulted.spec.wal_storage.as_ref(),
        cluster.status.as_ref().and_then(|s| s.auto_grow.as_ref()),
        &observed.pvcs,
        &usage,
        now,
    );
    defaulted.spec.storage.size = storage.size.clone();

    // Step 5: the roles.
    let initial_primary = instances::instance_name(&name, plan.primary);
    let mut roles = roles::decide(&roles::Input {
        cluster: &defaulted,
        instances: named,
        initial_primary: &initial_primary,
        pods: &observed.pods,
        probes,
        switchover_to: cluster
            .annotations()
            .get(ANNOTATION_SWITCHOVER_TO)
            .map(String::as_str),
        now: now.clone(),
    });
    // Nodes: a budget holding the primary's eviction while a switchover could move it.
    let placed = nodes::instances(named, &observed.pods, probes);
    let primary_budget = nodes::primary_budget_wanted(&placed, &roles, world.nodes);

    // Step 6: the passwords and certificates.
    let (credentials, refused) = credentials::credentials(credentials::Input {
        cluster: &name,
        namespace: world.namespace,
        spec: &world.defaulted.spec,
        instances: named,
        secrets: &observed.secrets,
        users: &world.reads.user_secrets,
        now: now.0,
    })?;

    // Step 7: one outdated instance at a time, standbys first; a drain moves the primary
    // first. It compares the Pods' spec hashes, which do not depend on the roles, and may
    // start a switchover, which does: the children are built after it, once.
    let hashes = build::pod_spec_hashes(&defaulted, &specs(named, None, major), world.settings)?;
    let rollout = rollout(
        RolloutInput {
            cluster,
            defaulted: &defaulted,
            named,
            observed,
            probes,
            placed: &placed,
            desired_hashes: &hashes,
            roles: &roles,
            nodes: world.nodes,
        },
        now,
    );
    if let Some(switchover) = rollout.switchover.clone() {
        roles.start_switchover(switchover);
    }
    // The children, built once the roles are final: only a confirmed primary carries the
    // primary role label.
    let labelled = (!roles.in_transition()).then_some(roles.current.as_str());
    let budgets = build::Budgets::new(named.len(), roles.in_transition(), primary_budget);
    let children = children(
        &defaulted,
        named,
        &credentials,
        world.settings,
        labelled,
        major,
        &budgets,
    )?;

    // Step 8: the status. Its span is the one whose trace a new targetPrimary carries to
    // the target's promotion (status.rs).
    let decided =
        tracing::info_span!(target: pgop_telemetry::TRACE_ONLY, "status").in_scope(|| {
            status(
                StatusInput {
                    cluster,
                    defaulted: &defaulted,
                    plan,
                    observed,
                    probes,
                    roles: &roles,
                    rollout: &rollout,
                    backups: world.reads.backups.as_deref(),
                    recovery: world.reads.recovery.clone(),
                    major,
                    upgrade,
                    storage: &storage,
                    usage: &usage,
                },
                now,
            )
        });
    let requests = requests(cluster, &roles, &rollout);

    // Step 9: the scheduled backups due now; only a serving cluster takes them, and not a
    // replica cluster while it follows its source (its WAL is the source's to archive).
    let following = pgop_api::replica::ReplicaSpec::follows_now(
        cluster.spec.replica.as_ref(),
        Some(&decided.status),
    );
    let serving = !following
        && matches!(
            decided.status.phase,
            Some(ClusterPhase::Ready | ClusterPhase::Degraded)
        );
    let (scheduled, next_firing) = match &world.reads.backups {
        Some(backups) if serving => due_backups(&defaulted, backups, now.0),
        _ => (Vec::new(), None),
    };

    // Step 10: during a failover, the Lease of a primary whose container is stopped.
    let release_lease = (roles.in_transition() && roles.phase == Some(ClusterPhase::FailingOver))
        .then(|| roles.current.clone());

    // Step 11: volumes lost with their node first; else the children, the instances the
    // plan removed and the Pod the rollout replaces.
    let lost: Vec<(String, String)> = world
        .reads
        .unplaced_volumes
        .iter()
        .filter(|(instance, pv)| {
            placed
                .iter()
                .find(|i| i.name == instance.as_str())
                .is_some_and(|i| nodes::lost_volume(i, &roles, pv, world.nodes))
        })
        .map(|(instance, _)| (instance.clone(), node_of_claim(world, instance)))
        .collect();
    let removed: Vec<String> = plan
        .remove
        .iter()
        .map(|s| instances::instance_name(&name, *s))
        .collect();
    let created: Vec<String> = plan
        .created(existing)
        .iter()
        .map(|s| instances::instance_name(&name, *s))
        .collect();
    let scaled = scaled(existing.is_empty(), &created, &removed, plan.serials.len());

    let timed = rollout.replace.is_some()
        || rollout.restart_instance.is_some()
        || rollout.blocked.is_some()
        || observed
            .pods
            .iter()
            .any(|p| unschedulable_since(p).is_some());
    // The failover delay runs only while a standby could take over.
    let failover_clock = !roles.primary.available
        && probes
            .values()
            .any(|p| p.status().is_some_and(|s| s.role == PgRole::Replica));
    let requeue = next_pass(
        roles.in_transition(),
        failover_clock || timed,
        [next_firing, decided.positions_due],
    );
    let Rollout { replace, .. } = rollout;
    Ok(Ordinary {
        refused,
        status: decided.status,
        status_notes: decided.notes,
        requests,
        scheduled,
        release_lease,
        lost,
        children,
        removed,
        replace,
        scaled,
        storage,
        requeue,
    })
}

/// What each instance's manager reports of its data volume.
pub(in crate::cluster) fn volume_usage(
    probes: &BTreeMap<String, Probe>,
) -> Vec<(&str, VolumeUsage)> {
    probes
        .iter()
        .filter_map(|(name, p)| Some((name.as_str(), p.status()?.volume?)))
        .collect()
}

/// The scheduled backups due at `now` (their names derive from the firing, so that a
/// second pass asks for nothing twice), and how long until either schedule fires next.
fn due_backups(
    defaulted: &pgop_api::v1beta1::PostgresCluster,
    backups: &[PostgresBackup],
    now: k8s_openapi::jiff::Timestamp,
) -> (Vec<(String, BackupMethod)>, Option<Duration>) {
    let mine: Vec<&PostgresBackup> = backups.iter().collect();
    let mut due = Vec::new();
    for method in [BackupMethod::BaseBackup, BackupMethod::Logical] {
        match backup::cluster::due_backup(defaulted, &mine, method, now) {
            Ok(Some((name, _))) => due.push((name, method)),
            Ok(None) => {}
            Err(e) => {
                // Validation rejects bad schedules; a time zone unknown here is reported.
                tracing::warn!(cluster = %defaulted.name_any(), ?method, error = %e, "no scheduled backups");
            }
        }
    }
    (due, backup::cluster::until_next_firing(defaulted, now))
}

/// The node a lost instance's claim was bound to, for the Event.
fn node_of_claim(world: &World<'_>, instance: &str) -> String {
    world
        .observed
        .pvcs
        .iter()
        .find(|c| c.name_any() == instance)
        .and_then(|c| c.annotations().get(nodes::SELECTED_NODE).cloned())
        .unwrap_or_else(|| "(unknown)".to_string())
}

/// The Event of the instances this pass creates and removes: `Created` for a new
/// cluster's first instances, else `Scaled`.
fn scaled(first: bool, created: &[String], removed: &[String], instances: usize) -> Option<Note> {
    if first && !created.is_empty() {
        let note = format!("created instances {}", created.join(", "));
        return Some(Note::new(EventType::Normal, "Created", note));
    }
    if created.is_empty() && removed.is_empty() {
        return None;
    }
    let mut parts = Vec::new();
    if !created.is_empty() {
        parts.push(format!("added {}", created.join(", ")));
    }
    if !removed.is_empty() {
        parts.push(format!("removed {}", removed.join(", ")));
    }
    let note = format!("scaled to {instances} instances: {}", parts.join("; "));
    Some(Note::new(EventType::Normal, "Scaled", note))
}
