//! A replica cluster's `status.replica` and its ReplicaFollowing condition, from what the
//! designated primary's manager reports (`/pg/status`: its WAL receiver, the lag behind
//! the source, and why the source refuses it when it does not stream).

use crate::cluster::world::Probe;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::events::EventType;
use pgop_api::PostgresClusterStatus;
use pgop_api::cluster_status::{ReplicaPromotion, ReplicaStatus};
use pgop_api::conditions::{REPLICA_FOLLOWING, REPLICA_PROMOTED, new_condition, set_condition};
use pgop_api::instance_status::PgRole;
use pgop_api::replica::ReplicaSpec;
use pgop_api::v1beta1::PostgresCluster;
use std::collections::BTreeMap;

/// Sets `status.replica`, ReplicaFollowing and ReplicaPromoted for a replica cluster, and
/// for one promoted from it (nothing for another cluster). `old` is the status before this
/// pass: while `status`'s positions are held back (`positionsObservedAt` unchanged), so
/// are the replica's.
pub fn set_replica(
    cluster: &PostgresCluster,
    probes: &BTreeMap<String, Probe>,
    old: Option<&PostgresClusterStatus>,
    status: &mut PostgresClusterStatus,
    now: &Time,
) {
    let Some(replica) = cluster.spec.replica.as_ref() else {
        return;
    };
    let previous = old.and_then(|s| s.replica.as_ref());
    let designated = status.current_primary.clone();
    let reported = designated
        .as_ref()
        .and_then(|d| probes.get(d))
        .and_then(Probe::status);
    match previous.and_then(|p| p.promotion.as_ref()) {
        // Created as an ordinary cluster: nothing to follow, nothing to promote.
        None if !replica.enabled && previous.is_none() => return,
        None => {}
        Some(promotion) => {
            let mut promotion = promotion.clone();
            if promotion.completed_at.is_none()
                && reported.is_some_and(|s| s.role == PgRole::Primary)
            {
                promotion.completed_at = Some(now.clone());
            }
            let done = promotion.completed_at.is_some();
            status.replica = previous.map(|p| ReplicaStatus {
                streaming: false,
                promotion: Some(promotion),
                ..p.clone()
            });
            status.conditions.retain(|c| c.type_ != REPLICA_FOLLOWING);
            let who = designated.as_deref().unwrap_or("(none)");
            let (reason, message) = if done {
                (
                    "Promoted",
                    format!(
                        "{who} was promoted: the cluster takes writes and no longer follows {}",
                        replica.source
                    ),
                )
            } else {
                (
                    "Promoting",
                    format!(
                        "{who} is being promoted: the cluster stops following {}",
                        replica.source
                    ),
                )
            };
            set(
                status,
                cluster,
                REPLICA_PROMOTED,
                done,
                reason,
                message,
                now,
            );
            return;
        }
    }
    let pg = reported.filter(|s| s.role == PgRole::DesignatedPrimary);
    let upstream = pg.and_then(|s| s.upstream.as_ref());
    // Also before the first clone: the manager asks the source first.
    let refusal = reported
        .and_then(|s| s.upstream.as_ref())
        .and_then(|u| u.refusal.as_ref());
    let mode = mode_of(cluster, &replica.source);
    let archive_only = mode == ARCHIVE;
    let mut report = ReplicaStatus {
        source: replica.source.clone(),
        designated_primary: designated.clone(),
        mode: Some(mode.to_string()),
        streaming: pg.is_some_and(|s| s.streaming),
        last_restored_wal: upstream.and_then(|u| u.restored_wal.clone()),
        last_restored_at: upstream.and_then(|u| u.restored_at.clone()),
        source_end_lsn: upstream.and_then(|u| u.end_lsn.clone()),
        received_lsn: pg.and_then(|s| s.received_lsn.clone()),
        replayed_lsn: pg.and_then(|s| s.replayed_lsn.clone()),
        lag_bytes: upstream.and_then(|u| u.lag_bytes),
        lag_seconds: upstream
            .and_then(|u| u.lag_seconds)
            .map(|s| s.max(0.0).floor() as i64),
        refusal_reason: refusal.map(|r| r.reason.clone()),
        refusal_message: refusal.map(|r| r.message.clone()),
        last_message_at: upstream.and_then(|u| u.last_message_at.clone()),
        promotion: None,
    };
    // While the source does not answer (no WAL receiver), what was last known of it stays.
    if let Some(previous) = previous {
        let r = &mut report;
        r.source_end_lsn = r.source_end_lsn.take().or(previous.source_end_lsn.clone());
        r.lag_bytes = r.lag_bytes.or(previous.lag_bytes);
        r.lag_seconds = r.lag_seconds.or(previous.lag_seconds);
        r.last_message_at = r
            .last_message_at
            .take()
            .or(previous.last_message_at.clone());
        r.received_lsn = r.received_lsn.take().or(previous.received_lsn.clone());
        r.replayed_lsn = r.replayed_lsn.take().or(previous.replayed_lsn.clone());
        r.last_restored_wal = r
            .last_restored_wal
            .take()
            .or(previous.last_restored_wal.clone());
        r.last_restored_at = r
            .last_restored_at
            .take()
            .or(previous.last_restored_at.clone());
    }
    let held_back = old.is_some_and(|o| o.positions_observed_at == status.positions_observed_at);
    if let Some(previous) = previous
        && held_back
        && previous.without_positions() == report.without_positions()
    {
        report = previous.clone();
    }
    let source = &replica.source;
    let who = designated.as_deref().unwrap_or("(none yet)");
    // The bound `maxLagSeconds`, when the lag reported is above it.
    let over_bound = match (
        replica.max_lag_seconds,
        upstream.and_then(|u| u.lag_seconds),
    ) {
        (Some(max), Some(lag)) if lag > f64::from(max) => Some(max),
        _ => None,
    };
    let (ok, reason, message) = match pg {
        _ if refusal.is_some() => {
            let r = refusal.map(|r| (r.reason.as_str(), r.message.as_str()));
            let (reason, said) = r.unwrap_or_default();
            (
                false,
                reason_of(reason),
                format!("{source} refuses {who}: {said}"),
            )
        }
        None => (
            false,
            "DesignatedPrimaryDown",
            match reported.and_then(|s| s.bootstrap_error.as_deref()) {
                Some(error) => format!("{who} could not be cloned from {source}: {error}"),
                None => format!(
                    "the designated primary {who} does not run as one (yet): nothing follows {source}"
                ),
            },
        ),
        Some(_) if archive_only => match over_bound {
            Some(max) => (
                false,
                "LagOverBound",
                format!(
                    "{who} restores {source}'s WAL from its store but replays more than spec.replica.maxLagSeconds ({max} s) behind it"
                ),
            ),
            None => (
                true,
                "Archive",
                format!(
                    "{who} follows {source} through its store (last WAL restored: {})",
                    report.last_restored_wal.as_deref().unwrap_or("none yet")
                ),
            ),
        },
        Some(s) if !s.streaming => (
            false,
            "NotStreaming",
            format!("{who} does not stream from {source} (its WAL receiver is connecting)"),
        ),
        Some(_) => match over_bound {
            Some(max) => (
                false,
                "LagOverBound",
                format!(
                    "{who} streams from {source} but replays more than spec.replica.maxLagSeconds ({max} s) behind it"
                ),
            ),
            None => (true, "Streaming", format!("{who} streams from {source}")),
        },
    };
    // A promotion asked for (`enabled: false`) and not approved yet: approved, or refused
    // (the cluster then goes on following).
    if !replica.enabled {
        match promotion_refused(replica, &report) {
            Some(why) => {
                let message = format!("the promotion of this replica cluster is refused: {why}");
                set(
                    status,
                    cluster,
                    REPLICA_PROMOTED,
                    false,
                    "PromotionRefused",
                    message,
                    now,
                );
            }
            None => {
                // Through a store alone, caught up with it is as far as it can get.
                let caught_up = report.streaming || (archive_only && report.lag_seconds == Some(0));
                report.promotion = Some(ReplicaPromotion {
                    approved_at: now.clone(),
                    forced: !caught_up,
                    last_lag_seconds: report.lag_seconds,
                    completed_at: None,
                });
                let message = format!(
                    "{who} is being promoted: the cluster stops following {source}{}",
                    if report.streaming {
                        String::new()
                    } else if archive_only {
                        format!(
                            " at the end of what its store holds ({}){}: the source's WAL not archived yet is not here",
                            report
                                .last_restored_wal
                                .as_deref()
                                .unwrap_or("no WAL restored"),
                            if caught_up {
                                ""
                            } else {
                                ", not caught up with it (forced)"
                            }
                        )
                    } else {
                        format!(
                            " while not streaming from it (forced): the source's commits after {} are not here",
                            report
                                .last_message_at
                                .as_deref()
                                .unwrap_or("its last message")
                        )
                    }
                );
                set(
                    status,
                    cluster,
                    REPLICA_PROMOTED,
                    false,
                    "Promoting",
                    message,
                    now,
                );
                status.replica = Some(report);
                status.conditions.retain(|c| c.type_ != REPLICA_FOLLOWING);
                return;
            }
        }
    }
    status.replica = Some(report);
    set(status, cluster, REPLICA_FOLLOWING, ok, reason, message, now);
}

