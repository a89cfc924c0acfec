//! The decisions of a pass, from what it observed (pure: no client, no context, no clock but
//! the `now` it is given, no randomness but new passwords and keys;
//! `a_decision_reads_and_writes_nothing` below checks the sources). [`super::write`]
//! carries them out.
//!
//! The steps of a pass:
//! - [`valid`], [`held`]: steps 2 and 3's checks of the spec, and [`refused`]: the status
//!   and Event of a spec they refuse (or of a cluster being deleted, [`deleting`]);
//! - [`instances`]: step 4's serials ([`serials`]) and the children built for them;
//! - [`hibernate()`], [`upgrading()`]: the passes that take the Pods down instead of steps
//!   5 to 11 ([`hibernation`], [`upgrade`]), as [`Down`] values;
//! - [`credentials`]: step 6's passwords and certificates ([`certificates`]) from the
//!   user's Secrets as read, for an ordinary pass and those that take the Pods down;
//! - [`ordinary()`]: steps 5 to 11 of an ordinary pass, from the [`super::world::World`]
//!   it read and what steps 1 to 4 [`Settled`], as one [`Ordinary`] value, through
//!   [`rollout()`] (step 7: the next step of a rolling update, [`rolling`], or a
//!   switchover first), [`status()`] (step 8: the status, [`computed`], and the Events of
//!   its changes), [`requests()`] (the request annotations to remove after it) and
//!   [`next_pass`] (when to look at the cluster again).
//!
//! What they decide with: [`roles`] (failover, switchover and their completion),
//! [`storage`] (the volumes' size, auto-grow), [`nodes`] (a drain's switchover, a volume
//! lost with its node), [`immutable`] (what a running cluster cannot change).

pub mod certificates;
pub mod computed;
pub(super) mod credentials;
mod down;
pub mod hibernation;
pub mod immutable;
pub(super) mod instances;
pub mod nodes;
mod ordinary;
#[cfg(test)]
mod passes;
pub mod replica;
mod requests;
pub mod roles;
pub mod rolling;
mod rollout;
pub mod serials;
mod status;
pub mod storage;
pub mod upgrade;

pub(super) use down::{Down, DownInput, hibernate, upgrading};
pub(super) use ordinary::{Ordinary, Settled, ordinary, volume_usage};
pub(super) use requests::{Requests, requests};
pub(super) use rollout::{Rollout, RolloutInput, rollout};
pub(super) use status::{StatusInput, set_volumes_resized, status};

use super::notes::Note;
use super::pass::{POLL, POLL_TRANSITION, RESYNC};
use super::world;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::events::EventType;
use pgop_api::PostgresClusterStatus;
use pgop_api::cluster::ClusterPhase;
use pgop_api::v1beta1::PostgresCluster;
use std::time::Duration;

/// Step 2: the spec with its defaults, or why it is refused (the message names the fields
/// as v1beta1, the stored version, has them; the rules are v1alpha1's).
pub(super) fn valid(cluster: &PostgresCluster) -> Result<PostgresCluster, String> {
    let mut defaulted = cluster.clone();
    defaulted.spec = pgop_api::v1beta1::with_defaults(cluster.spec.clone());
    match pgop_api::validation::validate_cluster(&pgop_api::PostgresCluster::from(
        defaulted.clone(),
    )) {
        Ok(()) => Ok(defaulted),
        Err(errors) => Err(pgop_api::v1beta1::with_field_paths(
            &pgop_api::validation::summary(&errors),
        )),
    }
}

/// Step 3's check, once the children are read: the major the data holds and the one the
/// spec wants, with `defaulted`'s volumes at least as large as auto-grow made them
/// ([`storage::larger`]); or why the spec is refused: a size below what the volumes hold,
/// or a major other than the data's (the validating webhook refuses both changes; without
/// it, they are caught here, before any Pod is rebuilt). A cluster whose instances never
/// ran holds the spec's major.
pub(super) fn held(
    cluster: &PostgresCluster,
    defaulted: &mut PostgresCluster,
    observed: &world::Observed,
) -> Result<(i32, i32), String> {
    if let Some(grown) = cluster.status.as_ref().and_then(|s| s.auto_grow.as_ref()) {
        defaulted.spec.storage.size = storage::larger(&defaulted.spec.storage.size, &grown.size);
    }
    let wanted = defaulted
        .spec
        .postgresql
        .version
        .unwrap_or(pgop_api::cluster::DEFAULT_POSTGRES_VERSION);
    let held = immutable::held_major(cluster.status.as_ref(), &observed.pods).unwrap_or(wanted);
    match immutable::storage_shrink(&defaulted.spec, &observed.pvcs)
        .or_else(|| immutable::major_change(&defaulted.spec, held))
    {
        Some(error) => Err(pgop_api::validation::summary(&[error])),
        None => Ok((held, wanted)),
    }
}

/// Whether `spec.hibernate` takes this pass instead of steps 5 to 11 (a change of primary
/// under way finishes first).
pub(super) fn hibernates(cluster: &PostgresCluster, defaulted: &PostgresCluster) -> bool {
    let changing_primary = cluster
        .status
        .as_ref()
        .is_some_and(|s| s.target_primary != s.current_primary);
    defaulted.spec.hibernate && !changing_primary
}

