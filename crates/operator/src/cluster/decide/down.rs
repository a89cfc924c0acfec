//! The passes that take the Pods down instead of steps 5 to 11, decided as values:
//! `spec.hibernate` ([`hibernation`]) and a major upgrade while the cluster is down for
//! pg_upgrade ([`upgrade`]). [`crate::cluster::write::carry_out_down`] carries them out.

use super::instances::{Planned, children};
use super::serials as instances;
use super::status::hibernation_event;
use super::{hibernation, upgrade};
use crate::cluster::notes::Note;
use crate::cluster::pass::{POLL, RESYNC};
use crate::cluster::{build, world};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::runtime::events::EventType;
use pgop_api::PostgresClusterStatus;
use pgop_api::v1beta1::PostgresCluster;
use std::time::Duration;

/// What such a pass starts from: the cluster as read and with its defaults, step 3's
/// children, step 4's plan, the passwords and certificates, and the clock.
#[derive(Clone, Copy)]
pub(in crate::cluster) struct DownInput<'a> {
    pub cluster: &'a PostgresCluster,
    pub defaulted: &'a PostgresCluster,
    pub observed: &'a world::Observed,
    pub planned: &'a Planned,
    pub credentials: &'a build::Credentials,
    pub settings: &'a crate::Settings,
    pub now: &'a Time,
}

/// Such a pass, decided: the status and its Event, the children to apply (with whatever
/// Pods they hold), the instances to delete with their volumes, the Pods to delete, and
/// when to look again.
pub(in crate::cluster) struct Down {
    pub status: PostgresClusterStatus,
    pub notes: Vec<Note>,
    pub children: build::Children,
    pub removed: Vec<String>,
    pub delete: Vec<String>,
    pub requeue: Duration,
}

/// `spec.hibernate` (see [`hibernation`]): the children but the Pods are applied as usual,
/// the status says how far the hibernation is, and the next Pods are deleted, the
/// primary's first (`backups`: the cluster's, a backup running holds it up).
pub(in crate::cluster) fn hibernate(
    input: DownInput<'_>,
    major: i32,
    backups: &[pgop_api::backup::PostgresBackup],
) -> Result<Down, build::Error> {
    let DownInput {
        cluster,
        defaulted,
        observed,
        planned,
        ..
    } = input;
    let name = cluster.name_any();
    let primary = cluster
        .status
        .as_ref()
        .and_then(|s| s.current_primary.clone())
        .unwrap_or_else(|| instances::instance_name(&name, planned.plan.primary));
    let step = hibernation::next(&observed.pods, &primary, backups);
    let budgets = build::Budgets::new(planned.named.len(), false, false);
    let mut children = children(
        defaulted,
        &planned.named,
        input.credentials,
        input.settings,
        Some(&primary),
        major,
        &budgets,
    )?;
    children.pods.clear();

    let plan = &planned.plan;
    let mut status = hibernation::status(cluster, plan, &observed.pods, &step, input.now.clone());
    status.postgres_version = Some(major);
    let notes = hibernation_event(cluster.status.as_ref(), &status)
        .map(|(reason, message)| Note::new(EventType::Normal, reason, message))
        .into_iter()
        .collect();
    let removed = plan
        .remove
        .iter()
        .map(|s| instances::instance_name(&name, *s))
        .collect();
    let (delete, requeue) = match step {
        hibernation::Step::Delete(pods) => (pods, POLL),
        hibernation::Step::Done => (Vec::new(), RESYNC),
        _ => (Vec::new(), POLL),
    };
    Ok(Down {
        status,
        notes,
        children,
        removed,
        delete,
        requeue,
    })
}

/// The upgrade's passes (see [`upgrade`]): every Pod deleted, the primary's first
/// (`Stopping`); then only the primary's Pod, built for the new major with the upgrade
/// request (`Upgrading`); or that Pod deleted after a failure. The other children are
/// applied as usual; the status says phase Upgrading. `record`: the decision's.
pub(in crate::cluster) fn upgrading(
    input: DownInput<'_>,
    decision: &upgrade::Decision,
    record: &pgop_api::cluster::MajorUpgrade,
) -> Result<Down, build::Error> {
    let DownInput {
        cluster,
        defaulted,
        observed,
        planned,
        ..
    } = input;
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
    let mut children = build::children(
        defaulted,
        &wanted,
        input.credentials,
        input.settings,
        &budgets,
    )?;
    children
        .pods
        .retain(|p| upgrading && p.name_any() == record.primary);

    let mut status = upgrade::status_while_down(cluster, &observed.pods, decision, input.now);
    status.postgres_version = Some(record.from);
    // New serials on record before any claim of theirs is applied (instances.rs).
    status.next_serial = status.next_serial.max(planned.plan.next_serial);
    let notes = upgrade::event(cluster.status.as_ref(), &status)
        .map(|(kind, reason, message)| Note::new(kind, reason, message))
        .into_iter()
        .collect();
    let delete = match &decision.pass {
        upgrade::Pass::Stop(hibernation::Step::Delete(pods)) => pods.clone(),
        upgrade::Pass::RollBack => vec![record.primary.clone()],
        _ => Vec::new(),
    };
    Ok(Down {
        status,
        notes,
        children,
        removed: Vec::new(),
        delete,
        requeue: POLL,
    })
}
