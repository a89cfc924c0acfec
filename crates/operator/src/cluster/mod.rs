//! The PostgresCluster controller.
//!
//! A pass is a pipeline, one call per step in [`reconcile_inner`]: reads in [`observe`] and
//! [`dereference`], decisions in [`decide`] (pure), writes in [`write`]. Steps 1 to 4 may
//! end it (deleted, paused, refused) or hand it to the passes that take the Pods down
//! ([`down`]); an ordinary pass then reads all that steps 5 to 11 use
//! ([`observe::reads`], a [`world::World`]), decides them at once ([`decide::ordinary`])
//! and writes them in this order ([`write::carry_out`]):
//! 1. read — the cluster from the watch; deletion and `spec.paused` stop here;
//! 2. validate — defaults, then the CRD schema's and CEL's rules (`pgop_api`): an invalid
//!    spec sets phase Invalid and waits for a change, never retries ([`decide::valid`]);
//! 3. [`dereference`] — the children, from the watch caches ([`cache`]) or, while they may
//!    not show this cluster's last writes, one labelled LIST per kind; a shrunk volume or a
//!    changed major is refused as in step 2 ([`decide::held`], [`decide::immutable`]);
//! 4. plan the instance serials ([`decide::instances`], [`decide::serials`]); a raised
//!    major is upgraded in place ([`upgrade`]) and `spec.hibernate` goes on in
//!    [`decide::hibernation`], both
//!    instead of the steps below while the Pods are down ([`down`]);
//! 5. [`probe`] every instance's `/pg/status`, then decide the primary ([`decide::roles`]);
//! 6. the passwords and certificates: the user's Secrets the spec names read
//!    ([`observe::user_secrets`]), then checked and chosen ([`decide::credentials`],
//!    [`decide::certificates`], names and authorities in [`pki`]);
//! 7. the next step of a rolling update ([`decide::rolling`]) or a switchover first; then [`build`]
//!    the children once the roles are final;
//! 8. the status ([`decide::computed`]) and the Events of what changed, written first, so that a new
//!    `targetPrimary` is on record before any label moves; then the request annotations;
//! 9. schedule — create the scheduled backups due now;
//! 10. [`lease`] — during a failover, release the Lease of a primary whose container stopped;
//! 11. [`apply`] — apply what differs, create what is missing, delete what the plan removed
//!     and the Pod the rollout replaces.
//!
//! What wakes a cluster: [`triggers`], the [`prober`], and [`decide::next_pass`]. No
//! finalizer: every child carries a controller ownerReference, so the garbage collector
//! deletes them with the cluster, and nothing outside the API server needs cleaning up.

pub mod build;
mod decide;
mod down;
mod error;
pub mod nodes;
mod notes;
mod observe;
mod pass;
pub mod pki;
pub mod pods;
pub mod triggers;
pub mod world;
mod write;

pub use decide::upgrade;
pub use error::Error;
pub use observe::{cache, probe, prober};
pub use pass::{POLL, POLL_TRANSITION, RESYNC};

use crate::Context;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use pass::{key, now};
use pgop_api::v1beta1::PostgresCluster;
use std::sync::Arc;
use tracing::Instrument;

/// Reconciles one PostgresCluster (read in `v1beta1`). See the module doc for the steps.
pub async fn reconcile(cluster: Arc<PostgresCluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    // A trace of its own (a root): its steps are child spans, its calls to the instance
    // managers carry its context, and every line it logs names the cluster and the trace.
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

    // 1. read (paused: nothing is read, written or deleted until the flag is cleared)
    if cluster.metadata.deletion_timestamp.is_some() {
        ctx.expectations.forget(&namespace, &name);
        write::status_then_note(ctx, cluster, &namespace, decide::deleting(cluster)).await?;
        return Ok(Action::await_change());
    }
    if cluster.spec.paused {
        return Ok(Action::await_change());
    }

    // 2. validate
    let mut defaulted = match decide::valid(cluster) {
        Ok(defaulted) => defaulted,
        Err(message) => return refuse(ctx, cluster, &namespace, &message).await,
    };

    // 3. dereference
    let observed = observe::children(ctx, &namespace, &name).await?;
    let (held, wanted) = match decide::held(cluster, &mut defaulted, &observed) {
        Ok(majors) => majors,
        Err(message) => return refuse(ctx, cluster, &namespace, &message).await,
    };

    // 4. plan the serials (new ones are on record in the status before anything is applied)
    let planned = tracing::info_span!(target: pgop_telemetry::TRACE_ONLY, "plan")
        .in_scope(|| decide::instances::plan(cluster, &defaulted, &observed));

    // A major upgrade while the Pods are down, or spec.hibernate (once a change of primary
    // under way is done), instead of steps 5 to 11; else the major they build for.
    let (defaulted, planned, observed) = (&defaulted, &planned, &observed);
    let at = down::At {
        ctx,
        cluster,
        defaulted,
        namespace: &namespace,
        planned,
        observed,
    };
    let upgrade = down::upgrade_decision(at, held, wanted).await?;
    let major = match upgrade.pass {
        upgrade::Pass::Ordinary { major } => major,
        _ => return down::upgrade(at, &upgrade).await,
    };
    if let Some(backup) = &upgrade.create_backup {
        write::create_upgrade_backup(ctx, cluster, &namespace, backup, &upgrade).await?;
    }
    if decide::hibernates(cluster, defaulted) {
        return down::hibernate(at, major).await;
    }

    // 5 to 11: every read, then every decision, then every write.
    let (named, ns) = (planned.named.as_slice(), namespace.as_str());
    let reads = observe::reads(ctx, cluster, defaulted, ns, named, observed).await?;
    let world = world::World {
        cluster,
        defaulted,
        namespace: ns,
        observed,
        reads,
        nodes: &ctx.nodes,
        settings: &ctx.settings,
        now: now(),
    };
    let settled = decide::Settled {
        named,
        plan: &planned.plan,
        existing: &planned.existing,
        major,
        upgrade: &upgrade,
    };
    let pass = decide::ordinary(&world, settled)?;
    let requeue = pass.requeue;
    write::carry_out(ctx, &world, ns, pass).await?;
    Ok(Action::requeue(requeue))
}

/// Steps 2 and 3's refusal: phase Invalid and an InvalidSpec Warning naming the fields,
/// then nothing until the spec changes (never a retry).
async fn refuse(
    ctx: &Context,
    cluster: &PostgresCluster,
    namespace: &str,
    message: &str,
) -> Result<Action, Error> {
    let refused = decide::refused(cluster, message, now());
    write::status_then_note(ctx, cluster, namespace, refused).await?;
    Ok(Action::await_change())
}