/// The Event of a change of ReplicaPromoted: `ReplicaPromotionRefused` (a Warning, again
/// when its message changes), `ReplicaPromotionStarted` (a Warning when forced),
/// `ReplicaPromoted`.
pub fn promotion_event(
    old: Option<&PostgresClusterStatus>,
    new: &PostgresClusterStatus,
) -> Option<(EventType, &'static str, String)> {
    use pgop_api::conditions::find_condition;
    let before = old.and_then(|s| find_condition(&s.conditions, REPLICA_PROMOTED));
    let after = find_condition(&new.conditions, REPLICA_PROMOTED)?;
    if before.is_some_and(|b| b.reason == after.reason && b.message == after.message) {
        return None;
    }
    let forced = new
        .replica
        .as_ref()
        .and_then(|r| r.promotion.as_ref())
        .is_some_and(|p| p.forced);
    match after.reason.as_str() {
        "PromotionRefused" => Some((
            EventType::Warning,
            "ReplicaPromotionRefused",
            after.message.clone(),
        )),
        "Promoting" if before.is_none_or(|b| b.reason != after.reason) => Some((
            if forced {
                EventType::Warning
            } else {
                EventType::Normal
            },
            "ReplicaPromotionStarted",
            after.message.clone(),
        )),
        "Promoted" if before.is_none_or(|b| b.reason != after.reason) => {
            Some((EventType::Normal, "ReplicaPromoted", after.message.clone()))
        }
        _ => None,
    }
}

