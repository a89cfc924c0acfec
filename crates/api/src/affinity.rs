//! `spec.affinity` (`spec.scheduling` in `v1beta1`): where a cluster's instance Pods may
//! run — how strictly they are kept apart (pod anti-affinity, `preferred` or `required`,
//! over a topology key), how evenly they are spread (`topologySpread`), which nodes they
//! may use or prefer (`nodeSelector`, `nodeAffinity`), which taints they tolerate
//! (`tolerations`) and their priority (`priorityClassName`).
//!
//! Every schema rule here has a twin in [`crate::validation`], like the rest of the spec.

use crate::cel;
use crate::formats;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The topology key when `spec.affinity.topologyKey` is unset: one node is one domain.
pub const DEFAULT_TOPOLOGY_KEY: &str = "kubernetes.io/hostname";
/// Most entries in `spec.affinity.nodeSelector`.
pub const MAX_NODE_SELECTOR: usize = 32;
/// Most entries in `spec.affinity.tolerations`.
pub const MAX_TOLERATIONS: usize = 32;
/// Most entries in `spec.affinity.topologySpread`.
pub const MAX_TOPOLOGY_SPREAD: usize = 8;
/// Most terms in each of `spec.affinity.nodeAffinity.required` and `.preferred`.
pub const MAX_NODE_AFFINITY_TERMS: usize = 8;
/// Most expressions in one node affinity term.
pub const MAX_NODE_EXPRESSIONS: usize = 8;
/// Most values in one node affinity expression.
pub const MAX_NODE_VALUES: usize = 16;
pub use crate::reserved::SYSTEM_PRIORITY_CLASS_PREFIX;

/// Where the instance Pods may run, and how strictly they are kept apart.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AffinitySpec {
    /// How the instances are kept apart: `preferred` (the default) asks the scheduler to
    /// put them in different topology domains (nodes, by default) where it can, and
    /// places them together otherwise; `required` never puts two instances of the cluster
    /// in the same domain, so an instance with no free domain stays Pending (the
    /// cluster's `InstancesScheduled` condition says so). Changing it replaces the Pods
    /// one at a time through the rolling update.
    #[serde(default)]
    pub pod_anti_affinity_type: PodAntiAffinityType,

    /// The node label whose values are the domains instances are spread over:
    /// `kubernetes.io/hostname` (the default: one node each), or e.g.
    /// `topology.kubernetes.io/zone`. A label key: an optional DNS subdomain prefix of at
    /// most 253 characters and `/`, then a name of at most 63 letters, digits, `-`, `_`
    /// and `.` starting and ending with a letter or digit.
    #[serde(default = "default_topology_key")]
    #[schemars(
        length(min = 1, max = formats::MAX_LABEL_KEY_LENGTH),
        pattern(formats::LABEL_KEY_PATTERN)
    )]
    #[x_kube(validation = cel::label_key_prefix_length())]
    pub topology_key: String,

    /// Node labels every instance's node must carry (the Pods' `nodeSelector`), at most
    /// 32: label keys as in `topologyKey`, values of at most 63 letters, digits, `-`, `_`
    /// and `.` starting and ending with a letter or digit (or empty).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend(
        "maxProperties" = MAX_NODE_SELECTOR,
        "additionalProperties" = {
            "type": "string",
            "maxLength": formats::MAX_LABEL_VALUE_LENGTH,
            "pattern": formats::LABEL_VALUE_PATTERN,
        }
    ))]
    #[x_kube(validation = cel::label_keys())]
    pub node_selector: BTreeMap<String, String>,

    /// Taints the instance Pods tolerate (the Pods' `tolerations`), at most 32.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_TOLERATIONS))]
    pub tolerations: Vec<Toleration>,

    /// Spread the instances evenly over topology domains (the Pods'
    /// `topologySpreadConstraints`, counting this cluster's instances only), at most 8, one
    /// per `topologyKey` and `whenUnsatisfiable`. Unlike the anti-affinity, which keeps
    /// instances apart, this bounds how uneven domains may get (`maxSkew`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = MAX_TOPOLOGY_SPREAD),
        extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["topologyKey", "whenUnsatisfiable"])
    )]
    pub topology_spread: Vec<TopologySpread>,

    /// Which nodes the instances may use (`required`) or prefer (`preferred`) by their
    /// labels, with operators `nodeSelector` cannot express (the Pods' node affinity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_affinity: Option<NodeAffinity>,

    /// The PriorityClass of the instance Pods (their `priorityClassName`): a PriorityClass
    /// name (a DNS subdomain of at most 253 characters) other than Kubernetes' own
    /// `system-` classes. The cluster's default priority when unset. Changing it replaces
    /// the Pods one at a time through the rolling update.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), pattern(formats::DNS_SUBDOMAIN_PATTERN))]
    #[x_kube(validation = cel::not_system_priority_class())]
    pub priority_class_name: Option<String>,
}

