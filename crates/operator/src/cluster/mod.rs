//! The PostgresCluster controller.
//!
//! Reconcile is a pipeline, one call per step in [`reconcile_inner`]; the pass's reads are
//! in [`observe`] and [`dereference`], its decisions in [`decide`] (pure), its writes in
//! [`write`], and this module calls them in this order:
//! 1. read — the cluster arrives from the watch; deletion and `spec.paused` stop here;
//! 2. validate — defaults, then the same rules as the CRD schema and CEL (`pgop_api`);
//!    an invalid spec sets phase Invalid and waits for the next change, never retries
//!    ([`decide::refused`]);
//! 3. [`dereference`] — the children that exist, from the watch caches ([`cache`]) or,
//!    while they may not show this cluster's last writes, one labelled LIST per kind; a
//!    shrunk volume or a changed major is refused as in step 2 ([`immutable`]);
//! 4. [`decide::instances`] — plan the instance serials ([`instances`]), reserving new
//!    ones in the status; a raised major is upgraded in place by [`upgrade`], which
//!    replaces the steps below while the cluster is down for pg_upgrade; `spec.hibernate`
//!    goes on in [`hibernation`] instead of the steps below (both passes: [`down`]);
//! 5. [`probe`] — read every instance's `/pg/status` (in parallel, bounded), then
//!    [`roles`] — decide the primary: failover, switchover, completion (pure);
//! 6. [`credentials`], [`pki`] — passwords and certificates, read and checked
//!    ([`observe::credentials`]);
//! 7. [`decide::rollout()`] — the next step of a rolling update ([`rollout`]), if any, or a
//!    switchover first (a drain, or a rollout that reached the primary); then [`build`]
//!    the desired children as plain values, once the roles are final;
//! 8. [`status`], [`decide::status()`] — compute status, conditions, the backup facts and
//!    the Events of what changed (pure), then patch the status when it changed and publish
//!    the Events; a new `targetPrimary` is thus written before any label moves; then the
//!    request annotations acted on are removed ([`decide::requests()`]);
//! 9. schedule — create the scheduled backups due now ([`backup::cluster::due_backup`]);
//! 10. [`lease`] — during a failover, release the Lease of a primary whose container is
//!     stopped;
//! 11. [`apply`] — server-side apply what differs, create what is missing, delete the
//!     instances the plan removed and the Pod the rollout replaces.
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
mod down;
mod error;
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

pub use error::Error;

use crate::Context;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use pgop_api::cluster::ClusterPhase;
use pgop_api::constants::ANNOTATION_SWITCHOVER_TO;
use pgop_api::v1beta1::PostgresCluster;
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;
use write::patch_status;

