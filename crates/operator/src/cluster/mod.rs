//! The PostgresCluster controller.
//!
//! Reconcile is a pipeline, one call per step in [`reconcile_inner`]; each step is a
//! module (or a function here) with its own error type:
//! 1. read — the cluster arrives from the watch; deletion and `spec.paused` stop here;
//! 2. validate — defaults, then the same rules as the CRD schema and CEL (`pgop_api`);
//!    an invalid spec sets phase Invalid and waits for the next change, never retries;
//! 3. [`dereference`] — the children that exist, from the watch caches ([`cache`]) or,
//!    while they may not show this cluster's last writes, one labelled LIST per kind;
//! 4. [`instances`] — plan the instance serials (pure), reserving new ones in the status;
//!    a raised major is upgraded in place by [`upgrade`], which replaces the steps below
//!    while the cluster is down for pg_upgrade; `spec.hibernate` goes on in
//!    [`hibernation`] instead of the steps below;
//! 5. [`probe`] — read every instance's `/pg/status` (in parallel, bounded), then
//!    [`roles`] — decide the primary: failover, switchover, completion (pure);
//! 6. [`credentials`], [`pki`], [`build`] — passwords and certificates, then the desired
//!    children as plain values (pure);
//! 7. [`rollout`] — the next step of a rolling update, if any (pure), or a switchover
//!    first (a drain, or a rollout that reached the primary);
//! 8. [`status`], [`decide`] — compute status, conditions, the backup facts and the Events
//!    of what changed (pure), then patch the status when it changed and publish the Events;
//!    a new `targetPrimary` is thus written before any label moves;
//! 9. schedule — create the scheduled backups due now ([`backup::cluster::due_backup`]);
//! 10. [`lease`] — during a failover, release the Lease of a primary whose container is
//!     stopped;
//! 11. [`apply`] — server-side apply what differs, create what is missing, delete the
//!     instances the plan removed and the Pod the rollout replaces.
//!
//! The pass's other reads (the instances' `/pg/status`, its PostgresBackups, PersistentVolumes
//! of lost nodes) are in [`observe`], its writes (status, annotations, Events, backups, the
//! Lease, the children) in [`write`]; this module calls them in the order above.
//!
//! A cluster runs when it or a child changes (the watches), when something else it reads
//! changes (a Secret of the user's it names, one of its PostgresBackups, the node of one
//! of its instances: [`triggers`]), when one of its instances changes significantly (the
//! [`prober`], which polls them apart from the reconciles: how a failed primary is
//! noticed), and otherwise as [`next_pass`] says: every [`RESYNC`] (5 minutes), sooner
//! while a decision waits on the clock, a scheduled backup is due or WAL positions wait
//! to be published.
//!
//! No finalizer: every child carries a controller ownerReference, so the garbage
//! collector deletes them with the cluster, and nothing outside the API server (yet)
//! needs cleaning up.

pub mod apply;
pub mod build;
pub mod cache;
pub mod credentials;
mod decide;
pub mod dereference;
pub mod hibernation;
pub mod immutable;
pub mod instances;
pub mod lease;
pub mod nodes;
mod notes;
mod observe;
pub mod pki;
pub mod pods;
pub mod probe;
pub mod prober;
pub mod roles;
pub mod rollout;
pub mod status;
pub mod storage;
pub mod triggers;
pub mod upgrade;
pub mod world;
mod write;

use crate::Context;
use decide::hibernation_event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use observe::{backups_of, probes, volume_usage};
use pgop_api::cluster::ClusterPhase;
use pgop_api::constants::{
    ANNOTATION_RESTART, ANNOTATION_RESTART_INSTANCE, ANNOTATION_SWITCHOVER_TO,
};
use pgop_api::v1beta1::PostgresCluster;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;
use write::{
    apply_children, clear_annotation, clear_switchover_request, create_upgrade_backup,
    patch_status, publish, publish_about, release_dead_primary_lease, schedule_backups,
    volumes_refused,
};