/// Why a promotion may not happen now (`None`: it may): nothing of the source here, or
/// a lag above `promotionMaxLagSeconds` (or none ever recorded while it asks for one).
fn promotion_refused(replica: &ReplicaSpec, report: &ReplicaStatus) -> Option<String> {
    if report.received_lsn.is_none() && report.replayed_lsn.is_none() {
        return Some(
            "nothing of the source was ever cloned here: a promotion would start an empty database"
                .into(),
        );
    }
    let bound = replica.promotion_max_lag_seconds?;
    match report.lag_seconds {
        Some(lag) if lag <= i64::from(bound) => None,
        Some(lag) => Some(format!(
            "the lag last recorded, {lag} s, is above spec.replica.promotionMaxLagSeconds ({bound} s); raise or remove it to promote anyway"
        )),
        None => Some(format!(
            "no lag behind the source was ever recorded, and spec.replica.promotionMaxLagSeconds asks for at most {bound} s; raise or remove it to promote anyway"
        )),
    }
}

/// `status.replica.mode` for an archive-only source.
const ARCHIVE: &str = "archive";

/// How the cluster follows entry `source`: `streaming` (a connection), `archive` (a store
/// alone) or `streamingWithArchive` (both).
fn mode_of(cluster: &PostgresCluster, source: &str) -> &'static str {
    let entry = cluster
        .spec
        .external_clusters
        .iter()
        .find(|e| e.name == source);
    match entry.map(|e| (e.connection.is_some(), e.store.is_some())) {
        Some((false, true)) => ARCHIVE,
        Some((true, true)) => "streamingWithArchive",
        _ => "streaming",
    }
}