/// One topology spread constraint over this cluster's instances.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TopologySpread {
    /// The node label whose values are the domains, e.g. `topology.kubernetes.io/zone`; a
    /// label key as in `topologyKey`.
    #[schemars(
        length(min = 1, max = formats::MAX_LABEL_KEY_LENGTH),
        pattern(formats::LABEL_KEY_PATTERN)
    )]
    #[x_kube(validation = cel::label_key_prefix_length())]
    pub topology_key: String,

    /// How many more instances one domain may hold than the emptiest one (1 to 9, default
    /// 1).
    #[serde(default = "default_max_skew")]
    #[schemars(range(min = 1, max = 9))]
    pub max_skew: i32,

    /// What the scheduler does when no node keeps the skew: `ScheduleAnyway` (the default:
    /// it prefers the nodes that skew least) or `DoNotSchedule` (the instance stays
    /// Pending).
    #[serde(default)]
    pub when_unsatisfiable: WhenUnsatisfiable,
}

fn default_max_skew() -> i32 {
    1
}

/// What the scheduler does with an instance no node can place within `maxSkew`.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WhenUnsatisfiable {
    /// Place it where the skew grows least.
    #[default]
    ScheduleAnyway,
    /// Leave it Pending.
    DoNotSchedule,
}

impl WhenUnsatisfiable {
    /// The value Kubernetes uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ScheduleAnyway => "ScheduleAnyway",
            Self::DoNotSchedule => "DoNotSchedule",
        }
    }
}

/// Node affinity of the instances: terms over node labels.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct NodeAffinity {
    /// An instance runs only on a node that matches at least one of these terms (at most
    /// 8); any node when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_NODE_AFFINITY_TERMS))]
    pub required: Vec<NodeSelectorTerm>,

    /// Terms the scheduler prefers, each with a weight (at most 8): among the nodes that
    /// fit, those whose matching terms weigh most.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_NODE_AFFINITY_TERMS))]
    pub preferred: Vec<PreferredNodeTerm>,
}

/// Node label expressions that must all hold.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeSelectorTerm {
    /// 1 to 8 expressions, all of which the node's labels must satisfy.
    #[schemars(length(min = 1, max = MAX_NODE_EXPRESSIONS))]
    pub match_expressions: Vec<NodeSelectorRequirement>,
}

/// A preferred node term and its weight.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PreferredNodeTerm {
    /// 1 to 100: how much a node that matches counts.
    #[schemars(range(min = 1, max = 100))]
    pub weight: i32,

    /// 1 to 8 expressions, all of which the node's labels must satisfy to count.
    #[schemars(length(min = 1, max = MAX_NODE_EXPRESSIONS))]
    pub match_expressions: Vec<NodeSelectorRequirement>,
}

/// One expression over a node label.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = cel::node_values_match_operator())]
#[serde(rename_all = "camelCase")]
pub struct NodeSelectorRequirement {
    /// The node label, a label key as in `topologyKey`.
    #[schemars(
        length(min = 1, max = formats::MAX_LABEL_KEY_LENGTH),
        pattern(formats::LABEL_KEY_PATTERN)
    )]
    #[x_kube(validation = cel::label_key_prefix_length())]
    pub key: String,

    /// `In` or `NotIn` (one of `values`, or none of them), `Exists` or `DoesNotExist` (no
    /// `values`), `Gt` or `Lt` (one value, a whole number the label is compared with).
    pub operator: NodeSelectorOperator,

    /// Label values (at most 16 of at most 63 letters, digits, `-`, `_` and `.` starting
    /// and ending with a letter or digit).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = MAX_NODE_VALUES),
        inner(
            length(max = formats::MAX_LABEL_VALUE_LENGTH),
            pattern(formats::LABEL_VALUE_PATTERN)
        )
    )]
    pub values: Vec<String>,
}

/// How a node label is compared.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeSelectorOperator {
    /// The label's value is one of `values`.
    In,
    /// The label is absent or its value is none of `values`.
    NotIn,
    /// The label is present.
    Exists,
    /// The label is absent.
    DoesNotExist,
    /// The label's value, a whole number, is greater than the one value.
    Gt,
    /// The label's value, a whole number, is less than the one value.
    Lt,
}

impl NodeSelectorOperator {
    /// The value Kubernetes uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::In => "In",
            Self::NotIn => "NotIn",
            Self::Exists => "Exists",
            Self::DoesNotExist => "DoesNotExist",
            Self::Gt => "Gt",
            Self::Lt => "Lt",
        }
    }

    /// Whether `values` fit this operator (the twin of the CEL rule).
    pub fn fits(self, values: &[String]) -> bool {
        match self {
            Self::In | Self::NotIn => !values.is_empty(),
            Self::Exists | Self::DoesNotExist => values.is_empty(),
            Self::Gt | Self::Lt => {
                values.len() == 1
                    && values[0].len() <= 18
                    && !values[0].is_empty()
                    && values[0].bytes().all(|b| b.is_ascii_digit())
            }
        }
    }
}

