//! The passes that take the Pods down in place of steps 5 to 11 of an ordinary pass:
//! `spec.hibernate` ([`decide::hibernation`]) and a major upgrade while the cluster is down
//! for pg_upgrade ([`upgrade`]), with the upgrade's decision, which says which pass
//! runs. Each reads, decides ([`decide::hibernate`], [`decide::upgrading`]) and writes
//! ([`write::carry_out_down`]).

use super::decide::instances::Planned;
use super::decide::upgrade;
use super::error::Error;
use super::observe::prober;
use super::pass::{POLL, now};
use super::{decide, observe, world, write};
use crate::Context;
use kube::runtime::controller::Action;
use observe::{backups_of, probes};
use pgop_api::v1beta1::PostgresCluster;

/// What the passes here start from: the pass so far (the cluster as read and with its
/// defaults, its namespace, step 4's plan and step 3's children).
#[derive(Clone, Copy)]
pub(super) struct At<'a> {
    pub ctx: &'a Context,
    pub cluster: &'a PostgresCluster,
    pub defaulted: &'a PostgresCluster,
    pub namespace: &'a str,
    pub planned: &'a Planned,
    pub observed: &'a world::Observed,
}

/// `spec.hibernate` in place of steps 5 to 11 ([`decide::hibernate`]): the cluster's
/// backups (a running one holds the hibernation up) and credentials read, then written.
pub(super) async fn hibernate(at: At<'_>, major: i32) -> Result<Action, Error> {
    let At {
        ctx,
        cluster,
        defaulted,
        namespace,
        observed,
        ..
    } = at;
    track(ctx, cluster, observed);
    let backups = backups_of(ctx, cluster, namespace)
        .await?
        .unwrap_or_default();
    let users = observe::user_secrets(ctx, defaulted, namespace).await;
    let now = now();
    let (credentials, notes) = credentials(at, &users, &now)?;
    let pass = decide::hibernate(input(at, &credentials, &now), major, &backups)?;
    let requeue = pass.requeue;
    write::carry_out_down(ctx, cluster, namespace, observed, &notes, pass).await?;
    Ok(Action::requeue(requeue))
}

/// The upgrade's decision for this pass (see [`upgrade`]): the cluster's backups are read
/// only while an upgrade is asked for or runs, the upgrading primary probed only while it
/// runs pg_upgrade.
pub(super) async fn upgrade_decision(
    at: At<'_>,
    held: i32,
    wanted: i32,
) -> Result<upgrade::Decision, Error> {
    let At {
        ctx,
        cluster,
        defaulted,
        namespace,
        planned,
        observed,
    } = at;
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

/// The upgrade's passes that replace steps 5 to 11 ([`decide::upgrading`]): the credentials
/// read, then written; nothing but a look again while the decision has no record yet.
pub(super) async fn upgrade(at: At<'_>, decision: &upgrade::Decision) -> Result<Action, Error> {
    let At {
        ctx,
        cluster,
        defaulted,
        namespace,
        observed,
        ..
    } = at;
    let Some(record) = &decision.record else {
        return Ok(Action::requeue(POLL));
    };
    track(ctx, cluster, observed);
    let users = observe::user_secrets(ctx, defaulted, namespace).await;
    let now = now();
    let (credentials, notes) = credentials(at, &users, &now)?;
    let pass = decide::upgrading(input(at, &credentials, &now), decision, record)?;
    let requeue = pass.requeue;
    write::carry_out_down(ctx, cluster, namespace, observed, &notes, pass).await?;
    Ok(Action::requeue(requeue))
}

/// Step 6 decided as in an ordinary pass ([`decide::credentials`]).
fn credentials(
    at: At<'_>,
    users: &world::UserSecrets,
    now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> Result<
    (
        crate::cluster::build::Credentials,
        Vec<crate::cluster::notes::Note>,
    ),
    Error,
> {
    decide::credentials::credentials(decide::credentials::Input {
        cluster: &kube::ResourceExt::name_any(at.cluster),
        namespace: at.namespace,
        spec: &at.defaulted.spec,
        instances: &at.planned.named,
        secrets: &at.observed.secrets,
        users,
        now: now.0,
    })
}

/// The decisions' input from the pass so far.
fn input<'a>(
    at: At<'a>,
    credentials: &'a crate::cluster::build::Credentials,
    now: &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> decide::DownInput<'a> {
    decide::DownInput {
        cluster: at.cluster,
        defaulted: at.defaulted,
        observed: at.observed,
        planned: at.planned,
        credentials,
        settings: &at.ctx.settings,
        now,
    }
}

/// Tells the prober the cluster's Pods (a pass that does not probe them: hibernation, a
/// major upgrade while the cluster is down).
pub(super) fn track(ctx: &Context, cluster: &PostgresCluster, observed: &world::Observed) {
    if let Some(prober) = &ctx.prober {
        let r = kube::runtime::reflector::ObjectRef::from_obj(cluster);
        prober.track(&r, prober::instances_of(&observed.pods));
    }
}
