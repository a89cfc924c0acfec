//! `spec.networkPolicy`: the NetworkPolicy pgop keeps for a cluster's instance Pods. It
//! admits, on the instances' ports: PostgreSQL (5432) from the cluster's own instances
//! (replication) and from the clients the spec selects (any source by default); the
//! manager's read-only port (8000: probes, metrics, status) from anywhere; the manager's
//! mutual-TLS port (8001: backups, retention) from the operator's Pods only.
//!
//! Every schema rule here has a twin in [`crate::validation`], like the rest of the spec.

use crate::cel;
use crate::formats;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Most entries in `spec.networkPolicy.clients`.
pub const MAX_CLIENTS: usize = 16;
/// Most labels in one client selector's `podLabels` or `namespaceLabels`.
pub const MAX_SELECTOR_LABELS: usize = 16;

/// The cluster's NetworkPolicy.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicySpec {
    /// Whether pgop keeps the NetworkPolicy `<cluster>` (default `true`; `false` deletes
    /// it). It only takes effect where the cluster's network plugin enforces policies.
    #[serde(default = "default_enabled")]
    pub enabled: bool,

    /// Who may connect to PostgreSQL (port 5432) besides the cluster's own instances, at
    /// most 16 selectors: a client matching any of them is admitted. None (the default):
    /// any source, as without a policy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_CLIENTS))]
    pub clients: Vec<ClientSelector>,
}

impl Default for NetworkPolicySpec {
    fn default() -> Self {
        Self {
            enabled: true,
            clients: Vec::new(),
        }
    }
}

fn default_enabled() -> bool {
    true
}

/// Pods that may connect to PostgreSQL: by their labels, in namespaces chosen by theirs.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ClientSelector {
    /// Pods carrying all these labels (at most 16; none: every Pod). Label keys as in
    /// `spec.affinity.nodeSelector`, values of at most 63 letters, digits, `-`, `_` and `.`
    /// starting and ending with a letter or digit (or empty).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend(
        "maxProperties" = MAX_SELECTOR_LABELS,
        "additionalProperties" = {
            "type": "string",
            "maxLength": formats::MAX_LABEL_VALUE_LENGTH,
            "pattern": formats::LABEL_VALUE_PATTERN,
        }
    ))]
    #[x_kube(validation = cel::label_keys())]
    pub pod_labels: BTreeMap<String, String>,

    /// In namespaces carrying all these labels (at most 16; `{}`: every namespace). Unset:
    /// the cluster's own namespace only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend(
        "maxProperties" = MAX_SELECTOR_LABELS,
        "additionalProperties" = {
            "type": "string",
            "maxLength": formats::MAX_LABEL_VALUE_LENGTH,
            "pattern": formats::LABEL_VALUE_PATTERN,
        }
    ))]
    #[x_kube(validation = cel::label_keys())]
    pub namespace_labels: Option<BTreeMap<String, String>>,
}
