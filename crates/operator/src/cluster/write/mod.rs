//! The writes of a pass: the status, the request annotations, Events, scheduled and
//! upgrade backups, the Lease of a stopped primary, the children (apply and delete) and a
//! refused resize. An ordinary pass is written by [`ordinary`], from the value
//! [`decide::ordinary`] returns, in a fixed order: the status with `targetPrimary` and
//! reserved serials before any label moves or Pod is created, the Events of a status
//! change right after it, then annotations, backups, the Lease, the children and the
//! resize amend. The passes that end early or take the Pods down write through
//! [`status_then_note`], [`patch_status`] and [`publish`].

pub mod apply;
pub mod lease;

use super::decide::{Down, Ordinary, set_volumes_resized};
use super::decide::{storage, upgrade};
use super::error::Error;
use super::notes::Note;
use super::pass::{key, now};
use super::world;
use super::world::World;
use super::{build, decide};
use crate::{Context, backup};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use pgop_api::PostgresClusterStatus;
use pgop_api::backup::BackupMethod;
use pgop_api::constants::FIELD_MANAGER;
use pgop_api::instance_status::VolumeUsage;
use pgop_api::v1beta1::PostgresCluster;
use tracing::Instrument;

/// Carries out steps 5 to 11 of an ordinary pass as [`decide::ordinary`] decided them, in
/// this order: the Warnings of step 6 (a refused Secret of the user's), the status and
/// the Events of its changes (a new `targetPrimary` and the reserved serials on record
/// before any label moves or Pod is created), the request annotations and their Events,
/// the scheduled backups, the Lease of a stopped primary, the children (apply and delete),
/// and the resize amend.
pub(super) async fn carry_out(
    ctx: &Context,
    world: &World<'_>,
    namespace: &str,
    pass: Ordinary,
) -> Result<(), Error> {
    let cluster = world.cluster;
    publish_notes(ctx, cluster, &pass.refused).await;
    patch_status(ctx, cluster, namespace, pass.status.clone()).await?;
    publish_notes(ctx, cluster, &pass.status_notes).await;
    requests(ctx, cluster, namespace, &pass.requests).await?;
    if world.reads.backups.is_some() {
        schedule_backups(ctx, world, namespace, &pass.scheduled)
            .instrument(tracing::info_span!(target: pgop_telemetry::TRACE_ONLY, "schedule"))
            .await?;
    }
    if let Some(primary) = &pass.release_lease {
        release_dead_primary_lease(ctx, cluster, namespace, world.observed, primary).await;
    }
    let refused = apply_children(ctx, world, namespace, &pass)
        .instrument(tracing::info_span!(target: pgop_telemetry::TRACE_ONLY, "apply"))
        .await?;
    let usage = decide::volume_usage(&world.reads.probes);
    let seen = (
        &pass.storage,
        world.observed.pvcs.as_slice(),
        usage.as_slice(),
    );
    volumes_refused(ctx, cluster, namespace, pass.status, &refused, seen).await
}

/// Step 9: creates the scheduled backups due now (an existing one of the name is kept, so
/// a second pass creates nothing twice), with an Event for each created.
async fn schedule_backups(
    ctx: &Context,
    world: &World<'_>,
    namespace: &str,
    due: &[(String, BackupMethod)],
) -> Result<(), Error> {
    for (name, method) in due {
        let defaulted = world.defaulted;
        let created =
            backup::cluster::create_scheduled(&ctx.client, namespace, defaulted, name, *method)
                .await
                .map_err(Error::ScheduleBackup)?;
        if created {
            let what = match method {
                BackupMethod::BaseBackup => "base",
                BackupMethod::Logical => "logical",
            };
            let note = format!("scheduled {what} backup {name} created");
            publish(
                ctx,
                world.cluster,
                EventType::Normal,
                "BackupScheduled",
                &note,
            )
            .await;
        }
    }
    Ok(())
}