/// How often a cluster is looked at while a decision waits on the clock (see
/// [`decide::next_pass`]).
pub const POLL: Duration = Duration::from_secs(1);
/// How often a cluster is looked at when nothing wakes it: a safety net, since the
/// watches ([`cache`], [`triggers`]) and the prober wake it on every change that matters.
pub const RESYNC: Duration = Duration::from_secs(300);
/// How often during a failover or switchover.
pub const POLL_TRANSITION: Duration = Duration::from_millis(300);

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
        write::status_then_note(ctx, cluster, &namespace, decide::deleting(cluster)).await?;
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
        let refused = decide::refused(cluster, &message, now());
        write::status_then_note(ctx, cluster, &namespace, refused).await?;
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
    // A spec below what the volumes already hold, or a major version other than the one
    // the data holds (the validating webhook refuses both changes; without it, they are
    // caught here, before any Pod is rebuilt): volumes cannot shrink, and a cluster whose
    // instances never ran is made with the spec's major.
    let wanted_major = defaulted
        .spec
        .postgresql
        .version
        .unwrap_or(pgop_api::cluster::DEFAULT_POSTGRES_VERSION);
    let major =
        immutable::held_major(cluster.status.as_ref(), &observed.pods).unwrap_or(wanted_major);
    let immutable = immutable::storage_shrink(&defaulted.spec, &observed.pvcs)
        .or_else(|| immutable::major_change(&defaulted.spec, major));
    if let Some(error) = immutable {
        let message = pgop_api::validation::summary(&[error]);
        let refused = decide::refused(cluster, &message, now());
        write::status_then_note(ctx, cluster, &namespace, refused).await?;
        return Ok(Action::await_change());
    }

    // 4. plan: the serials to keep, create and remove. New serials are on record in the
    // status each pass writes before it applies anything (step 8 here; the status of the
    // hibernation and upgrade passes likewise), so that a crash in between cannot hand the
    // same serial to a different instance later.
    let planned = tracing::info_span!(target: pgop_telemetry::TRACE_ONLY, "plan")
        .in_scope(|| decide::instances::plan(cluster, &defaulted, &observed));
    let named = &planned.named;

    // A major raised: the in-place upgrade (upgrade.rs) takes the cluster down, upgrades
    // the primary's volume and clones the standbys; while it runs pg_upgrade it replaces
    // steps 5 to 11, otherwise it says which major the ordinary pass builds for.
    let at = down::At {
        ctx,
        cluster,
        defaulted: &defaulted,
        namespace: &namespace,
        planned: &planned,
        observed: &observed,
    };
    let upgrade = down::upgrade_decision(at, major, wanted_major).await?;
    let major = match upgrade.pass {
        upgrade::Pass::Ordinary { major } => major,
        _ => return down::upgrade(at, &upgrade).await,
    };
    if let Some(backup) = &upgrade.create_backup {
        write::create_upgrade_backup(ctx, cluster, &namespace, backup, &upgrade).await?;
    }

    // spec.hibernate: the Pods go, the rest stays (hibernation.rs); a change of primary
    // under way finishes first.
    let changing_primary = cluster
        .status
        .as_ref()
        .is_some_and(|s| s.target_primary != s.current_primary);
    if defaulted.spec.hibernate && !changing_primary {
        return down::hibernate(at, major).await;
    }

    // 5. probe the instances and decide the roles
    let probes = observe::probes(ctx, cluster, &observed)
        .instrument(tracing::info_span!(target: pgop_telemetry::TRACE_ONLY, "probe"))
        .await;
    // The volumes' size: auto-grow when an instance reports its volume filling up.
    let usage = observe::volume_usage(&probes);
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

    // 6. credentials: a refused Secret of the user's raises a Warning and changes nothing
    let (credentials, refused_secrets) =
        observe::credentials(ctx, cluster, &defaulted, &namespace, named, &observed)
            .instrument(tracing::info_span!(target: pgop_telemetry::TRACE_ONLY, "credentials"))
            .await?;
    write::publish_notes(ctx, cluster, &refused_secrets).await;

    // 7. rollout: one outdated instance at a time, standbys first; a drain moves the
    // primary first. It compares the Pods' spec hashes, which do not depend on the roles,
    // and may start a switchover, which does: the children are built after it, once.
    let hashes = build::pod_spec_hashes(
        &defaulted,
        &decide::instances::specs(named, None, major),
        &ctx.settings,
    )?;
    let rollout = decide::rollout(
        decide::RolloutInput {
            cluster,
            defaulted: &defaulted,
            named,
            observed: &observed,
            probes: &probes,
            placed: &placed,
            desired_hashes: &hashes,
            roles: &roles,
            nodes: &ctx.nodes,
        },
        &now(),
    );
    if let Some(switchover) = rollout.switchover.clone() {
        roles.start_switchover(switchover);
    }
    // The children, built once the roles are final: only a confirmed primary carries the
    // primary role label.
    let labelled = (!roles.in_transition()).then_some(roles.current.as_str());
    let budgets = build::Budgets::new(named.len(), roles.in_transition(), primary_budget);
    let children = decide::instances::children(
        &defaulted,
        named,
        &credentials,
        &ctx.settings,
        labelled,
        major,
        &budgets,
    )?;

    // 8. status first: a new targetPrimary is on record before any label moves
    let backups = observe::backups_of(ctx, cluster, &namespace).await?;
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
    // The request annotations acted on go, and their Events follow.
    write::requests(
        ctx,
        cluster,
        &namespace,
        &decide::requests(cluster, &roles, &rollout),
    )
    .await?;

    // 9. schedule: the scheduled backups due now
    let next_firing = match &backups {
        Some(backups) => {
            write::schedule_backups(ctx, cluster, &defaulted, &namespace, backups, &status)
                .instrument(tracing::info_span!(target: pgop_telemetry::TRACE_ONLY, "schedule"))
                .await?
        }
        None => None,
    };

    // 10. a failover from a primary whose container the kubelet reports stopped: its
    // Lease goes now rather than after its duration (see lease.rs)
    if roles.in_transition() && roles.phase == Some(ClusterPhase::FailingOver) {
        write::release_dead_primary_lease(ctx, cluster, &namespace, &observed, &roles).await;
    }

    // 11. apply
    let timed = rollout.replace.is_some()
        || rollout.restart_instance.is_some()
        || rollout.blocked.is_some()
        || observed
            .pods
            .iter()
            .any(|p| status::unschedulable_since(p).is_some());
    let refused_volumes = write::apply_children(
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
    write::volumes_refused(ctx, cluster, &namespace, status, &refused_volumes, seen).await?;
    // The failover delay runs only while a standby could take over.
    let failover_clock = !roles.primary.available
        && probes.values().any(|p| {
            p.status()
                .is_some_and(|s| s.role == pgop_api::instance_status::PgRole::Replica)
        });
    Ok(Action::requeue(decide::next_pass(
        roles.in_transition(),
        failover_clock || timed,
        [next_firing, positions_due],
    )))
}
