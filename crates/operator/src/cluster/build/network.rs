//! The cluster's NetworkPolicy (`spec.networkPolicy`): on the instance Pods, PostgreSQL
//! from the cluster's own instances and the selected clients (any source when none is
//! selected), the manager's read-only port from anywhere (probes, metrics, the operator's
//! status reads), and its mutual-TLS port from the operator's Pods only.

use super::{Common, Settings};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use pgop_api::constants::{MANAGER_PORT, MANAGER_TLS_PORT, POSTGRES_PORT};
use pgop_api::labels;
use pgop_api::network::NetworkPolicySpec as Spec;
use std::collections::BTreeMap;

/// The `app.kubernetes.io/name` label of the operator's Pods (the chart's).
pub const OPERATOR_POD_NAME_LABEL: &str = "pgop-operator";
/// The label Kubernetes puts on every namespace: its name.
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

fn selector(labels: &BTreeMap<String, String>) -> LabelSelector {
    LabelSelector {
        match_labels: Some(labels.clone()),
        ..LabelSelector::default()
    }
}

fn ports(numbers: &[u16]) -> Option<Vec<NetworkPolicyPort>> {
    Some(
        numbers
            .iter()
            .map(|p| NetworkPolicyPort {
                port: Some(IntOrString::Int(i32::from(*p))),
                protocol: Some("TCP".to_string()),
                ..NetworkPolicyPort::default()
            })
            .collect(),
    )
}

/// The NetworkPolicy `<cluster>`, or `None` when `spec.networkPolicy.enabled` is off.
/// With `poolers` (`spec.poolers` is not empty), the pooler Pods are clients too.
pub fn network_policy(
    c: &Common,
    spec: &Spec,
    settings: &Settings,
    poolers: bool,
) -> Option<NetworkPolicy> {
    if !spec.enabled {
        return None;
    }
    let instances = BTreeMap::from([
        (labels::CLUSTER.to_string(), c.cluster.clone()),
        (
            labels::COMPONENT.to_string(),
            labels::COMPONENT_DATABASE.to_string(),
        ),
    ]);
    // PostgreSQL: the instances (replication), then the clients; no client selector
    // admits every source.
    let postgres_from = if spec.clients.is_empty() {
        None
    } else {
        let mut peers = vec![NetworkPolicyPeer {
            pod_selector: Some(selector(&instances)),
            ..NetworkPolicyPeer::default()
        }];
        if poolers {
            peers.push(NetworkPolicyPeer {
                pod_selector: Some(selector(&BTreeMap::from([
                    (labels::INSTANCE.to_string(), c.cluster.clone()),
                    (
                        labels::COMPONENT.to_string(),
                        labels::COMPONENT_POOLER.to_string(),
                    ),
                ]))),
                ..NetworkPolicyPeer::default()
            });
        }
        peers.extend(spec.clients.iter().map(|client| NetworkPolicyPeer {
            pod_selector: Some(selector(&client.pod_labels)),
            namespace_selector: client.namespace_labels.as_ref().map(selector),
            ..NetworkPolicyPeer::default()
        }));
        Some(peers)
    };
    // The manager's TLS port: the operator's Pods, in the operator's namespace when it is
    // known (it runs in the cluster); an operator outside the cluster is no Pod a policy
    // can name, so the port is then open to every source (its mutual TLS still admits
    // only the operator's certificate).
    let operator_from = settings.operator_namespace.as_ref().map(|namespace| {
        vec![NetworkPolicyPeer {
            pod_selector: Some(selector(&BTreeMap::from([(
                labels::NAME.to_string(),
                OPERATOR_POD_NAME_LABEL.to_string(),
            )]))),
            namespace_selector: Some(selector(&BTreeMap::from([(
                NAMESPACE_NAME_LABEL.to_string(),
                namespace.clone(),
            )]))),
            ..NetworkPolicyPeer::default()
        }]
    });
    Some(NetworkPolicy {
        metadata: c.meta(&c.cluster, &[]),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(selector(&instances)),
            policy_types: Some(vec!["Ingress".to_string()]),
            ingress: Some(vec![
                NetworkPolicyIngressRule {
                    from: postgres_from,
                    ports: ports(&[POSTGRES_PORT]),
                },
                NetworkPolicyIngressRule {
                    from: None,
                    ports: ports(&[MANAGER_PORT]),
                },
                NetworkPolicyIngressRule {
                    from: operator_from,
                    ports: ports(&[MANAGER_TLS_PORT]),
                },
            ]),
            ..NetworkPolicySpec::default()
        }),
    })
}