/// Step 10: releases the Lease of `primary` if the kubelet reports its container stopped,
/// so that the failover need not wait for its duration. A failure is logged: the Lease
/// then expires on its own.
async fn release_dead_primary_lease(
    ctx: &Context,
    cluster: &PostgresCluster,
    namespace: &str,
    observed: &world::Observed,
    primary: &str,
) {
    let name = cluster.name_any();
    let old = observed.pods.iter().find(|p| p.name_any() == primary);
    match lease::release_if_dead(&ctx.client, namespace, &name, primary, old).await {
        Ok(true) => {
            let note = format!(
                "the primary Lease held by {primary} was released: its container is not running"
            );
            let about = Some(primary);
            publish_about(
                ctx,
                cluster,
                EventType::Normal,
                "LeaseReleased",
                &note,
                about,
            )
            .await;
        }
        Ok(false) => {}
        Err(e) => {
            tracing::warn!(cluster = %key(cluster), error = %e, "releasing the Lease of a stopped primary");
        }
    }
}

/// Step 11: first, volumes lost with their node (the instance is recreated elsewhere on
/// the next pass); else apply the children, delete what the plan removed and the Pod the
/// rollout replaces, and say so in Events. Until the writes are known (an error may cut
/// them short), the next pass reads from the API server rather than the caches. Returns
/// the claims whose resize the API server refused, and why.
async fn apply_children(
    ctx: &Context,
    world: &World<'_>,
    namespace: &str,
    pass: &Ordinary,
) -> Result<Vec<(String, String)>, Error> {
    let (cluster, observed) = (world.cluster, world.observed);
    let name = cluster.name_any();
    ctx.expectations.writing(namespace, &name);
    if !pass.lost.is_empty() {
        let mut outcome = apply::Outcome::default();
        let lost: Vec<String> = pass.lost.iter().map(|(i, _)| i.clone()).collect();
        apply::delete_instances(&ctx.client, namespace, &lost, observed, &mut outcome).await?;
        ctx.expectations
            .wrote(namespace, &name, std::mem::take(&mut outcome.written));
        for (instance, node) in &pass.lost {
            let note = format!(
                "the volume of {instance} was on node {node}, which no longer exists: \
                 {instance} is removed and a new instance is cloned from the primary"
            );
            let about = Some(instance.as_str());
            publish_about(ctx, cluster, EventType::Warning, "VolumeLost", &note, about).await;
        }
        return Ok(Vec::new());
    }
    let replaced = pass.replace.as_slice();
    let at = (namespace, name.as_str());
    let mut outcome =
        apply_and_delete(ctx, at, &pass.children, observed, &pass.removed, replaced).await?;
    if let Some(instance) = &pass.replace {
        let note = format!("rolling update: replacing pod {instance}, built from an older spec");
        let about = Some(instance.as_str());
        publish_about(
            ctx,
            cluster,
            EventType::Normal,
            "RollingUpdate",
            &note,
            about,
        )
        .await;
    }
    if let Some(scaled) = &pass.scaled {
        publish_notes(ctx, cluster, std::slice::from_ref(scaled)).await;
    }
    if !outcome.repaired.is_empty() {
        let note = format!("restored {}", outcome.repaired.join(", "));
        publish(ctx, cluster, EventType::Normal, "Repaired", &note).await;
    }
    Ok(std::mem::take(&mut outcome.refused_volumes))
}

/// Carries out a pass that takes the Pods down ([`decide::Down`]): the Warnings of step 6
/// (`refused`), the status and its Event, then the children applied (with whatever Pods they
/// hold), the instances removed deleted with their volumes and the Pods to go deleted;
/// the writes recorded for the next pass's reads.
pub(super) async fn carry_out_down(
    ctx: &Context,
    cluster: &PostgresCluster,
    namespace: &str,
    observed: &world::Observed,
    refused: &[Note],
    pass: Down,
) -> Result<(), Error> {
    publish_notes(ctx, cluster, refused).await;
    patch_status(ctx, cluster, namespace, pass.status).await?;
    publish_notes(ctx, cluster, &pass.notes).await;
    let name = cluster.name_any();
    ctx.expectations.writing(namespace, &name);
    let children = &pass.children;
    let at = (namespace, name.as_str());
    apply_and_delete(ctx, at, children, observed, &pass.removed, &pass.delete).await?;
    Ok(())
}