/// How often a cluster is looked at while a decision waits on the clock (see
/// [`next_pass`]).
pub const POLL: Duration = Duration::from_secs(1);
/// How often a cluster is looked at when nothing wakes it: a safety net, since the
/// watches ([`cache`], [`triggers`]) and the prober wake it on every change that matters.
pub const RESYNC: Duration = Duration::from_secs(300);
/// How often during a failover or switchover.
pub const POLL_TRANSITION: Duration = Duration::from_millis(300);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to read the cluster's children")]
    Dereference(#[from] dereference::Error),
    #[error("failed to build the cluster's children")]
    Build(#[from] build::Error),
    #[error("failed to apply the cluster's children")]
    Apply(#[from] apply::Error),
    #[error("failed to patch the cluster's status")]
    PatchStatus(#[source] kube::Error),
    #[error("failed to remove the request annotation {0}")]
    ClearAnnotation(&'static str, #[source] kube::Error),
    #[error("failed to read a PersistentVolume")]
    ReadVolume(#[source] kube::Error),
    #[error("failed to list the cluster's PostgresBackups")]
    ListBackups(#[source] kube::Error),
    #[error("failed to create a scheduled PostgresBackup")]
    ScheduleBackup(#[source] kube::Error),
    #[error("failed to generate a password")]
    GeneratePassword(#[source] getrandom::Error),
    #[error("the cluster's certificates")]
    Certificates(#[from] pki::Error),
    #[error("the cluster has no namespace")]
    NoNamespace,
}

impl Error {
    /// The variant name: a metric label and an Event reason.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Dereference(_) => "Dereference",
            Error::Build(_) => "Build",
            Error::Apply(_) => "Apply",
            Error::PatchStatus(_) => "PatchStatus",
            Error::ClearAnnotation(..) => "ClearAnnotation",
            Error::ReadVolume(_) => "ReadVolume",
            Error::ListBackups(_) => "ListBackups",
            Error::ScheduleBackup(_) => "ScheduleBackup",
            Error::GeneratePassword(_) => "GeneratePassword",
            Error::Certificates(_) => "Certificates",
            Error::NoNamespace => "NoNamespace",
        }
    }
}

fn key(cluster: &impl ResourceExt) -> String {
    format!(
        "{}/{}",
        cluster.namespace().unwrap_or_default(),
        cluster.name_any()
    )
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// Reconciles one PostgresCluster (read in `v1beta1`). See the module doc for the steps.
pub async fn reconcile(cluster: Arc<PostgresCluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    // Every line logged during the pass names the cluster (in JSON logs, as the span's
    // fields on each line).
    // The pass is a trace of its own (pgop_telemetry; a root, not under kube-runtime's
    // span): its steps are child spans, its calls to the instance managers carry its
    // context, and its log lines its trace id.
    let span = tracing::info_span!(
        parent: None,
        "reconcile",
        cluster = %cluster.name_any(),
        namespace = %cluster.namespace().unwrap_or_default(),
        trace_id = tracing::field::Empty,
    );
    pgop_telemetry::record_trace_id(&span);
    let action = reconcile_inner(&cluster, &ctx).instrument(span).await?;
    ctx.backoff.reset(&key(cluster.as_ref()));
    Ok(action)
}

/// Retries a failed reconcile after this object's own exponential backoff.
pub fn error_policy(cluster: Arc<PostgresCluster>, error: &Error, ctx: Arc<Context>) -> Action {
    let delay = ctx.backoff.next_delay(&key(cluster.as_ref()));
    tracing::warn!(
        cluster = %key(cluster.as_ref()),
        reason = error.metric_label(),
        error = %crate::error_chain(error),
        retry_in = ?delay,
        "reconcile failed"
    );
    Action::requeue(delay)
}

async fn reconcile_inner(cluster: &PostgresCluster, ctx: &Context) -> Result<Action, Error> {
    let namespace = cluster.namespace().ok_or(Error::NoNamespace)?;
    let name = cluster.name_any();

    // 1. read
    if cluster.metadata.deletion_timestamp.is_some() {
        ctx.expectations.forget(&namespace, &name);
        let mut status = cluster.status.clone().unwrap_or_default();
        status.phase = Some(ClusterPhase::Deleting);
        if patch_status(ctx, cluster, &namespace, status).await? {
            publish(
                ctx,
                cluster,
                EventType::Normal,
                "Deleting",
                "the cluster is being deleted; the garbage collector removes its children",
            )
            .await;
        }
        return Ok(Action::await_change());
    }
    if cluster.spec.paused {
        // Paused: nothing is read, written or deleted until the flag is cleared.
        return Ok(Action::await_change());
    }

    // 2. validate
    let mut defaulted = cluster.clone();
    defaulted.spec = pgop_api::v1beta1::with_defaults(cluster.spec.clone());
    if let Err(errors) =
        pgop_api::validation::validate_cluster(&pgop_api::PostgresCluster::from(defaulted.clone()))
    {
        // The rules are v1alpha1's; the fields are named as in v1beta1, the stored version.
        let message = pgop_api::v1beta1::with_field_paths(&pgop_api::validation::summary(&errors));
        let status = status::invalid(cluster, &message, now());
        if patch_status(ctx, cluster, &namespace, status).await? {
            publish(ctx, cluster, EventType::Warning, "InvalidSpec", &message).await;
        }
        return Ok(Action::await_change());
    }

    // 3. dereference
    let (observed, _) = dereference::read(
        &ctx.client,
        ctx.caches.as_ref(),
        &ctx.expectations,
        &namespace,
        &name,
    )
    .instrument(tracing::info_span!(target: pgop_telemetry::TRACE_ONLY, "read"))
    .await?;

    // The volumes are at least as large as auto-grow made them (storage.rs).
    if let Some(grown) = cluster.status.as_ref().and_then(|s| s.auto_grow.as_ref()) {
        defaulted.spec.storage.size = storage::larger(&defaulted.spec.storage.size, &grown.size);
    }
    // A spec below what the volumes already hold (the validating webhook refuses the
    // change; without it, it is caught here): volumes cannot shrink.
    if let Some(error) = immutable::storage_shrink(&defaulted.spec, &observed.pvcs) {
        let message = pgop_api::validation::summary(&[error]);
        let status = status::invalid(cluster, &message, now());
        if patch_status(ctx, cluster, &namespace, status).await? {
            publish(ctx, cluster, EventType::Warning, "InvalidSpec", &message).await;
        }
        return Ok(Action::await_change());
    }

    // A major version other than the one the data holds (the validating webhook refuses
    // the change; without it, it is caught here, before any Pod is rebuilt). A cluster
    // whose instances never ran is made with the spec's major.
    let wanted_major = defaulted
        .spec
        .postgresql
        .version
        .unwrap_or(pgop_api::cluster::DEFAULT_POSTGRES_VERSION);
    let major =
        immutable::held_major(cluster.status.as_ref(), &observed.pods).unwrap_or(wanted_major);
    if let Some(error) = immutable::major_change(&defaulted.spec, major) {
        let message = pgop_api::validation::summary(&[error]);
        let status = status::invalid(cluster, &message, now());
        if patch_status(ctx, cluster, &namespace, status).await? {
            publish(ctx, cluster, EventType::Warning, "InvalidSpec", &message).await;
        }
        return Ok(Action::await_change());
    }

    // 4. plan
    let planned = plan_instances(ctx, cluster, &defaulted, &namespace, &observed)
        .instrument(tracing::info_span!(target: pgop_telemetry::TRACE_ONLY, "plan"))
        .await?;
    let named = &planned.named;

    // A major raised: the in-place upgrade (upgrade.rs) takes the cluster down, upgrades
    // the primary's volume and clones the standbys; while it runs pg_upgrade it replaces
    // steps 5 to 11, otherwise it says which major the ordinary pass builds for.
    let upgrade = decide_upgrade(
        ctx,
        cluster,
        &defaulted,
        &namespace,
        &planned,
        &observed,
        major,
        wanted_major,
    )
    .await?;
    let major = match upgrade.pass {
        upgrade::Pass::Ordinary { major } => major,
        _ => {
            return upgrade_pass(
                ctx, cluster, &defaulted, &namespace, &planned, &observed, &upgrade,
            )
            .await;
        }
    };
    if let Some(backup) = &upgrade.create_backup {
        create_upgrade_backup(ctx, cluster, &namespace, backup, &upgrade).await?;
    }

    // spec.hibernate: the Pods go, the rest stays (hibernation.rs); a change of primary
    // under way finishes first.
    let changing_primary = cluster
        .status
        .as_ref()
        .is_some_and(|s| s.target_primary != s.current_primary);
    if defaulted.spec.hibernate && !changing_primary {
        return hibernate(
            ctx, cluster, &defaulted, &namespace, &planned, &observed, major,
        )
        .await;
    }

    // 5. probe the instances and decide the roles
    let probes = probes(ctx, cluster, &observed)
        .instrument(tracing::info_span!(target: pgop_telemetry::TRACE_ONLY, "probe"))
        .await;
    // The volumes' size: auto-grow when an instance reports its volume filling up.
    let usage = volume_usage(&probes);
    let storage = storage::decide(
        &defaulted.spec.storage,
        defaulted.spec.wal_storage.as_ref(),
        cluster.status.as_ref().and_then(|s| s.auto_grow.as_ref()),
        &observed.pvcs,
        &usage,
        &now(),
    );
    defaulted.spec.storage.size = storage.size.clone();
    let initial_primary = instances::instance_name(&name, planned.plan.primary);
    let mut roles = roles::decide(&roles::Input {
        cluster: &defaulted,
        instances: named,
        initial_primary: &initial_primary,
        pods: &observed.pods,
        probes: &probes,
        switchover_to: cluster
            .annotations()
            .get(ANNOTATION_SWITCHOVER_TO)
            .map(String::as_str),
        now: now(),
    });
    // Nodes: a budget holding the primary's eviction while a switchover could move it.
    let placed = nodes::instances(named, &observed.pods, &probes);
    let primary_budget = nodes::primary_budget_wanted(&placed, &roles, &ctx.nodes);

    // 6. build: only a confirmed primary carries the primary role label
    let credentials = credentials(ctx, cluster, &defaulted, &namespace, named, &observed)
        .instrument(tracing::info_span!(target: pgop_telemetry::TRACE_ONLY, "credentials"))
        .await?;
    let build = |roles: &roles::Roles| {
        let labelled = (!roles.in_transition()).then_some(roles.current.as_str());
        let budgets = build::Budgets::new(named.len(), roles.in_transition(), primary_budget);
        build_children(
            ctx,
            &defaulted,
            named,
            &credentials,
            labelled,
            major,
            &budgets,
        )
    };
    // 7. rollout: one outdated instance at a time, standbys first; a drain moves the
    // primary first. It compares the Pods' spec hashes, which do not depend on the roles,
    // and may start a switchover, which does: the children are built after it, once.
    let hashes = build::pod_spec_hashes(
        &defaulted,
        &instance_specs(named, None, major),
        &ctx.settings,
    )?;
    let rollout = rollout_step(
        ctx, cluster, &defaulted, named, &observed, &probes, &placed, &hashes, &roles,
    );
    if let Some(switchover) = rollout.switchover.clone() {
        roles.start_switchover(switchover);
    }
    let children = build(&roles)?;

    // 8. status first: a new targetPrimary is on record before any label moves
    let backups = backups_of(ctx, cluster, &namespace).await?;
    // One span for the step (its read, decision and writes): the trace of the pass that
    // names a new target is recorded in the status from within it (status.rs), and the
    // target's promotion is a span under it.
    let step = tracing::info_span!(target: pgop_telemetry::TRACE_ONLY, "status");
    let recovery = observe::recovery_source(ctx, &defaulted, &namespace)
        .instrument(step.clone())
        .await;
    let decided = step.in_scope(|| {
        decide::status(
            decide::StatusInput {
                cluster,
                defaulted: &defaulted,
                plan: &planned.plan,
                observed: &observed,
                probes: &probes,
                roles: &roles,
                rollout: &rollout,
                backups: backups.as_deref(),
                recovery,
                major,
                upgrade: &upgrade,
                storage: &storage,
                usage: &usage,
            },
            &now(),
        )
    });
    async {
        patch_status(ctx, cluster, &namespace, decided.status.clone()).await?;
        write::publish_notes(ctx, cluster, &decided.notes).await;
        Ok::<_, Error>(())
    }
    .instrument(step)
    .await?;
    let (status, positions_due) = (decided.status, decided.positions_due);
    if roles.clear_switchover_request {
        clear_switchover_request(ctx, cluster, &namespace).await?;
    }
    if let Some(request) = &rollout.instance_restart_request {
        clear_annotation(ctx, cluster, &namespace, ANNOTATION_RESTART_INSTANCE).await?;
        if !request.accepted.is_empty() {
            let note = format!(
                "restart of {} requested: one instance at a time, a standby in place, the \
                 primary after a switchover",
                request.accepted.join(", ")
            );
            publish(ctx, cluster, EventType::Normal, "RestartRequested", &note).await;
        }
        if !request.refused.is_empty() {
            let note = format!(
                "annotation {ANNOTATION_RESTART_INSTANCE} refused in part: {}",
                request.refused.join("; ")
            );
            publish(ctx, cluster, EventType::Warning, "RestartRefused", &note).await;
        }
    }
    let old_restart = cluster
        .status
        .as_ref()
        .and_then(|s| s.restart_instance.as_ref());
    if let Some(instance) = &rollout.restart_instance
        && old_restart != Some(instance)
    {
        let note = format!(
            "rolling restart: {instance} restarts PostgreSQL (parameters pending a restart, or a restart requested)"
        );
        let about = Some(instance.as_str());
        publish_about(
            ctx,
            cluster,
            EventType::Normal,
            "RollingRestart",
            &note,
            about,
        )
        .await;
    }

    // 9. schedule: the scheduled backups due now
    let next_firing = match &backups {
        Some(backups) => {
            schedule_backups(ctx, cluster, &defaulted, &namespace, backups, &status)
                .instrument(tracing::info_span!(target: pgop_telemetry::TRACE_ONLY, "schedule"))
                .await?
        }
        None => None,
    };

    // 10. a failover from a primary whose container the kubelet reports stopped: its
    // Lease goes now rather than after its duration (see lease.rs)
    if roles.in_transition() && roles.phase == Some(ClusterPhase::FailingOver) {
        release_dead_primary_lease(ctx, cluster, &namespace, &observed, &roles).await;
    }

    // 11. apply
    let timed = rollout.replace.is_some()
        || rollout.restart_instance.is_some()
        || rollout.blocked.is_some()
        || observed
            .pods
            .iter()
            .any(|p| status::unschedulable_since(p).is_some());
    let refused_volumes = apply_children(
        ctx,
        cluster,
        &namespace,
        &planned,
        &observed,
        &placed,
        &roles,
        &children,
        rollout.replace,
    )
    .instrument(tracing::info_span!(target: pgop_telemetry::TRACE_ONLY, "apply"))
    .await?;
    let seen = (&storage, observed.pvcs.as_slice(), usage.as_slice());
    volumes_refused(ctx, cluster, &namespace, status, &refused_volumes, seen).await?;
    // The failover delay runs only while a standby could take over.
    let failover_clock = !roles.primary.available
        && probes.values().any(|p| {
            p.status()
                .is_some_and(|s| s.role == pgop_api::instance_status::PgRole::Replica)
        });
    Ok(Action::requeue(next_pass(
        roles.in_transition(),
        failover_clock || timed,
        [next_firing, positions_due],
    )))
}

/// `spec.hibernate` in place of steps 5 to 11 (see [`hibernation`]): the children but the
/// Pods are applied as usual, the status says how far the hibernation is, and the next
/// Pods are deleted, the primary's first.
async fn hibernate(
    ctx: &Context,
    cluster: &PostgresCluster,
    defaulted: &PostgresCluster,
    namespace: &str,
    planned: &Planned,
    observed: &dereference::Observed,
    major: i32,
) -> Result<Action, Error> {
    let name = cluster.name_any();
    let primary = cluster
        .status
        .as_ref()
        .and_then(|s| s.current_primary.clone())
        .unwrap_or_else(|| instances::instance_name(&name, planned.plan.primary));
    track(ctx, cluster, observed);
    let backups = backups_of(ctx, cluster, namespace)
        .await?
        .unwrap_or_default();
    let step = hibernation::next(&observed.pods, &primary, &backups);

    let credentials =
        credentials(ctx, cluster, defaulted, namespace, &planned.named, observed).await?;
    let budgets = build::Budgets::new(planned.named.len(), false, false);
    let mut children = build_children(
        ctx,
        defaulted,
        &planned.named,
        &credentials,
        Some(&primary),
        major,
        &budgets,
    )?;
    children.pods.clear();

    let mut status = hibernation::status(cluster, &planned.plan, &observed.pods, &step, now());
    status.postgres_version = Some(major);
    let changed = hibernation_event(cluster.status.as_ref(), &status);
    patch_status(ctx, cluster, namespace, status).await?;
    if let Some((reason, message)) = changed {
        publish(ctx, cluster, EventType::Normal, &reason, &message).await;
    }

    let removed: Vec<String> = planned
        .plan
        .remove
        .iter()
        .map(|s| instances::instance_name(&name, *s))
        .collect();
    let delete = match &step {
        hibernation::Step::Delete(pods) => pods.as_slice(),
        _ => &[],
    };
    apply_and_delete(
        ctx, cluster, namespace, &children, observed, &removed, delete,
    )
    .await?;
    Ok(Action::requeue(match step {
        hibernation::Step::Done => RESYNC,
        _ => POLL,
    }))
}

/// The upgrade's decision for this pass (see [`upgrade`]): the cluster's backups are read
/// only while an upgrade is asked for or runs, the upgrading primary probed only while it
/// runs pg_upgrade.
#[allow(clippy::too_many_arguments)]
async fn decide_upgrade(
    ctx: &Context,
    cluster: &PostgresCluster,
    defaulted: &PostgresCluster,
    namespace: &str,
    planned: &Planned,
    observed: &dereference::Observed,
    held: i32,
    wanted: i32,
) -> Result<upgrade::Decision, Error> {
    use pgop_api::cluster::MajorUpgradePhase as P;
    let record = cluster
        .status
        .as_ref()
        .and_then(|s| s.major_upgrade.as_ref());
    let running = record.filter(|u| !matches!(u.phase, P::Completed | P::Failed));
    let backups = if wanted != held || running.is_some() {
        backups_of(ctx, cluster, namespace)
            .await?
            .unwrap_or_default()
    } else {
        Vec::new()
    };
    let probed = match running {
        Some(u) if u.phase == P::Upgrading => Some(probes(ctx, cluster, observed).await),
        _ => None,
    };
    let primary_probe = running.and_then(|u| probed.as_ref()?.get(&u.primary));
    Ok(upgrade::decide(&upgrade::Input {
        cluster: defaulted,
        held,
        wanted,
        instances: planned.named.len(),
        pods: &observed.pods,
        backups: &backups,
        primary_probe,
        now: now(),
    }))
}

/// The upgrade's passes that replace steps 5 to 11 (see [`upgrade`]): every Pod deleted,
/// the primary's first (`Stopping`); then only the primary's Pod, built for the new major
/// with the upgrade request (`Upgrading`); or that Pod deleted after a failure. The other
/// children are applied as usual; the status says phase Upgrading.
async fn upgrade_pass(
    ctx: &Context,
    cluster: &PostgresCluster,
    defaulted: &PostgresCluster,
    namespace: &str,
    planned: &Planned,
    observed: &dereference::Observed,
    decision: &upgrade::Decision,
) -> Result<Action, Error> {
    let Some(record) = &decision.record else {
        return Ok(Action::requeue(POLL));
    };
    track(ctx, cluster, observed);
    let credentials =
        credentials(ctx, cluster, defaulted, namespace, &planned.named, observed).await?;
    let budgets = build::Budgets::new(planned.named.len(), false, false);
    let upgrading = decision.pass == upgrade::Pass::Upgrade;
    let wanted: Vec<build::InstanceSpec> = planned
        .named
        .iter()
        .map(|(instance, _)| {
            let primary = *instance == record.primary;
            let upgraded = upgrading && primary;
            build::InstanceSpec {
                name: instance.clone(),
                primary,
                major: if upgraded { record.to } else { record.from },
                upgrade_from: upgraded.then_some((record.from, record.mode)),
            }
        })
        .collect();
    let mut children = build::children(defaulted, &wanted, &credentials, &ctx.settings, &budgets)?;
    children
        .pods
        .retain(|p| upgrading && p.name_any() == record.primary);

    let mut status = upgrade::status_while_down(cluster, &observed.pods, decision, &now());
    status.postgres_version = Some(record.from);
    let event = upgrade::event(cluster.status.as_ref(), &status);
    patch_status(ctx, cluster, namespace, status).await?;
    if let Some((kind, reason, message)) = event {
        publish(ctx, cluster, kind, &reason, &message).await;
    }

    let delete: Vec<String> = match &decision.pass {
        upgrade::Pass::Stop(hibernation::Step::Delete(pods)) => pods.clone(),
        upgrade::Pass::RollBack => vec![record.primary.clone()],
        _ => Vec::new(),
    };
    apply_and_delete(ctx, cluster, namespace, &children, observed, &[], &delete).await?;
    Ok(Action::requeue(POLL))
}

/// Tells the prober the cluster's Pods (a pass that does not probe them: hibernation, a
/// major upgrade while the cluster is down).
fn track(ctx: &Context, cluster: &PostgresCluster, observed: &dereference::Observed) {
    if let Some(prober) = &ctx.prober {
        let r = kube::runtime::reflector::ObjectRef::from_obj(cluster);
        prober.track(&r, prober::instances_of(&observed.pods));
    }
}

/// The writes of a pass that takes Pods down in place of steps 5 to 11 (hibernation, a
/// major upgrade): `children` applied (with whatever Pods they hold), the instances
/// `removed` deleted with their volumes, the Pods `delete` deleted; the writes recorded
/// for the next pass's reads.
async fn apply_and_delete(
    ctx: &Context,
    cluster: &PostgresCluster,
    namespace: &str,
    children: &build::Children,
    observed: &dereference::Observed,
    removed: &[String],
    delete: &[String],
) -> Result<(), Error> {
    let name = cluster.name_any();
    ctx.expectations.writing(namespace, &name);
    let mut outcome = apply::apply(&ctx.client, namespace, children, observed).await?;
    apply::delete_instances(&ctx.client, namespace, removed, observed, &mut outcome).await?;
    for pod in delete {
        apply::delete_pod(&ctx.client, namespace, pod, observed, &mut outcome).await?;
    }
    ctx.expectations
        .wrote(namespace, &name, std::mem::take(&mut outcome.written));
    Ok(())
}

/// Step 6's children (pure): every planned instance, the one named `labelled` carrying the
/// primary role label (none during a change of primary), each running PostgreSQL `major`.
fn build_children(
    ctx: &Context,
    defaulted: &PostgresCluster,
    named: &[(String, i32)],
    credentials: &build::Credentials,
    labelled: Option<&str>,
    major: i32,
    budgets: &build::Budgets,
) -> Result<build::Children, build::Error> {
    let wanted = instance_specs(named, labelled, major);
    build::children(defaulted, &wanted, credentials, &ctx.settings, budgets)
}

/// The instances to build, `labelled` carrying the primary's role label.
fn instance_specs(
    named: &[(String, i32)],
    labelled: Option<&str>,
    major: i32,
) -> Vec<build::InstanceSpec> {
    named
        .iter()
        .map(|(instance, _)| build::InstanceSpec {
            name: instance.clone(),
            primary: labelled == Some(instance.as_str()),
            major,
            upgrade_from: None,
        })
        .collect()
}

/// When to look at the cluster again if nothing wakes it first (a change of the cluster
/// or a child, from the watches; a significant change of an instance, from the prober):
/// - during a failover or switchover, every [`POLL_TRANSITION`];
/// - every [`POLL`] while a decision waits on the clock (`timed`): the primary is
///   unavailable and a standby answers (the failover delay runs), a rollout step is under
///   way (its health gate), an instance Pod is unschedulable (its grace);
/// - else after [`RESYNC`], or sooner at the first of `deadlines`: the next scheduled
///   backup, and when WAL positions held back from the status are due (at most
///   [`status::POSITIONS_INTERVAL`] after the last ones published).
///
/// A primary that is unavailable with no standby answering waits on no clock: nothing can
/// take over until an instance answers, and the prober wakes the cluster then.
fn next_pass(in_transition: bool, timed: bool, deadlines: [Option<Duration>; 2]) -> Duration {
    if in_transition {
        return POLL_TRANSITION;
    }
    if timed {
        return POLL;
    }
    deadlines.into_iter().flatten().fold(RESYNC, Duration::min)
}

/// Step 4: the instances to keep, create and remove, by serial.
struct Planned {
    plan: instances::Plan,
    /// Every planned instance: its name and serial.
    named: Vec<(String, i32)>,
    /// The serials with a Pod or a claim now.
    existing: BTreeSet<i32>,
}

/// Step 4: plans the instance serials; new serials are reserved in the status before any
/// instance is created, so that a crash in between cannot hand the same serial to a
/// different instance later.
async fn plan_instances(
    ctx: &Context,
    cluster: &PostgresCluster,
    defaulted: &PostgresCluster,
    namespace: &str,
    observed: &dereference::Observed,
) -> Result<Planned, Error> {
    let name = cluster.name_any();
    let existing: BTreeSet<i32> = observed
        .pods
        .iter()
        .map(|p| p.name_any())
        .chain(observed.pvcs.iter().map(|p| p.name_any()))
        .filter_map(|n| instances::serial_of(&name, &n))
        .collect();
    let old_status = cluster.status.clone().unwrap_or_default();
    let current_primary = old_status
        .current_primary
        .as_deref()
        .and_then(|p| instances::serial_of(&name, p));
    let plan = instances::plan(
        defaulted.spec.instances,
        &existing,
        old_status.next_serial,
        current_primary,
    );
    if !plan.created(&existing).is_empty() && plan.next_serial > old_status.next_serial {
        let mut reserved = old_status.clone();
        reserved.next_serial = plan.next_serial;
        patch_status(ctx, cluster, namespace, reserved).await?;
    }
    let named = plan
        .serials
        .iter()
        .map(|s| (instances::instance_name(&name, *s), *s))
        .collect();
    Ok(Planned {
        plan,
        named,
        existing,
    })
}

/// Step 6: the passwords (generated, or the user's) and the certificates, read and
/// checked; a refused Secret of the user's raises a Warning Event and changes nothing.
async fn credentials(
    ctx: &Context,
    cluster: &PostgresCluster,
    defaulted: &PostgresCluster,
    namespace: &str,
    named: &[(String, i32)],
    observed: &dereference::Observed,
) -> Result<build::Credentials, Error> {
    let name = cluster.name_any();
    let chosen = credentials::plan(
        &ctx.client,
        namespace,
        &name,
        &defaulted.spec,
        &observed.secrets,
    )
    .await?;
    for warning in &chosen.warnings {
        publish(
            ctx,
            cluster,
            EventType::Warning,
            "CredentialsSecretRefused",
            warning,
        )
        .await;
    }
    let instance_names: Vec<String> = named.iter().map(|(n, _)| n.clone()).collect();
    let tls = &defaulted.spec.tls;
    let brought = match &tls.server_secret {
        Some(secret) => Some(pki::read_brought(&ctx.client, namespace, secret, &name).await),
        None => None,
    };
    let client_ca = match &tls.client_ca_secret {
        Some(secret) => Some(
            pki::read_client_ca(&ctx.client, namespace, secret)
                .await
                .map_err(|why| format!("Secret {secret} {why}")),
        ),
        None => None,
    };
    let pooler_services: Vec<String> = defaulted
        .spec
        .poolers
        .iter()
        .map(|p| pgop_api::pooler::pooler_name(&name, &p.name))
        .collect();
    let pki = pki::plan(
        &observed.secrets,
        &name,
        namespace,
        &instance_names,
        &pooler_services,
        (brought, client_ca),
        now().0,
    )?;
    for warning in &pki.warnings {
        publish(
            ctx,
            cluster,
            EventType::Warning,
            "TLSSecretRefused",
            warning,
        )
        .await;
    }
    Ok(build::Credentials {
        passwords: chosen,
        certificates: build::Certificates {
            ca_cert: pki.authority.cert_pem().to_string(),
            ca_key: pki.authority.key_pem().to_string(),
            manager_cert: pki.manager.cert_pem,
            manager_key: pki.manager.key_pem,
            manager_not_after: pki.manager.not_after.to_string(),
            postgres_ca_cert: pki.postgres_authority.cert_pem().to_string(),
            postgres_ca_key: pki.postgres_authority.key_pem().to_string(),
            server: pki.server,
            server_ca_cert: pki.server_ca,
            server_annotations: pki.server_annotations,
            replication: pki.replication,
            client_ca_cert: pki.client_ca,
        },
    })
}

/// Step 7's decision.
struct Rollout {
    /// The outdated Pod to delete (it is created anew from the current spec).
    replace: Option<String>,
    /// The instance asked to restart PostgreSQL for parameters pending a restart.
    restart_instance: Option<String>,
    /// The restart annotation, with the moment it was first seen.
    restart_requested: Option<pgop_api::cluster::RestartRequest>,
    /// `status.instanceRestarts` for this pass.
    instance_restarts: Vec<pgop_api::cluster::InstanceRestart>,
    /// The restart-instance annotation, read in this pass: remove it once the status
    /// holds what it asked, and say so.
    instance_restart_request: Option<rollout::InstanceRestartRequest>,
    /// Why the rollout is blocked, if it is.
    blocked: Option<rollout::Blocked>,
    /// A switchover to start before anything is built: a drain, or a rolling update that
    /// must update the primary.
    switchover: Option<roles::Switchover>,
}

/// Step 7: the next step of a rolling update, behind its health gate; a cordoned
/// primary's node (a drain) or a rollout that must update the primary asks for a
/// switchover instead (`Rollout::switchover`, which the caller starts). `desired_hashes`:
/// each instance's Pod spec hash as the spec builds it now.
#[allow(clippy::too_many_arguments)]
fn rollout_step(
    ctx: &Context,
    cluster: &PostgresCluster,
    defaulted: &PostgresCluster,
    named: &[(String, i32)],
    observed: &dereference::Observed,
    probes: &BTreeMap<String, probe::Probe>,
    placed: &[nodes::Instance<'_>],
    desired_hashes: &BTreeMap<String, String>,
    roles: &roles::Roles,
) -> Rollout {
    let old_status = cluster.status.clone().unwrap_or_default();
    // The restart annotation: recorded with the moment it was first seen, so that every
    // postmaster started before then restarts, through the rollout.
    let restart_requested = match (
        cluster.annotations().get(ANNOTATION_RESTART),
        &old_status.restart_requested,
    ) {
        (Some(value), Some(known)) if &known.value == value => Some(known.clone()),
        (Some(value), _) => Some(pgop_api::cluster::RestartRequest {
            value: value.clone(),
            requested_at: now().0.to_string(),
        }),
        (None, known) => known.clone(),
    };
    // The restart-instance annotation: its instances recorded (it is removed once the
    // status holds them), the restarted ones pruned.
    let (instance_restarts, instance_restart_request) = rollout::instance_restarts(
        &old_status.instance_restarts,
        cluster
            .annotations()
            .get(ANNOTATION_RESTART_INSTANCE)
            .map(String::as_str),
        named,
        probes,
        now().0,
    );
    let restarts_by_instance: BTreeMap<String, jiff::Timestamp> = instance_restarts
        .iter()
        .filter_map(|e| Some((e.instance.clone(), e.requested_at.parse().ok()?)))
        .collect();
    let unplaced = rollout::unplaced(&observed.pods, now().0);
    let input = rollout::Input {
        instances: named,
        pods: &observed.pods,
        probes,
        roles,
        desired_hashes,
        generation: cluster.metadata.generation,
        restarting: old_status.restart_instance.as_deref(),
        restart_requested_at: restart_requested
            .as_ref()
            .and_then(|r| r.requested_at.parse().ok()),
        instance_restarts: &restarts_by_instance,
        unplaced: &unplaced,
    };
    let step = rollout::next(&input);
    // Health gate: a step that did not come back (or refused) blocks the rollout, and says so.
    let not_ready_since =
        pgop_api::conditions::find_condition(&old_status.conditions, pgop_api::conditions::READY)
            .filter(|c| c.status == pgop_api::conditions::FALSE)
            .map(|c| c.last_transition_time.0);
    let restarting_now = match &step {
        rollout::Step::Restart { instance } => Some(instance.as_str()),
        _ => None,
    };
    let blocked = rollout::blocked(
        &input,
        restarting_now,
        not_ready_since,
        now().0,
        Duration::from_secs(u64::try_from(defaulted.spec.ha.switchover_timeout).unwrap_or(60)),
    );
    let mut decided = Rollout {
        replace: None,
        restart_instance: None,
        restart_requested,
        instance_restarts,
        instance_restart_request,
        blocked,
        switchover: None,
    };
    // A drain: the primary's node is cordoned, so the primary moves first (its budget
    // holds its eviction meanwhile); the rollout goes on afterwards.
    if let Some(to) = nodes::evacuation(placed, roles, &ctx.nodes) {
        let node = observed
            .pods
            .iter()
            .find(|p| p.name_any() == roles.current)
            .and_then(|p| p.spec.as_ref()?.node_name.clone())
            .unwrap_or_default();
        decided.switchover = Some(roles::Switchover {
            note: roles::Note {
                warning: false,
                reason: "SwitchoverStarted",
                message: format!(
                    "node {node} of the primary {} is cordoned (drained): switching the primary to {to}",
                    roles.current
                ),
                instance: Some(to.clone()),
            },
            to,
        });
        return decided;
    }
    match step {
        rollout::Step::Idle => {}
        rollout::Step::Replace { instance } => decided.replace = Some(instance),
        rollout::Step::Restart { instance } => decided.restart_instance = Some(instance),
        rollout::Step::Switchover { to } => {
            decided.switchover = Some(roles::Switchover {
                note: roles::Note {
                    warning: false,
                    reason: "SwitchoverStarted",
                    message: format!(
                        "rolling update: switching the primary from {} to {to} so that {} can be updated",
                        roles.current, roles.current
                    ),
                    instance: Some(to.clone()),
                },
                to,
            });
        }
    }
    decided
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_failover_is_chosen_on_fresh_probes_once_the_primary_is_lost() {
        use super::probe::Probe;
        use pgop_api::v1beta1::PostgresCluster;
        use std::collections::BTreeMap;
        let cluster = |phase: &str, current: &str| -> PostgresCluster {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "database.example.com/v1beta1",
                "kind": "PostgresCluster",
                "metadata": {"name": "db", "namespace": "ns"},
                "spec": {"instances": 2, "storage": {"size": "1Gi"}},
                "status": {"phase": phase, "currentPrimary": current, "targetPrimary": current}
            }))
            .expect("cluster fixture")
        };
        let answer = |role: &str| {
            Probe::Status(Box::new(
                serde_json::from_value(serde_json::json!({
                    "instance": "x", "role": role, "running": role != "stopped"
                }))
                .expect("status fixture"),
            ))
        };
        let probes = |primary: Probe| {
            BTreeMap::from([
                ("db-1".to_string(), primary),
                ("db-2".to_string(), answer("replica")),
            ])
        };
        let ready = cluster("Ready", "db-1");
        assert!(!super::observe::primary_lost(
            &ready,
            &probes(answer("primary"))
        ));
        assert!(super::observe::primary_lost(
            &ready,
            &probes(answer("stopped"))
        ));
        assert!(super::observe::primary_lost(
            &ready,
            &probes(Probe::Unreachable("refused".into()))
        ));
        assert!(super::observe::primary_lost(
            &cluster("Degraded", "db-1"),
            &BTreeMap::from([("db-2".to_string(), answer("replica"))])
        ));
        // A cluster still bootstrapping has no primary to lose yet.
        assert!(!super::observe::primary_lost(
            &cluster("Creating", "db-1"),
            &probes(answer("stopped"))
        ));
    }

    #[test]
    fn a_cluster_is_looked_at_again_by_what_waits_on_the_clock() {
        use super::{POLL, POLL_TRANSITION, RESYNC, next_pass};
        use std::time::Duration;
        assert_eq!(next_pass(true, true, [None, None]), POLL_TRANSITION);
        assert_eq!(
            next_pass(true, false, [Some(Duration::from_secs(5)), None]),
            POLL_TRANSITION
        );
        assert_eq!(
            next_pass(false, true, [None, Some(Duration::from_millis(10))]),
            POLL
        );
        assert_eq!(next_pass(false, false, [None, None]), RESYNC);
        let (soon, sooner) = (Duration::from_secs(7), Duration::from_secs(3));
        assert_eq!(next_pass(false, false, [Some(soon), None]), soon);
        assert_eq!(next_pass(false, false, [None, Some(soon)]), soon);
        assert_eq!(next_pass(false, false, [Some(soon), Some(sooner)]), sooner);
        assert_eq!(next_pass(false, false, [Some(RESYNC * 10), None]), RESYNC);
    }

    #[test]
    fn an_unschedulable_instance_raises_a_warning_once_and_a_normal_event_when_placed() {
        use pgop_api::conditions::{INSTANCES_SCHEDULED, new_condition, set_condition};
        use pgop_api::{PostgresClusterStatus, conditions::whole_seconds};
        let now = whole_seconds(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        ));
        let with = |ok: bool, message: &str| {
            let mut s = PostgresClusterStatus::default();
            let reason = if ok { "Scheduled" } else { "Unschedulable" };
            let c = new_condition(INSTANCES_SCHEDULED, ok, reason, message, None, now.clone());
            set_condition(&mut s.conditions, c, now.clone());
            s
        };
        let reasons = ("InstancesUnschedulable", "InstancesScheduled");
        let event = |old: &PostgresClusterStatus, new: &PostgresClusterStatus| {
            super::decide::condition_event(Some(old), new, INSTANCES_SCHEDULED, false, reasons)
                .map(|(kind, reason, message)| (kind == super::EventType::Warning, reason, message))
        };
        let fine = with(true, "all placed");
        let stuck = with(false, "pod db-3 cannot be scheduled: \"0/3 nodes\"");
        assert_eq!(
            event(&fine, &stuck),
            Some((
                true,
                "InstancesUnschedulable",
                "pod db-3 cannot be scheduled: \"0/3 nodes\"".into()
            ))
        );
        assert_eq!(
            event(&stuck, &stuck),
            None,
            "no second Event while nothing changed"
        );
        assert_eq!(
            event(&stuck, &fine),
            Some((false, "InstancesScheduled", "all placed".into()))
        );
        assert_eq!(event(&fine, &fine), None);
    }
}
