//! The reads of a pass beside [`super::dereference`]: the instances' `/pg/status` (from
//! the [`super::prober`] or probed now), the cluster's PostgresBackups, the recovery
//! source, the volumes of unplaced instances, and the Secrets of the user's that the spec
//! names; [`reads`] makes those of an ordinary pass, once each. Never
//! decides and never writes (but tells the prober which Pods to poll).

pub mod cache;
pub mod dereference;
pub mod probe;
pub mod prober;

use super::error::Error;
use super::world::Reads;
use super::{nodes, world};
use crate::{Context, backup};
use k8s_openapi::api::core::v1::{PersistentVolume, Secret};
use kube::ResourceExt;
use kube::api::Api;
use pgop_api::cluster::ClusterPhase;
use pgop_api::cluster::RecoverySource;
use pgop_api::v1beta1::PostgresCluster;
use std::collections::BTreeMap;
use tracing::Instrument;

/// Step 3: the cluster's children ([`dereference::read`]).
pub(super) async fn children(
    ctx: &Context,
    namespace: &str,
    name: &str,
) -> Result<dereference::Observed, Error> {
    let (observed, _) = dereference::read(
        &ctx.client,
        ctx.caches.as_ref(),
        &ctx.expectations,
        namespace,
        name,
    )
    .instrument(tracing::info_span!(target: pgop_telemetry::TRACE_ONLY, "read"))
    .await?;
    Ok(observed)
}

/// Every read of steps 5 to 11 of an ordinary pass, in this order: the instances'
/// `/pg/status` (step 5), the Secrets of the user's that the spec names (step 6), the
/// cluster's PostgresBackups, the recovery source, and the volumes of unplaced instances.
pub(super) async fn reads(
    ctx: &Context,
    cluster: &PostgresCluster,
    defaulted: &PostgresCluster,
    namespace: &str,
    named: &[(String, i32)],
    observed: &dereference::Observed,
) -> Result<Reads, Error> {
    let probes = probes(ctx, cluster, observed)
        .instrument(tracing::info_span!(target: pgop_telemetry::TRACE_ONLY, "probe"))
        .await;
    let user_secrets = user_secrets(ctx, defaulted, namespace)
        .instrument(tracing::info_span!(target: pgop_telemetry::TRACE_ONLY, "credentials"))
        .await;
    let backups = backups_of(ctx, cluster, namespace).await?;
    let recovery = recovery_source(ctx, defaulted, namespace).await;
    let unplaced_volumes = unplaced_volumes(ctx, observed, named).await?;
    Ok(Reads {
        probes,
        user_secrets,
        backups,
        recovery,
        unplaced_volumes,
    })
}

/// Step 5's probes: from the prober (a snapshot it keeps fresh, or fresh probes during a
/// change of primary) after telling it the cluster's Pods; without a prober, probed now.
pub(super) async fn probes(
    ctx: &Context,
    cluster: &PostgresCluster,
    observed: &dereference::Observed,
) -> BTreeMap<String, probe::Probe> {
    let Some(prober) = &ctx.prober else {
        return probe::probe_all(&observed.pods).await;
    };
    let r = kube::runtime::reflector::ObjectRef::from_obj(cluster);
    prober.track(&r, prober::instances_of(&observed.pods));
    let changing = cluster
        .status
        .as_ref()
        .is_some_and(|s| s.target_primary != s.current_primary);
    if changing {
        return prober.probe_now(&r).await;
    }
    let snapshot = prober.snapshot(&r).await;
    if primary_lost(cluster, &snapshot) {
        prober.probe_now(&r).await
    } else {
        snapshot
    }
}

/// Whether a cluster that served has lost its primary in `probes`: a failover may be
/// chosen in this pass, and it must compare the standbys' WAL as it is now, after the
/// primary stopped. The prober's snapshot can be up to a polling interval old: a standby
/// that looked behind then may have received the last commits since, and promoting
/// another one would throw them away (and leave that standby on a timeline it cannot
/// follow).
pub(super) fn primary_lost(
    cluster: &PostgresCluster,
    probes: &BTreeMap<String, probe::Probe>,
) -> bool {
    let Some(status) = &cluster.status else {
        return false;
    };
    let served = matches!(
        status.phase,
        Some(ClusterPhase::Ready | ClusterPhase::Degraded)
    );
    let Some(primary) = status.current_primary.as_deref() else {
        return false;
    };
    served
        && !probes
            .get(primary)
            .and_then(probe::Probe::status)
            .is_some_and(|s| s.role.leads())
}