/// Sets condition `type_` of `status`.
fn set(
    status: &mut PostgresClusterStatus,
    cluster: &PostgresCluster,
    type_: &str,
    ok: bool,
    reason: &str,
    message: String,
    now: &Time,
) {
    set_condition(
        &mut status.conditions,
        new_condition(
            type_,
            ok,
            reason,
            message,
            cluster.metadata.generation,
            now.clone(),
        ),
        now.clone(),
    );
}

/// A condition reason is a fixed word: the manager's, when it is one pgop knows.
fn reason_of(reason: &str) -> &'static str {
    const KNOWN: &[&str] = &[
        "SourceUnreachable",
        "SourceTLSRefused",
        "SourceAuthenticationFailed",
        "SourceNoReplication",
        "SourceRefused",
        "SourceWalGone",
        "SystemIdentifierMismatch",
        "ArchiveGap",
    ];
    KNOWN
        .iter()
        .find(|k| **k == reason)
        .copied()
        .unwrap_or("SourceRefused")
}

#[cfg(test)]
mod tests {
    use super::*;
    use pgop_api::conditions::find_condition;
    use pgop_api::instance_status::{PgStatus, SourceRefusal, UpstreamState};

    fn cluster(replica: &str) -> PostgresCluster {
        let spec = format!(
            "storage: {{size: 1Gi}}\nexternalClusters: [{{name: site-a, connection: {{host: db, user: streaming_replica, sslMode: require}}}}]\n{replica}"
        );
        PostgresCluster::new("db", serde_yaml::from_str(&spec).expect("spec"))
    }

    fn at(s: i64) -> Time {
        Time(jiff::Timestamp::from_second(1_800_000_000 + s).expect("time"))
    }

    fn designated(streaming: bool, lag: Option<f64>, refusal: Option<&str>) -> Probe {
        let mut s = PgStatus::stopped("db-1", false);
        s.role = PgRole::DesignatedPrimary;
        s.running = true;
        s.in_recovery = true;
        s.streaming = streaming;
        s.received_lsn = Some("0/3000000".into());
        s.replayed_lsn = Some("0/3000000".into());
        s.upstream = Some(UpstreamState {
            receiver: streaming.then(|| "streaming".into()),
            end_lsn: Some("0/3000000".into()),
            lag_bytes: Some(0),
            lag_seconds: lag,
            last_message_at: None,
            refusal: refusal.map(|r| SourceRefusal {
                reason: r.into(),
                message: "connection refused".into(),
            }),
            ..Default::default()
        });
        Probe::Status(Box::new(s))
    }

    /// A designated primary that restores from its source's store (no WAL receiver).
    fn from_store(lag: Option<f64>, restored: &str, refusal: Option<&str>) -> Probe {
        let mut s = PgStatus::stopped("db-1", false);
        s.role = PgRole::DesignatedPrimary;
        s.running = true;
        s.in_recovery = true;
        s.replayed_lsn = Some("0/5000000".into());
        s.upstream = Some(UpstreamState {
            lag_seconds: lag,
            restored_wal: Some(restored.into()),
            restored_at: Some("2027-01-15T08:00:00Z".into()),
            refusal: refusal.map(|r| SourceRefusal {
                reason: r.into(),
                message: "the store lacks WAL segment 000000010000000000000006".into(),
            }),
            ..Default::default()
        });
        Probe::Status(Box::new(s))
    }