impl Default for AffinitySpec {
    fn default() -> Self {
        Self {
            pod_anti_affinity_type: PodAntiAffinityType::default(),
            topology_key: default_topology_key(),
            node_selector: BTreeMap::new(),
            tolerations: Vec::new(),
            topology_spread: Vec::new(),
            node_affinity: None,
            priority_class_name: None,
        }
    }
}

fn default_topology_key() -> String {
    DEFAULT_TOPOLOGY_KEY.to_string()
}

/// How the instances are kept apart: `preferred` spreads them where the scheduler can;
/// `required` never puts two in the same topology domain (an instance with no free domain
/// stays Pending).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub enum PodAntiAffinityType {
    /// Spread the instances where the scheduler can (a weighted preference).
    #[default]
    Preferred,
    /// Never two instances in one topology domain.
    Required,
}

/// A taint the instance Pods tolerate, as in a Pod's `tolerations`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = cel::toleration_key_or_exists())]
#[x_kube(validation = cel::toleration_exists_without_value())]
#[x_kube(validation = cel::toleration_seconds_need_no_execute())]
#[serde(rename_all = "camelCase")]
pub struct Toleration {
    /// The taint key, a label key as in `topologyKey`; unset with `operator: Exists`
    /// tolerates every taint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = formats::MAX_LABEL_KEY_LENGTH),
        pattern(formats::LABEL_KEY_PATTERN)
    )]
    #[x_kube(validation = cel::label_key_prefix_length())]
    pub key: Option<String>,

    /// `Equal` (the default: the taint's value must be `value`) or `Exists` (any value).
    #[serde(default)]
    pub operator: TolerationOperator,

    /// The taint value with `operator: Equal`: a label value (at most 63 letters, digits,
    /// `-`, `_` and `.` starting and ending with a letter or digit, or empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = formats::MAX_LABEL_VALUE_LENGTH),
        pattern(formats::LABEL_VALUE_PATTERN)
    )]
    pub value: Option<String>,

    /// The taint effect tolerated: `NoSchedule`, `PreferNoSchedule` or `NoExecute`;
    /// every effect when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<TaintEffect>,

    /// With `effect: NoExecute` only: seconds the Pod stays on a node after the taint
    /// appears (0 or more); forever when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub toleration_seconds: Option<i64>,
}

/// How a toleration's value is compared with a taint's.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TolerationOperator {
    /// The taint's value must equal the toleration's.
    #[default]
    Equal,
    /// Any value (and, without a key, any taint).
    Exists,
}

impl TolerationOperator {
    /// The value Kubernetes uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Equal => "Equal",
            Self::Exists => "Exists",
        }
    }
}

/// The taint effect tolerated: `NoSchedule`, `PreferNoSchedule` or `NoExecute`; every
/// effect when unset.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaintEffect {
    /// No new Pod is scheduled on the node.
    NoSchedule,
    /// The scheduler avoids the node.
    PreferNoSchedule,
    /// Running Pods are evicted too.
    NoExecute,
}

impl TaintEffect {
    /// The value Kubernetes uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoSchedule => "NoSchedule",
            Self::PreferNoSchedule => "PreferNoSchedule",
            Self::NoExecute => "NoExecute",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_a_preferred_spread_over_nodes_and_parses_from_nothing() {
        let empty: AffinitySpec = serde_json::from_value(serde_json::json!({})).expect("parses");
        assert_eq!(empty, AffinitySpec::default());
        assert_eq!(empty.pod_anti_affinity_type, PodAntiAffinityType::Preferred);
        assert_eq!(empty.topology_key, "kubernetes.io/hostname");
        assert_eq!(
            serde_json::to_value(&empty).expect("serializes"),
            serde_json::json!({"podAntiAffinityType": "preferred", "topologyKey": "kubernetes.io/hostname"})
        );
    }

    #[test]
    fn enums_use_the_names_kubernetes_users_write() {
        let t: Toleration = serde_json::from_value(serde_json::json!({
            "key": "dedicated", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30
        }))
        .expect("parses");
        assert_eq!(t.operator.as_str(), "Exists");
        assert_eq!(t.effect.map(TaintEffect::as_str), Some("NoExecute"));
        let required: PodAntiAffinityType =
            serde_json::from_value(serde_json::json!("required")).expect("parses");
        assert_eq!(required, PodAntiAffinityType::Required);
    }
}
