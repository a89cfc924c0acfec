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
    /// Follow the source (the default). A cluster created with `false` is an ordinary
    /// cluster. In this version neither this nor `source` may change once the cluster
    /// exists: promotion and demotion are not built yet (docs/replica.md).
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
}

fn default_enabled() -> bool {
    true
}

impl ReplicaSpec {
    /// Whether a cluster with this `spec.replica` follows its source.
    pub fn follows(replica: Option<&ReplicaSpec>) -> bool {
        replica.is_some_and(|r| r.enabled)
    }

    /// What may not change once the cluster exists in this version: whether it follows,
    /// and what.
    pub fn fixed(replica: Option<&ReplicaSpec>) -> Option<(bool, &str)> {
        replica.map(|r| (r.enabled, r.source.as_str()))
    }
}