    fn store_only(replica: &str) -> PostgresCluster {
        let spec = format!(
            "storage: {{size: 1Gi}}\nexternalClusters: [{{name: site-a, store: {{cluster: db, s3: {{bucket: b, credentialsSecret: {{name: s3}}}}}}}}]\n{replica}"
        );
        PostgresCluster::new("db", serde_yaml::from_str(&spec).expect("spec"))
    }

    #[test]
    fn a_cluster_that_follows_a_store_alone_follows_by_archive_and_names_a_gap() {
        let c = store_only("replica: {source: site-a, maxLagSeconds: 60}");
        let s = following(
            &c,
            Some(from_store(Some(0.0), "000000010000000000000005", None)),
        );
        let (status, reason, message) = condition(&s);
        assert_eq!((status.as_str(), reason.as_str()), ("True", "Archive"));
        assert!(message.contains("000000010000000000000005"), "{message}");
        let r = s.replica.clone().expect("status.replica");
        assert_eq!(r.mode.as_deref(), Some("archive"));
        assert_eq!(
            r.last_restored_wal.as_deref(),
            Some("000000010000000000000005")
        );
        assert!(!r.streaming);
        let s = following(
            &c,
            Some(from_store(Some(90.0), "000000010000000000000005", None)),
        );
        assert_eq!(condition(&s).1, "LagOverBound");
        let s = following(
            &c,
            Some(from_store(
                None,
                "000000010000000000000005",
                Some("ArchiveGap"),
            )),
        );
        let (status, reason, message) = condition(&s);
        assert_eq!((status.as_str(), reason.as_str()), ("False", "ArchiveGap"));
        assert!(message.contains("000000010000000000000006"), "{message}");
        // The mode of an entry with both is said as such.
        let both = cluster("replica: {source: site-a}");
        let s = following(&both, Some(designated(true, Some(0.0), None)));
        assert_eq!(s.replica.and_then(|r| r.mode).as_deref(), Some("streaming"));

        // Caught up with the store: its promotion is not forced; behind it, it is.
        let old = following(
            &c,
            Some(from_store(Some(0.0), "000000010000000000000005", None)),
        );
        let promote = store_only("replica: {source: site-a, enabled: false}");
        let approved = pass(
            &promote,
            &old,
            from_store(Some(0.0), "000000010000000000000005", None),
            30,
        );
        let promotion = approved
            .replica
            .as_ref()
            .and_then(|r| r.promotion.clone())
            .expect("approved");
        assert!(!promotion.forced, "{promotion:?}");
        let behind = pass(
            &promote,
            &old,
            from_store(Some(20.0), "000000010000000000000005", None),
            30,
        );
        assert!(
            behind
                .replica
                .and_then(|r| r.promotion)
                .is_some_and(|p| p.forced)
        );
    }

    fn following(c: &PostgresCluster, probe: Option<Probe>) -> PostgresClusterStatus {
        let mut status = PostgresClusterStatus {
            current_primary: Some("db-1".into()),
            ..Default::default()
        };
        let probes: BTreeMap<String, Probe> =
            probe.map(|p| ("db-1".into(), p)).into_iter().collect();
        set_replica(c, &probes, None, &mut status, &at(0));
        status
    }

    fn condition(s: &PostgresClusterStatus) -> (String, String, String) {
        let c = find_condition(&s.conditions, REPLICA_FOLLOWING).expect("the condition");
        (c.status.clone(), c.reason.clone(), c.message.clone())
    }