/// Applies `children`, deletes the instances `removed` with their volumes and the Pods
/// `pods`, and records the writes for the next pass's reads (the caller said
/// `expectations.writing` first: until the writes are known, an error cutting them short
/// included, the next pass reads from the API server rather than the caches).
async fn apply_and_delete(
    ctx: &Context,
    (namespace, name): (&str, &str),
    children: &build::Children,
    observed: &world::Observed,
    removed: &[String],
    pods: &[String],
) -> Result<apply::Outcome, Error> {
    let mut outcome = apply::apply(&ctx.client, namespace, children, observed).await?;
    apply::delete_instances(&ctx.client, namespace, removed, observed, &mut outcome).await?;
    for pod in pods {
        apply::delete_pod(&ctx.client, namespace, pod, observed, &mut outcome).await?;
    }
    ctx.expectations
        .wrote(namespace, name, std::mem::take(&mut outcome.written));
    Ok(outcome)
}

/// A change of the claims' size the API server refused in this pass (a StorageClass
/// without `allowVolumeExpansion`, a claim not bound yet): the rest of the cluster was
/// applied; the condition `VolumesResized` says so (ResizeRefused), with a Warning Event
/// when it is new. The change is tried again at every pass.
async fn volumes_refused(
    ctx: &Context,
    cluster: &PostgresCluster,
    namespace: &str,
    mut status: PostgresClusterStatus,
    refused: &[(String, String)],
    (storage, pvcs, usage): (
        &storage::Storage,
        &[k8s_openapi::api::core::v1::PersistentVolumeClaim],
        &[(&str, VolumeUsage)],
    ),
) -> Result<(), Error> {
    if refused.is_empty() {
        return Ok(());
    }
    let message = refused
        .iter()
        .map(|(claim, why)| {
            format!(
                "PersistentVolumeClaim {claim} keeps its size: the API server refused the \
                 change to {} ({why})",
                match storage.wal_size.as_deref() {
                    Some(size)
                        if pvcs
                            .iter()
                            .any(|p| p.name_any() == *claim && build::pvc::is_wal(p)) =>
                    {
                        format!("{size} (spec.walStorage.size)")
                    }
                    _ => format!(
                        "{} (spec.storage.size, or what auto-grow reached)",
                        storage.size
                    ),
                }
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    if set_volumes_resized(
        cluster,
        &mut status,
        storage,
        pvcs,
        usage,
        Some(&message),
        &now(),
    ) {
        patch_status(ctx, cluster, namespace, status).await?;
        let note = format!(
            "{message}; the rest of the cluster is reconciled, and the change is tried again \
             at every pass"
        );
        let about = refused.first().map(|(claim, _)| claim.as_str());
        publish_about(
            ctx,
            cluster,
            EventType::Warning,
            "VolumeResizeRefused",
            &note,
            about,
        )
        .await;
    }
    Ok(())
}

/// The PostgresBackup an upgrade takes before it starts or after it completes (an
/// existing one of that name is kept: the name is fixed by the upgrade's record).
pub(super) async fn create_upgrade_backup(
    ctx: &Context,
    cluster: &PostgresCluster,
    namespace: &str,
    name: &str,
    upgrade: &upgrade::Decision,
) -> Result<(), Error> {
    let Some(record) = &upgrade.record else {
        return Ok(());
    };
    let value = format!("{}-to-{}", record.from, record.to);
    let created = backup::cluster::create_owned(
        &ctx.client,
        namespace,
        cluster,
        name,
        BackupMethod::BaseBackup,
        (pgop_api::constants::ANNOTATION_MAJOR_UPGRADE, value),
    )
    .await
    .map_err(Error::ScheduleBackup)?;
    if created {
        let note = format!(
            "base backup {name} created for the upgrade from PostgreSQL {} to {}",
            record.from, record.to
        );
        publish(ctx, cluster, EventType::Normal, "MajorUpgradeBackup", &note).await;
    }
    Ok(())
}

/// After the status: removes the request annotations acted on, then publishes the Events
/// of what they asked ([`super::decide::requests`]).
async fn requests(
    ctx: &Context,
    cluster: &PostgresCluster,
    namespace: &str,
    requests: &decide::Requests,
) -> Result<(), Error> {
    for annotation in &requests.clear {
        clear_annotation(ctx, cluster, namespace, annotation).await?;
    }
    publish_notes(ctx, cluster, &requests.notes).await;
    Ok(())
}

/// Writes the status of a pass that ends early (a refused spec, a cluster being deleted)
/// and publishes its Event only when the status changed, so that nothing is said twice.
pub(super) async fn status_then_note(
    ctx: &Context,
    cluster: &PostgresCluster,
    namespace: &str,
    (status, note): (PostgresClusterStatus, Note),
) -> Result<(), Error> {
    if patch_status(ctx, cluster, namespace, status).await? {
        publish_notes(ctx, cluster, &[note]).await;
    }
    Ok(())
}

/// Removes a request annotation once it was read (a merge patch of the cluster).
async fn clear_annotation(
    ctx: &Context,
    cluster: &PostgresCluster,
    namespace: &str,
    annotation: &'static str,
) -> Result<(), Error> {
    let api: Api<crate::ApiCluster> = Api::namespaced(ctx.client.clone(), namespace);
    let patch = serde_json::json!({
        "metadata": {"annotations": {annotation: null}}
    });
    api.patch(
        &cluster.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .map_err(|e| Error::ClearAnnotation(annotation, e))?;
    Ok(())
}

/// Server-side applies `status` unless the cluster already shows it; true if written.
pub(super) async fn patch_status(
    ctx: &Context,
    cluster: &PostgresCluster,
    namespace: &str,
    status: PostgresClusterStatus,
) -> Result<bool, Error> {
    if cluster.status.as_ref() == Some(&status) {
        return Ok(false);
    }
    let api: Api<crate::ApiCluster> = Api::namespaced(ctx.client.clone(), namespace);
    let patch = serde_json::json!({
        "apiVersion": <crate::ApiCluster as kube::Resource>::api_version(&()),
        "kind": "PostgresCluster",
        "status": status,
    });
    api.patch_status(
        &cluster.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(Error::PatchStatus)?;
    Ok(true)
}

/// Publishes an Event on the cluster. A failure to publish is logged, not fatal: events
/// are for people, and the status carries the same facts.
pub(super) async fn publish(
    ctx: &Context,
    cluster: &PostgresCluster,
    type_: EventType,
    reason: &str,
    note: &str,
) {
    publish_about(ctx, cluster, type_, reason, note, None).await;
}

/// [`publish`], naming an instance's Pod as the Event's related object. The recorder folds
/// Events of the same reason and objects into one series (keeping the first note), so
/// naming the instance keeps, say, the restarts of two instances apart.
async fn publish_about(
    ctx: &Context,
    cluster: &PostgresCluster,
    type_: EventType,
    reason: &str,
    note: &str,
    instance: Option<&str>,
) {
    publish_as(ctx, cluster, type_, (reason, "Reconcile"), note, instance).await;
}

/// [`publish_about`] with the Event's action: the recorder keeps Events of one reason but
/// different actions apart (an instance down for one reason, then for another).
pub(super) async fn publish_as(
    ctx: &Context,
    cluster: &PostgresCluster,
    type_: EventType,
    (reason, action): (&str, &str),
    note: &str,
    instance: Option<&str>,
) {
    let secondary = instance.map(|name| k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".to_string()),
        kind: Some("Pod".to_string()),
        name: Some(name.to_string()),
        namespace: cluster.namespace(),
        ..Default::default()
    });
    // Every Event is a log line too (in the reconcile span: its cluster and namespace).
    match type_ {
        EventType::Normal => tracing::info!(reason, instance, "{note}"),
        EventType::Warning => tracing::warn!(reason, instance, "{note}"),
    }
    let event = Event {
        type_,
        reason: reason.to_string(),
        note: Some(note.chars().take(1000).collect()),
        action: action.to_string(),
        secondary,
    };
    if let Err(e) = ctx
        .recorder
        .publish(&event, &crate::reference(cluster))
        .await
    {
        tracing::warn!(cluster = %key(cluster), reason, error = %e, "failed to publish event");
    }
}

/// Publishes the Events a decision made, in their order.
pub(super) async fn publish_notes(ctx: &Context, cluster: &PostgresCluster, notes: &[Note]) {
    for note in notes {
        let names = (note.reason.as_str(), note.action.as_str());
        let about = note.instance.as_deref();
        publish_as(ctx, cluster, note.kind, names, &note.message, about).await;
    }
}
