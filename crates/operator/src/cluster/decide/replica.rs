//! A replica cluster's `status.replica` and its ReplicaFollowing condition, from what the
//! designated primary's manager reports (`/pg/status`: its WAL receiver, the lag behind
//! the source, and why the source refuses it when it does not stream).

use crate::cluster::world::Probe;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use pgop_api::PostgresClusterStatus;
use pgop_api::cluster_status::ReplicaStatus;
use pgop_api::conditions::{REPLICA_FOLLOWING, new_condition, set_condition};
use pgop_api::instance_status::PgRole;
use pgop_api::v1beta1::PostgresCluster;
use std::collections::BTreeMap;

/// Sets `status.replica` and ReplicaFollowing for a replica cluster (nothing for another
/// cluster). `old` is the status before this pass: while `status`'s positions are held
/// back (`positionsObservedAt` unchanged), so are the replica's.
pub fn set_replica(
    cluster: &PostgresCluster,
    probes: &BTreeMap<String, Probe>,
    old: Option<&PostgresClusterStatus>,
    status: &mut PostgresClusterStatus,
    now: &Time,
) {
    let Some(replica) = cluster.spec.replica.as_ref().filter(|r| r.enabled) else {
        return;
    };
    let designated = status.current_primary.clone();
    let reported = designated
        .as_ref()
        .and_then(|d| probes.get(d))
        .and_then(Probe::status);
    let pg = reported.filter(|s| s.role == PgRole::DesignatedPrimary);
    let upstream = pg.and_then(|s| s.upstream.as_ref());
    // Also before the first clone: the manager asks the source first.
    let refusal = reported
        .and_then(|s| s.upstream.as_ref())
        .and_then(|u| u.refusal.as_ref());
    let mut report = ReplicaStatus {
        source: replica.source.clone(),
        designated_primary: designated.clone(),
        streaming: pg.is_some_and(|s| s.streaming),
        source_end_lsn: upstream.and_then(|u| u.end_lsn.clone()),
        received_lsn: pg.and_then(|s| s.received_lsn.clone()),
        replayed_lsn: pg.and_then(|s| s.replayed_lsn.clone()),
        lag_bytes: upstream.and_then(|u| u.lag_bytes),
        lag_seconds: upstream
            .and_then(|u| u.lag_seconds)
            .map(|s| s.max(0.0).floor() as i64),
        refusal_reason: refusal.map(|r| r.reason.clone()),
        refusal_message: refusal.map(|r| r.message.clone()),
    };
    let previous = old.and_then(|s| s.replica.as_ref());
    let held_back = old.is_some_and(|o| o.positions_observed_at == status.positions_observed_at);
    if let Some(previous) = previous
        && held_back
        && previous.without_positions() == report.without_positions()
    {
        report = previous.clone();
    }
    let source = &replica.source;
    let who = designated.as_deref().unwrap_or("(none yet)");
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
        Some(s) if !s.streaming => (
            false,
            "NotStreaming",
            format!("{who} does not stream from {source} (its WAL receiver is connecting)"),
        ),
        Some(_) => match (
            replica.max_lag_seconds,
            upstream.and_then(|u| u.lag_seconds),
        ) {
            (Some(max), Some(lag)) if lag > f64::from(max) => (
                false,
                "LagOverBound",
                format!(
                    "{who} streams from {source} but replays more than spec.replica.maxLagSeconds ({max} s) behind it"
                ),
            ),
            _ => (true, "Streaming", format!("{who} streams from {source}")),
        },
    };
    status.replica = Some(report);
    set_condition(
        &mut status.conditions,
        new_condition(
            REPLICA_FOLLOWING,
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
        });
        Probe::Status(Box::new(s))
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
}
