//! `spec.replica`: a replica cluster, one that follows another PostgreSQL (an entry of
//! `spec.externalClusters`, typically a pgop cluster in another Kubernetes cluster)
//! instead of taking writes of its own.
//!
//! Its *designated primary* is a standby of the source (streaming replication over the
//! entry's connection), its other instances cascade from it, and losing the designated
//! primary makes another instance the designated primary, never a writable one (see
//! docs/replica.md). Alike in both API versions (the same field at the same path).

use crate::formats;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A replica cluster: follow `source` instead of taking writes.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaSpec {
    /// Follow the source (the default). Set to `false` on a replica cluster to promote it
    /// (a site lost, or the source retired): its designated primary is promoted and the
    /// cluster takes writes, once pgop has checked `promotionMaxLagSeconds` (see
    /// `status.replica.promotion`). A cluster created with `false` is an ordinary cluster.
    /// Never set back to `true` in this version (demotion is not built: docs/replica.md).
    #[serde(default = "default_enabled")]
    pub enabled: bool,

    /// The entry of `spec.externalClusters` to follow, by name; the entry must have a
    /// `connection` (its role needs `REPLICATION`). The cluster's first instance is cloned
    /// from it with `pg_basebackup` (`spec.bootstrap.recovery` may not be set).
    #[schemars(length(min = 1, max = 63), pattern(formats::DNS_LABEL_PATTERN))]
    pub source: String,

    /// How far (in seconds, 1 to 86400) replay on the designated primary may fall behind
    /// the source before the `ReplicaFollowing` condition turns False (reason
    /// `LagOverBound`, with an Event). Unset: no bound; the condition then only says
    /// whether it streams. May change at any time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86400))]
    pub max_lag_seconds: Option<i32>,

    /// Refuse a promotion (`enabled: false`) while the last lag pgop recorded
    /// (`status.replica.lagSeconds`) is above this many seconds (0 to 86400), or unknown:
    /// the promotion would lose more acknowledged commits of the source than the user
    /// accepts. Refused with the ReplicaPromoted condition False (`PromotionRefused`) and
    /// an Event; raise or remove it to promote anyway. Unset: no bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 86400))]
    pub promotion_max_lag_seconds: Option<i32>,
}

fn default_enabled() -> bool {
    true
}

impl ReplicaSpec {
    /// Whether the cluster follows its source now: `spec.replica` enabled, or its promotion
    /// asked for (`enabled: false`) but not yet approved by the operator
    /// (`status.replica.promotion`).
    pub fn follows_now(
        replica: Option<&ReplicaSpec>,
        status: Option<&crate::cluster::PostgresClusterStatus>,
    ) -> bool {
        let Some(replica) = replica else {
            return false;
        };
        replica.enabled
            || status
                .and_then(|s| s.replica.as_ref())
                .is_some_and(|r| r.promotion.is_none())
    }

    /// Whether `old` may become `new` on a cluster that exists in this version: the same
    /// source, followed as before, or promoted (`enabled` from `true` to `false`); the
    /// bounds may change. Never added, removed, re-pointed or demoted.
    pub fn may_become(old: Option<&ReplicaSpec>, new: Option<&ReplicaSpec>) -> bool {
        match (old, new) {
            (None, None) => true,
            (Some(o), Some(n)) => o.source == n.source && (o.enabled == n.enabled || !n.enabled),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ReplicaSpec;
    use crate::cluster::PostgresClusterStatus;

    #[test]
    fn a_cluster_follows_until_its_promotion_is_approved() {
        let spec = |yaml: &str| -> ReplicaSpec { serde_yaml::from_str(yaml).expect("spec") };
        let status =
            |yaml: &str| -> PostgresClusterStatus { serde_yaml::from_str(yaml).expect("status") };
        let following = spec("{source: site-a}");
        let promoting = spec("{source: site-a, enabled: false}");
        let recorded = status("{replica: {source: site-a}}");
        let approved = status(
            "{replica: {source: site-a, promotion: {approvedAt: '2026-12-07T10:00:00Z', forced: true}}}",
        );
        assert!(ReplicaSpec::follows_now(Some(&following), None));
        // Asked, not yet approved: it still follows; approved: no longer.
        assert!(ReplicaSpec::follows_now(Some(&promoting), Some(&recorded)));
        assert!(!ReplicaSpec::follows_now(Some(&promoting), Some(&approved)));
        // Created with enabled: false, or no replica at all: an ordinary cluster.
        assert!(!ReplicaSpec::follows_now(Some(&promoting), None));
        assert!(!ReplicaSpec::follows_now(None, Some(&recorded)));
    }
}
