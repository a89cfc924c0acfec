//! After the action, on a running PostgreSQL: synchronous standbys; on the primary its
//! slots, passwords, declared roles and databases and the poolers' look-up; everywhere the
//! configuration, and the restart the operator's rolling restart asks of this instance.

use super::observe::Seen;
use super::secrets::{read_secret, role_passwords, secret_text};
use super::watch::Inputs;
use super::{Error, Plan, Settings};
use crate::config::Mode;
use crate::error_chain;
use crate::instance::Instance;
use pgop_api::v1beta1::PostgresCluster;

/// Brings the running PostgreSQL in line with `cluster`'s spec and `plan`.
pub(super) async fn converge(
    inputs: &Inputs,
    settings: &Settings,
    instance: &Instance,
    cluster: &PostgresCluster,
    seen: &Seen,
    plan: &Plan,
) -> Result<(), Error> {
    let me = settings.pod_name.as_str();
    let manage = Error::ManageInstance;
    instance
        .set_synchronous(super::sync_spec(cluster), &plan.sync_standbys)
        .await
        .map_err(manage)?;
    if plan.primary.as_deref() == Some(me) {
        instance.ensure_slots(&plan.slots).await.map_err(manage)?;
        if instance.mode() == Mode::Primary {
            instance.apply_passwords().await.map_err(manage)?;
            let passwords = role_passwords(inputs, &cluster.spec.roles).await;
            instance
                .apply_roles(&cluster.spec.roles, &passwords)
                .await
                .map_err(manage)?;
            instance
                .apply_databases(&cluster.spec.databases)
                .await
                .map_err(manage)?;
            // The poolers look passwords up as pgop_pooler: with poolers, its password from
            // `<cluster>.pooler` (a Secret not made yet: the next pass); without, it is shut.
            // A failure is logged and tried again next pass; it holds nothing else back.
            let password = if cluster.spec.poolers.is_empty() {
                Ok(None)
            } else {
                read_secret(inputs, pgop_api::pooler::identity_name(&settings.cluster))
                    .await
                    .and_then(|s| secret_text(&s, "password"))
                    .map(Some)
            };
            match password {
                Ok(password) => {
                    if let Err(err) = instance.apply_pooler_auth(password.as_deref()).await {
                        tracing::warn!(error = %error_chain(&err), "the poolers' password look-up was not set up");
                    }
                }
                Err(err) => {
                    tracing::debug!(error = %error_chain(&err), "the poolers' Secret is not readable yet")
                }
            }
        }
    }
    let spec = &cluster.spec;
    let report = instance
        .apply_config(&spec.postgresql.parameters, &spec.postgresql.pg_hba)
        .await
        .map_err(manage)?;
    for bad in &report.invalid {
        tracing::warn!(parameter = %bad.name, reason = %bad.reason, "refused a parameter");
    }
    instance.applied_generation(cluster.metadata.generation);
    // Restarts happen only when the operator's rolling restart names this instance: one
    // instance at a time, standbys first, each back before the next (the restart
    // annotation too goes through the operator).
    if seen.status.restart_instance.as_deref() == Some(me) {
        let started = instance.status().await.postmaster_start_time;
        let requested = super::restart_requested(&seen.status, me, started.as_deref());
        if !report.pending_restart.is_empty() || requested {
            tracing::info!(pending = ?report.pending_restart, requested, "restarting PostgreSQL: the rolling restart names this instance");
            instance.restart().await.map_err(manage)?;
        }
    }
    Ok(())
}