/// A spec refused in steps 2 and 3 (`message` names the fields): phase Invalid with the
/// reason in the status, and an InvalidSpec Warning, published only when the status
/// changed, so that a pass over an unchanged refused spec says nothing twice.
pub(super) fn refused(
    cluster: &PostgresCluster,
    message: &str,
    now: Time,
) -> (PostgresClusterStatus, Note) {
    let status = computed::invalid(cluster, message, now);
    (
        status,
        Note::new(EventType::Warning, "InvalidSpec", message),
    )
}

/// A cluster being deleted: phase Deleting, and an Event once.
pub(super) fn deleting(cluster: &PostgresCluster) -> (PostgresClusterStatus, Note) {
    let mut status = cluster.status.clone().unwrap_or_default();
    status.phase = Some(ClusterPhase::Deleting);
    let note = Note::new(
        EventType::Normal,
        "Deleting",
        "the cluster is being deleted; the garbage collector removes its children",
    );
    (status, note)
}

/// When to look at the cluster again if nothing wakes it first (a change of the cluster
/// or a child, from the watches; a significant change of an instance, from the prober):
/// - during a failover or switchover, every [`POLL_TRANSITION`];
/// - every [`POLL`] while a decision waits on the clock (`timed`): the primary is
///   unavailable and a standby answers (the failover delay runs), a rollout step is under
///   way (its health gate), an instance Pod is unschedulable (its grace);
/// - else after [`RESYNC`], or sooner at the first of `deadlines`: the next scheduled
///   backup, and when WAL positions held back from the status are due (at most
///   [`computed::POSITIONS_INTERVAL`] after the last ones published).
///
/// A primary that is unavailable with no standby answering waits on no clock: nothing can
/// take over until an instance answers, and the prober wakes the cluster then.
pub(super) fn next_pass(
    in_transition: bool,
    timed: bool,
    deadlines: [Option<Duration>; 2],
) -> Duration {
    if in_transition {
        return POLL_TRANSITION;
    }
    if timed {
        return POLL;
    }
    deadlines.into_iter().flatten().fold(RESYNC, Duration::min)
}

#[cfg(test)]
mod tests {
    use super::next_pass;
    use crate::cluster::pass::{POLL, POLL_TRANSITION, RESYNC};
    use std::time::Duration;

    /// These modules decide only: they name no client, no context and await nothing.
    #[test]
    fn a_decision_reads_and_writes_nothing() {
        let sources = [
            ("decide/certificates.rs", include_str!("certificates.rs")),
            ("decide/computed.rs", include_str!("computed.rs")),
            ("decide/credentials.rs", include_str!("credentials.rs")),
            ("decide/down.rs", include_str!("down.rs")),
            ("decide/hibernation.rs", include_str!("hibernation.rs")),
            ("decide/immutable.rs", include_str!("immutable.rs")),
            ("decide/instances.rs", include_str!("instances.rs")),
            ("decide/mod.rs", include_str!("mod.rs")),
            ("decide/nodes.rs", include_str!("nodes.rs")),
            ("decide/ordinary.rs", include_str!("ordinary.rs")),
            ("decide/passes.rs", include_str!("passes.rs")),
            ("decide/replica.rs", include_str!("replica.rs")),
            ("decide/requests.rs", include_str!("requests.rs")),
            ("decide/roles.rs", include_str!("roles.rs")),
            ("decide/rolling.rs", include_str!("rolling.rs")),
            ("decide/rollout.rs", include_str!("rollout.rs")),
            ("decide/serials.rs", include_str!("serials.rs")),
            ("decide/status.rs", include_str!("status.rs")),
            ("decide/storage.rs", include_str!("storage.rs")),
            ("decide/upgrade.rs", include_str!("upgrade.rs")),
        ];
        let here = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/cluster/decide");
        let files = std::fs::read_dir(&here)
            .map(|d| {
                d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .filter(|f| f.ends_with(".rs"))
                    .count()
            })
            .unwrap_or(0);
        assert_eq!(
            files,
            sources.len(),
            "every source file of {} is checked here",
            here.display()
        );
        for (file, source) in sources {
            let code = source.split("#[cfg(test)]").next().unwrap_or(source);
            for word in ["Context", "kube::Client", "Api<", "Api::", ".await", "ctx."] {
                let found = code
                    .lines()
                    .filter(|l| !l.trim_start().starts_with("//"))
                    .any(|l| l.contains(word));
                assert!(!found, "{file} uses {word}");
            }
        }
    }

    #[test]
    fn a_cluster_is_looked_at_again_by_what_waits_on_the_clock() {
        assert_eq!(next_pass(true, true, [None, None]), POLL_TRANSITION);
        assert_eq!(
            next_pass(true, false, [Some(Duration::from_secs(5)), None]),
            POLL_TRANSITION
        );
        assert_eq!(
            next_pass(false, true, [None, Some(Duration::from_millis(10))]),
            POLL
        );
        assert_eq!(next_pass(false, false, [None, None]), RESYNC);
        let (soon, sooner) = (Duration::from_secs(7), Duration::from_secs(3));
        assert_eq!(next_pass(false, false, [Some(soon), None]), soon);
        assert_eq!(next_pass(false, false, [None, Some(soon)]), soon);
        assert_eq!(next_pass(false, false, [Some(soon), Some(sooner)]), sooner);
        assert_eq!(next_pass(false, false, [Some(RESYNC * 10), None]), RESYNC);
    }
}