    #[test]
    fn following_is_true_while_streaming_within_the_bound_and_false_naming_why_not() {
        let c = cluster("replica: {source: site-a, maxLagSeconds: 30}");
        let s = following(&c, Some(designated(true, Some(2.5), None)));
        assert_eq!(condition(&s).0, "True");
        let r = s.replica.expect("status.replica");
        assert_eq!(
            (r.source.as_str(), r.streaming, r.lag_seconds),
            ("site-a", true, Some(2))
        );
        let s = following(&c, Some(designated(true, Some(31.0), None)));
        assert_eq!(condition(&s).1, "LagOverBound");
        let s = following(
            &c,
            Some(designated(false, None, Some("SourceAuthenticationFailed"))),
        );
        let (status, reason, message) = condition(&s);
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("False", "SourceAuthenticationFailed")
        );
        assert!(message.contains("connection refused"), "{message}");
        // A reason pgop does not know is not copied into the condition.
        let s = following(&c, Some(designated(false, None, Some("Made Up"))));
        assert_eq!(condition(&s).1, "SourceRefused");
        let s = following(&c, Some(designated(false, None, None)));
        assert_eq!(condition(&s).1, "NotStreaming");
        let s = following(&c, None);
        assert_eq!(condition(&s).1, "DesignatedPrimaryDown");
        // Refused before the first clone: the instance is no designated primary yet.
        let mut refused = PgStatus::stopped("db-1", false);
        refused.upstream = Some(UpstreamState {
            refusal: Some(SourceRefusal {
                reason: "SourceUnreachable".into(),
                message: "connection refused".into(),
            }),
            ..Default::default()
        });
        let s = following(&c, Some(Probe::Status(Box::new(refused))));
        assert_eq!(condition(&s).1, "SourceUnreachable");
        // No bound: streaming is enough.
        let c = cluster("replica: {source: site-a}");
        let s = following(&c, Some(designated(true, Some(3600.0), None)));
        assert_eq!(condition(&s).0, "True");
    }

    #[test]
    fn nothing_for_a_cluster_that_is_no_replica_cluster() {
        for c in [
            cluster(""),
            cluster("replica: {source: site-a, enabled: false}"),
        ] {
            let s = following(&c, Some(designated(true, Some(0.0), None)));
            assert!(s.replica.is_none());
            assert!(find_condition(&s.conditions, REPLICA_FOLLOWING).is_none());
        }
    }

    #[test]
    fn moving_positions_are_held_back_with_the_instances_positions() {
        let c = cluster("replica: {source: site-a}");
        let old = following(&c, Some(designated(true, Some(1.0), None)));
        let mut status = old.clone();
        let probes: BTreeMap<String, Probe> =
            [("db-1".to_string(), designated(true, Some(4.0), None))].into();
        // Positions not published in this pass: the old lag stays.
        set_replica(&c, &probes, Some(&old), &mut status, &at(10));
        assert_eq!(status.replica.as_ref().and_then(|r| r.lag_seconds), Some(1));
        // Published: the new one.
        status.positions_observed_at = Some(at(60));
        set_replica(&c, &probes, Some(&old), &mut status, &at(60));
        assert_eq!(status.replica.as_ref().and_then(|r| r.lag_seconds), Some(4));
    }

    /// A pass of set_replica over `old` with the designated primary reporting `probe`.
    fn pass(
        c: &PostgresCluster,
        old: &PostgresClusterStatus,
        probe: Probe,
        at_second: i64,
    ) -> PostgresClusterStatus {
        let mut status = old.clone();
        status.positions_observed_at = Some(at(at_second));
        let probes: BTreeMap<String, Probe> = [("db-1".to_string(), probe)].into();
        set_replica(c, &probes, Some(old), &mut status, &at(at_second));
        status
    }

    fn condition_of(s: &PostgresClusterStatus, type_: &str) -> Option<(String, String)> {
        find_condition(&s.conditions, type_).map(|c| (c.status.clone(), c.reason.clone()))
    }

    #[test]
    fn a_promotion_is_approved_within_the_bound_refused_beyond_it_and_recorded() {
        let following = cluster("replica: {source: site-a}");
        // It streamed with 2 s of lag, then the source went away.
        let streamed = super::tests::following(&following, Some(designated(true, Some(2.0), None)));
        let lost = pass(
            &following,
            &streamed,
            designated(false, None, Some("SourceUnreachable")),
            30,
        );
        let r = lost.replica.clone().expect("status.replica");
        assert_eq!(
            (r.streaming, r.lag_seconds),
            (false, Some(2)),
            "the last known lag stays"
        );

        // Bound 1 s: refused, and it goes on following.
        let strict =
            cluster("replica: {source: site-a, enabled: false, promotionMaxLagSeconds: 1}");
        let refused = pass(
            &strict,
            &lost,
            designated(false, None, Some("SourceUnreachable")),
            60,
        );
        assert_eq!(
            condition_of(&refused, REPLICA_PROMOTED),
            Some(("False".into(), "PromotionRefused".into()))
        );
        assert!(
            refused
                .replica
                .as_ref()
                .is_some_and(|r| r.promotion.is_none())
        );
        assert!(condition_of(&refused, REPLICA_FOLLOWING).is_some());
        let event = promotion_event(Some(&lost), &refused).expect("an Event");
        assert_eq!(
            (event.0, event.1),
            (EventType::Warning, "ReplicaPromotionRefused")
        );

        // Bound 5 s: approved, forced (not streaming), the last lag recorded.
        let loose = cluster("replica: {source: site-a, enabled: false, promotionMaxLagSeconds: 5}");
        let approved = pass(
            &loose,
            &refused,
            designated(false, None, Some("SourceUnreachable")),
            90,
        );
        let promotion = approved
            .replica
            .as_ref()
            .and_then(|r| r.promotion.clone())
            .expect("approved");
        assert!(promotion.forced);
        assert_eq!(promotion.last_lag_seconds, Some(2));
        assert_eq!(
            condition_of(&approved, REPLICA_PROMOTED),
            Some(("False".into(), "Promoting".into()))
        );
        assert!(condition_of(&approved, REPLICA_FOLLOWING).is_none());
        let event = promotion_event(Some(&refused), &approved).expect("an Event");
        assert_eq!(
            (event.0, event.1),
            (EventType::Warning, "ReplicaPromotionStarted")
        );

        // The designated primary answers as a writable primary: done.
        let mut primary = PgStatus::stopped("db-1", false);
        primary.role = PgRole::Primary;
        primary.running = true;
        let done = pass(&loose, &approved, Probe::Status(Box::new(primary)), 95);
        let promotion = done.replica.as_ref().and_then(|r| r.promotion.clone());
        assert_eq!(promotion.and_then(|p| p.completed_at), Some(at(95)));
        assert_eq!(
            condition_of(&done, REPLICA_PROMOTED),
            Some(("True".into(), "Promoted".into()))
        );
        let event = promotion_event(Some(&approved), &done).expect("an Event");
        assert_eq!((event.0, event.1), (EventType::Normal, "ReplicaPromoted"));
        assert!(promotion_event(Some(&done), &done).is_none());
    }

    #[test]
    fn nothing_cloned_is_never_promoted_and_an_ordinary_cluster_has_no_promotion() {
        let c = cluster("replica: {source: site-a, enabled: false}");
        let mut never = PostgresClusterStatus {
            current_primary: Some("db-1".into()),
            replica: Some(ReplicaStatus {
                source: "site-a".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        never.positions_observed_at = Some(at(0));
        let s = pass(&c, &never, Probe::Unreachable("no IP".into()), 10);
        assert_eq!(
            condition_of(&s, REPLICA_PROMOTED),
            Some(("False".into(), "PromotionRefused".into()))
        );
        let ordinary = PostgresClusterStatus::default();
        let s = pass(&c, &ordinary, designated(true, Some(0.0), None), 10);
        assert!(s.replica.is_none() && condition_of(&s, REPLICA_PROMOTED).is_none());
    }
}
