//! A pass's observation: the cluster status, the primary it names and that primary's
//! address, what PostgreSQL reports, and the facts [`super::plan`] decides from.

use super::watch::Inputs;
use super::{Error, Memory, Observed};
use crate::config::Mode;
use crate::instance::Instance;
use crate::pg::Upstream;
use crate::status::PgRole;
use pgop_api::PostgresClusterStatus;
use pgop_api::instance_status::PgStatus;
use pgop_api::v1beta1::PostgresCluster;
use std::time::Instant;

/// What a pass saw.
pub(super) struct Seen {
    pub status: PostgresClusterStatus,
    /// The primary the status names: the target, else the current one.
    pub named: Option<String>,
    /// The primary's address, when another instance is the primary.
    pub upstream_of_primary: Option<Upstream>,
    /// What PostgreSQL reports now.
    pub pg: PgStatus,
    /// A standby that should stream from the confirmed primary and does not.
    pub stalled: bool,
    /// The facts the plan decides from.
    pub observed: Observed,
}

/// Observes the instance against `cluster`'s status, as `me`; the confirmations of a
/// divergence and of WAL gone upstream are kept in `memory` from one pass to the next.
pub(super) async fn observe(
    inputs: &Inputs,
    instance: &Instance,
    cluster: &PostgresCluster,
    me: &str,
    memory: &mut Memory,
    source: &Result<Option<crate::external::Source>, Error>,
) -> Result<Seen, Error> {
    let status = cluster.status.clone().unwrap_or_default();
    let named = status
        .target_primary
        .clone()
        .or_else(|| status.current_primary.clone());
    // The primary's address, when another instance is the primary.
    let upstream_of_primary = match named.as_deref() {
        Some(primary) if primary != me => Some(super::upstream(inputs, instance, primary).await?),
        _ => None,
    };
    let pg = instance.status().await;
    let follows_primary = upstream_of_primary.as_ref().is_some_and(|u| {
        instance.mode()
            == Mode::Standby {
                upstream: u.clone(),
            }
    });
    // A standby that should stream from the confirmed primary and does not: it may have
    // replayed WAL the primary never had, and then it can only rejoin by pg_rewind.
    let stalled = pg.role == PgRole::Replica
        && follows_primary
        && !pg.streaming
        && named.is_some()
        && status.current_primary == named;
    let diverged = match upstream_of_primary.as_ref() {
        Some(upstream) if stalled => super::diverged_from(upstream, &pg).await,
        _ => false,
    };
    let diverged = super::confirmed(diverged, &mut memory.diverged_since, Instant::now());
    // A standby that does not stream because the primary removed WAL it still needs (its
    // slot was made after that WAL, or the standby was down long): it can only be cloned.
    // So can a designated primary whose source did (it has no slot there).
    // (Not one that reads its source's store: PostgreSQL fetches that WAL there.)
    let designated =
        matches!(instance.mode(), Mode::DesignatedPrimary { source } if !source.has_archive());
    let upstream_wal_gone = super::confirmed(
        (stalled || (designated && !pg.streaming)) && instance.upstream_wal_gone(),
        &mut memory.wal_gone_since,
        Instant::now(),
    );
    if instance.pid().is_some() {
        memory.crashed_before_start = None;
    }
    // A designated primary follows the source the spec names now; while that cannot be
    // made ready (a Secret gone), what runs is left as it is.
    let mode = instance.mode();
    let follows_source = match (source, &mode) {
        (Ok(Some(s)), Mode::DesignatedPrimary { source }) => s == source.as_ref(),
        (Err(_), Mode::DesignatedPrimary { .. }) => true,
        _ => false,
    };
    let observed = Observed {
        data: instance.data_state(),
        running: instance.pid().is_some(),
        standby_signal: instance.has_standby_signal(),
        role: pg.role,
        follows_primary,
        diverged,
        upstream_wal_gone,
        held_off: instance
            .crashed_at()
            .or(memory.crashed_before_start)
            .is_some_and(|at| at.elapsed() < super::crash_hold_off(cluster)),
        replica_cluster: replica_cluster(cluster),
        follows_source,
        cloned_from_source: cluster.spec.replica.is_some()
            && cluster.status.as_ref().is_some_and(|s| s.replica.is_some()),
    };
    Ok(Seen {
        status,
        named,
        upstream_of_primary,
        pg,
        stalled,
        observed,
    })
}

/// Whether the cluster follows its source now: `spec.replica` enabled, or its promotion
/// asked for (`enabled: false`) but not yet approved by the operator
/// (`status.replica.promotion`).
pub(super) fn replica_cluster(cluster: &PostgresCluster) -> bool {
    pgop_api::replica::ReplicaSpec::follows_now(
        cluster.spec.replica.as_ref(),
        cluster.status.as_ref(),
    )
}

/// The primary's address for `primary`: the one observed when it is the primary the status
/// names, else resolved now.
pub(super) async fn upstream_for(
    inputs: &Inputs,
    instance: &Instance,
    seen: &Seen,
    primary: &str,
) -> Result<Upstream, Error> {
    match &seen.upstream_of_primary {
        Some(u) if seen.named.as_deref() == Some(primary) => Ok(u.clone()),
        _ => super::upstream(inputs, instance, primary).await,
    }
}
