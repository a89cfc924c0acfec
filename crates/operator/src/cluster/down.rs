//! The passes that take the Pods down in place of steps 5 to 11 of an ordinary pass:
//! `spec.hibernate` ([`super::hibernation`]) and a major upgrade while the cluster is down
//! for pg_upgrade ([`super::upgrade`]), with the upgrade's decision, which says which pass
//! runs.

use super::decide::hibernation_event;
use super::decide::instances::Planned;
use super::write::{patch_status, publish};
use super::{
    Error, POLL, RESYNC, apply, build, decide, dereference, hibernation, instances, now, observe,
    prober, upgrade, write,
};
use crate::Context;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
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
    pub observed: &'a dereference::Observed,
}

/// `spec.hibernate` in place of steps 5 to 11 (see [`hibernation`]): the children but the
/// Pods are applied as usual, the status says how far the hibernation is, and the next
/// Pods are deleted, the primary's first.
pub(super) async fn hibernate(at: At<'_>, major: i32) -> Result<Action, Error> {
    let At {
        ctx,
        cluster,
        defaulted,
        namespace,
        planned,
        observed,
    } = at;
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

    let (credentials, notes) =
        observe::credentials(ctx, cluster, defaulted, namespace, &planned.named, observed).await?;
    write::publish_notes(ctx, cluster, &notes).await;
    let budgets = build::Budgets::new(planned.named.len(), false, false);
    let mut children = decide::instances::children(
        defaulted,
        &planned.named,
        &credentials,
        &ctx.settings,
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

/// The upgrade's passes that replace steps 5 to 11 (see [`upgrade`]): every Pod deleted,
/// the primary's first (`Stopping`); then only the primary's Pod, built for the new major
/// with the upgrade request (`Upgrading`); or that Pod deleted after a failure. The other
/// children are applied as usual; the status says phase Upgrading.
pub(super) async fn upgrade(at: At<'_>, decision: &upgrade::Decision) -> Result<Action, Error> {
    let At {
        ctx,
        cluster,
        defaulted,
        namespace,
        planned,
        observed,
    } = at;
    let Some(record) = &decision.record else {
        return Ok(Action::requeue(POLL));
    };
    track(ctx, cluster, observed);
    let (credentials, notes) =
        observe::credentials(ctx, cluster, defaulted, namespace, &planned.named, observed).await?;
    write::publish_notes(ctx, cluster, &notes).await;
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
    // New serials on record before any claim of theirs is applied (decide/instances.rs).
    status.next_serial = status.next_serial.max(planned.plan.next_serial);
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
pub(super) fn track(ctx: &Context, cluster: &PostgresCluster, observed: &dereference::Observed) {
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