/// The cluster's PostgresBackups when it has a backup section (`None` otherwise): from the
/// backup controller's cache once it is filled, else listed.
pub(super) async fn backups_of(
    ctx: &Context,
    cluster: &PostgresCluster,
    namespace: &str,
) -> Result<Option<Vec<pgop_api::backup::PostgresBackup>>, Error> {
    if cluster.spec.backup.is_none() {
        return Ok(None);
    }
    let name = cluster.name_any();
    let cached = ctx
        .caches
        .as_ref()
        .and_then(|c| c.backups.as_ref())
        .filter(|store| {
            futures::FutureExt::now_or_never(store.wait_until_ready()).is_some_and(|r| r.is_ok())
        });
    let mine = match cached {
        Some(store) => store
            .state_filter(|b| {
                b.metadata.namespace.as_deref() == Some(namespace) && b.spec.cluster.name == name
            })
            .iter()
            .map(|b| pgop_api::backup::PostgresBackup::clone(b))
            .collect(),
        None => {
            let api: Api<pgop_api::backup::PostgresBackup> =
                Api::namespaced(ctx.client.clone(), namespace);
            let all = api
                .list(&kube::api::ListParams::default())
                .await
                .map_err(Error::ListBackups)?
                .items;
            backup::cluster::of_cluster(&all, &name)
                .into_iter()
                .cloned()
                .collect()
        }
    };
    Ok(Some(mine))
}

/// The recovery source of a restored cluster (`spec.bootstrap.recovery`), resolved once:
/// `None` when there is nothing to resolve (no recovery, or the status names its source),
/// else the source or why it cannot be resolved yet.
pub(super) async fn recovery_source(
    ctx: &Context,
    cluster: &PostgresCluster,
    namespace: &str,
) -> Option<Result<Option<RecoverySource>, String>> {
    let recovering = cluster
        .spec
        .bootstrap
        .as_ref()
        .is_some_and(|b| b.recovery.is_some());
    let known = cluster
        .status
        .as_ref()
        .is_some_and(|s| s.recovery_source.is_some());
    if !recovering || known {
        return None;
    }
    Some(backup::cluster::resolve_recovery_source(&ctx.client, namespace, cluster).await)
}

/// The volumes of the planned instances whose Pod is not placed on a node and whose
/// claim's node is missing (or not recorded): the instance and its PersistentVolume, for
/// the decision whether the volume was lost with its node (`decide::nodes::lost_volume`). Reads
/// a PersistentVolume only for such a claim, so a pass over placed Pods reads none.
pub(super) async fn unplaced_volumes(
    ctx: &Context,
    observed: &dereference::Observed,
    named: &[(String, i32)],
) -> Result<Vec<(String, PersistentVolume)>, Error> {
    let mut found = Vec::new();
    if !ctx.nodes.known() {
        return Ok(found);
    }
    let volumes: Api<PersistentVolume> = Api::all(ctx.client.clone());
    for (instance, _) in named {
        let placed = observed
            .pods
            .iter()
            .find(|p| p.name_any() == *instance)
            .is_some_and(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some());
        if placed {
            continue;
        }
        let Some(claim) = observed.pvcs.iter().find(|c| c.name_any() == *instance) else {
            continue;
        };
        let selected = claim.annotations().get(nodes::SELECTED_NODE);
        if selected.is_some_and(|n| ctx.nodes.state(n) != nodes::NodeState::Missing) {
            continue;
        }
        let Some(volume) = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()) else {
            continue;
        };
        if let Some(pv) = volumes.get_opt(volume).await.map_err(Error::ReadVolume)? {
            found.push((instance.clone(), pv));
        }
    }
    Ok(found)
}

/// Step 6's reads: the Secrets of the user's that the spec names (the app's and, with
/// `superuserAccess`, the superuser's password, a server certificate, client
/// authorities), each as read or why not; `decide::credentials` checks what they hold.
pub(super) async fn user_secrets(
    ctx: &Context,
    defaulted: &PostgresCluster,
    namespace: &str,
) -> world::UserSecrets {
    let read = async |name: Option<&str>| {
        let name = name?;
        Some(world::UserSecret {
            name: name.to_string(),
            read: Api::<Secret>::namespaced(ctx.client.clone(), namespace)
                .get_opt(name)
                .await
                .map_err(|e| format!("cannot be read: {e}"))
                .and_then(|found| found.ok_or_else(|| "does not exist".to_string())),
        })
    };
    let [app, superuser, server, client_ca] = world::UserSecrets::names(&defaulted.spec);
    world::UserSecrets::from_reads([
        read(app).await,
        read(superuser).await,
        read(server).await,
        read(client_ca).await,
    ])
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_failover_is_chosen_on_fresh_probes_once_the_primary_is_lost() {
        use crate::cluster::observe::probe::Probe;
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
        assert!(!super::primary_lost(&ready, &probes(answer("primary"))));
        assert!(super::primary_lost(&ready, &probes(answer("stopped"))));
        assert!(super::primary_lost(
            &ready,
            &probes(Probe::Unreachable("refused".into()))
        ));
        assert!(super::primary_lost(
            &cluster("Degraded", "db-1"),
            &BTreeMap::from([("db-2".to_string(), answer("replica"))])
        ));
        // A cluster still bootstrapping has no primary to lose yet.
        assert!(!super::primary_lost(
            &cluster("Creating", "db-1"),
            &probes(answer("stopped"))
        ));
    }
}
