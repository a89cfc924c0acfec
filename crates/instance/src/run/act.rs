//! Acting on the plan: the one action [`super::plan`] chose for this pass (bootstrap,
//! start, step down, promote, clone, rejoin, re-clone, follow), carried out on the
//! [`Instance`].

use super::observe::{Seen, upstream_for};
use super::watch::Inputs;
use super::{
    Action, Error, FAILOVER_STEP_DOWN_BOUND, LeaseHold, Memory, Next, Plan, RESTORE_BACKOFF,
};
use crate::bootstrap::DataState;
use crate::config::Mode;
use crate::error_chain;
use crate::instance::{self, Instance};
use pgop_api::v1beta1::PostgresCluster;
use std::time::Instant;

/// Carries out `plan`'s action. `Some(next)` ends the pass there (`next` itself for
/// [`Action::Wait`]); `None` goes on to [`super::converge`].
#[allow(clippy::too_many_arguments)]
pub(super) async fn act(
    inputs: &Inputs,
    instance: &Instance,
    cluster: &PostgresCluster,
    seen: &Seen,
    plan: &Plan,
    recovery: Option<&instance::Recovery>,
    source: &Result<Option<crate::external::Source>, Error>,
    hold: &mut LeaseHold,
    memory: &mut Memory,
    next: Next,
) -> Result<Option<Next>, Error> {
    let manage = Error::ManageInstance;
    let source = || -> Result<&crate::external::Source, Error> {
        match source {
            Ok(Some(s)) => Ok(s),
            Ok(None) => Err(Error::ReplicaSource {
                source_name: String::new(),
                message: "the cluster is no replica cluster".into(),
            }),
            Err(e) => Err(Error::ReplicaSource {
                source_name: cluster
                    .spec
                    .replica
                    .as_ref()
                    .map(|r| r.source.clone())
                    .unwrap_or_default(),
                message: error_chain(e),
            }),
        }
    };
    match &plan.action {
        Action::Wait => return Ok(Some(next)),
        Action::Keep => {}
        Action::StepDown => {
            // Fenced by a failover (the operator lost this primary): bounded, so that a
            // partition from the standbys does not hold the Lease for the stop timeout.
            let failover = seen.status.phase == Some(pgop_api::cluster::ClusterPhase::FailingOver);
            let bound = failover.then_some(FAILOVER_STEP_DOWN_BOUND);
            tracing::info!(target = ?seen.status.target_primary, failover, "stepping down: another instance is to be the primary; checkpoint and clean shutdown");
            instance.step_down_within(bound).await.map_err(manage)?;
            hold.give_up().await;
            tracing::info!("stepped down; waiting for the new primary to be confirmed");
            return Ok(Some(Next::Soon));
        }
        Action::BootstrapPrimary => match recovery {
            Some(recovery) => {
                tracing::info!(source = %recovery.source.cluster, store = ?recovery.source, backup = ?recovery.backup_id, target = ?recovery.target, "bootstrapping a new primary by restoring a backup");
                match instance.bootstrap_recovery(recovery).await {
                    Ok(restored) => {
                        tracing::info!(backup = %restored.backup.backup_id, timeline = restored.timeline, lsn = %restored.lsn, "restored; running as the primary on a new timeline");
                        instance.set_bootstrap_error(None);
                        memory.bootstrap_failed = None;
                    }
                    Err(err) => {
                        let chain = error_chain(&err);
                        tracing::error!(error = %chain, retry_in = ?RESTORE_BACKOFF, "the restore failed; the data directory is empty again");
                        instance.set_bootstrap_error(Some(chain));
                        memory.bootstrap_failed = Some(Instant::now());
                        return Ok(Some(Next::After(RESTORE_BACKOFF)));
                    }
                }
            }
            None => {
                tracing::info!("bootstrapping a new primary with initdb");
                let result = instance.bootstrap_primary().await.map_err(manage);
                super::made(instance, memory, result)?;
            }
        },
        Action::StartPrimary => instance.start_as(Mode::Primary).await.map_err(manage)?,
        Action::StartStandby { primary } => {
            let upstream = upstream_for(inputs, instance, seen, primary).await?;
            instance
                .start_as(Mode::Standby { upstream })
                .await
                .map_err(manage)?;
        }
        Action::Promote => {
            use tracing::Instrument;
            // A span of the trace of the operator's pass that chose this instance
            // (status.targetPrimaryTrace, read strictly by pgop_telemetry).
            let parent = cluster
                .status
                .as_ref()
                .and_then(|s| s.target_primary_trace.as_deref())
                .and_then(pgop_telemetry::SpanContext::from_traceparent)
                .map(|c| c.traceparent());
            let span = tracing::info_span!(
                target: pgop_telemetry::TRACE_ONLY,
                "promote",
                traceparent = parent.as_deref(),
            );
            async {
                // First the synchronous standbys, so that the first commit as primary waits.
                let sync = super::sync_spec(cluster);
                instance
                    .set_synchronous(sync, &plan.sync_standbys)
                    .await
                    .map_err(manage)?;
                tracing::info!("promoting: the cluster status names this instance the primary");
                instance.promote().await.map_err(manage)
            }
            .instrument(span)
            .await?;
        }
        Action::Clone { primary } => {
            let upstream = upstream_for(inputs, instance, seen, primary).await?;
            if let DataState::OlderMajor(found) = seen.observed.data {
                // Its data is thrown away only for a primary that runs (upgraded).
                tracing::info!(found, %primary, "the data directory holds an older PostgreSQL major (the primary was upgraded): re-cloning once the primary answers");
                upstream
                    .probe_primary()
                    .await
                    .map_err(|e| manage(instance::Error::ProbePrimary(e)))?;
            }
            tracing::info!(%primary, "cloning the primary");
            let result = instance.bootstrap_standby(&upstream).await.map_err(manage);
            super::made(instance, memory, result)?;
        }
        Action::Rejoin { primary } if seen.observed.diverged => {
            tracing::warn!(%primary, timeline = ?seen.pg.timeline, replayed = ?seen.pg.replayed_lsn, "this standby replayed WAL past the point where the primary's timeline forked off its own, so it cannot follow: rewinding onto the primary's timeline");
            memory.diverged_since = None;
            let upstream = upstream_for(inputs, instance, seen, primary).await?;
            let how = instance.demote(&upstream).await.map_err(manage)?;
            tracing::info!(?how, "rejoined");
        }
        Action::Rejoin { primary } => {
            tracing::info!(%primary, "rejoining as a standby of the primary");
            let upstream = upstream_for(inputs, instance, seen, primary).await?;
            let how = instance.demote(&upstream).await.map_err(manage)?;
            tracing::info!(?how, "rejoined");
        }
        Action::Reclone { primary } => {
            tracing::warn!(%primary, "the primary removed WAL this standby still needs (standbys only stream): cloning it afresh");
            memory.wal_gone_since = None;
            let upstream = upstream_for(inputs, instance, seen, primary).await?;
            instance.reclone(&upstream).await.map_err(manage)?;
            tracing::info!("re-cloned");
        }
        Action::CloneSource => {
            let source = source()?;
            // Asked first, so that a source that refuses is named as such (and nothing is
            // begun); cleared by the first pass of the running designated primary.
            let options = instance.options();
            let app = crate::config::replica_application_name(&options.layout.instance);
            // An entry with a store alone has no server to ask: its store is read.
            let asked = if source.has_connection() {
                source
                    .identify(
                        &options.binaries,
                        options.run_as,
                        &app,
                        crate::external::IDENTIFY_TIMEOUT,
                    )
                    .await
                    .map(|_| ())
            } else {
                Ok(())
            };
            if let Err(refusal) = asked {
                instance.set_source_refusal(Some(crate::status::SourceRefusal::new(
                    refusal.reason(),
                    refusal.message(),
                )));
                let result: Result<(), Error> = Err(Error::ReplicaSource {
                    source_name: source.name().to_string(),
                    message: format!("{}: {}", refusal.reason(), refusal.message()),
                });
                return super::made(instance, memory, result).map(|()| None);
            }
            instance.set_source_refusal(None);
            tracing::info!(source = %source.name(), "bootstrapping the replica cluster: cloning its source");
            let result = instance.bootstrap_designated(source).await.map_err(manage);
            super::made(instance, memory, result)?;
            tracing::info!(source = %source.name(), "cloned; following the source as the designated primary");
        }
        Action::StartDesignated => {
            let source = source()?.clone();
            tracing::info!(source = %source.name(), "starting as the designated primary, following the source");
            instance
                .start_as(Mode::DesignatedPrimary {
                    source: Box::new(source),
                })
                .await
                .map_err(manage)?;
        }
        Action::RecloneSource => {
            let source = source()?;
            tracing::warn!(source = %source.name(), "the source removed WAL this designated primary still needs (it has no slot there): cloning it afresh");
            memory.wal_gone_since = None;
            instance.reclone_from_source(source).await.map_err(manage)?;
            tracing::info!("re-cloned from the source");
        }
        Action::FollowSource => {
            let source = source()?;
            tracing::info!(source = %source.name(), "following the replica cluster's source as its designated primary (never promoted)");
            instance.follow_source(source).await.map_err(manage)?;
        }
        Action::Follow { primary } => {
            tracing::info!(%primary, "following the primary");
            let upstream = upstream_for(inputs, instance, seen, primary).await?;
            instance.follow(&upstream).await.map_err(manage)?;
        }
    }
    Ok(None)
}
