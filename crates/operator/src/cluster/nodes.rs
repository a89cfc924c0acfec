//! What the operator knows of the Kubernetes nodes its instances run on: a watch cache of
//! the Nodes ([`NodeFacts`]), trimmed to what the decisions read (the drain and a deleted
//! node: [`super::decide::nodes`]); while that cache has not been filled (or when the
//! operator may not list Nodes), every node is [`NodeState::Unknown`] and neither
//! decision acts.

use futures::FutureExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::reflector::{ObjectRef, Store};

/// What the operator knows of one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeState {
    /// The cache is not filled yet (or Nodes cannot be read): act on nothing.
    Unknown,
    /// There is no Node of that name.
    Missing,
    /// Cordoned (`spec.unschedulable`), as `kubectl drain` and `kubectl cordon` leave it.
    Unschedulable,
    Schedulable,
}

/// The operator's view of the Nodes: a watch cache, or nothing.
#[derive(Clone, Default)]
pub struct NodeFacts {
    store: Option<Store<Node>>,
}

impl NodeFacts {
    pub fn new(store: Store<Node>) -> Self {
        Self { store: Some(store) }
    }

    /// Whether the cache holds the cluster's Nodes (its first LIST has completed).
    pub fn known(&self) -> bool {
        self.store
            .as_ref()
            .is_some_and(|s| matches!(s.wait_until_ready().now_or_never(), Some(Ok(()))))
    }

    pub fn state(&self, name: &str) -> NodeState {
        let Some(store) = self.store.as_ref().filter(|_| self.known()) else {
            return NodeState::Unknown;
        };
        match store.get(&ObjectRef::new(name)) {
            None => NodeState::Missing,
            Some(node) => Self::state_of(&node),
        }
    }

    /// The state of a Node that exists.
    pub fn state_of(node: &Node) -> NodeState {
        if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
            NodeState::Unschedulable
        } else {
            NodeState::Schedulable
        }
    }

    /// The state of the node a Pod is bound to (`Unknown` when it is not bound).
    pub fn of_pod(&self, pod: &Pod) -> NodeState {
        match pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
            Some(node) => self.state(node),
            None => NodeState::Unknown,
        }
    }
}

/// Keeps only what [`NodeFacts`] reads of a Node (name and `spec.unschedulable`), so that
/// the cache stays small on clusters with many large Node objects.
pub fn trim(node: &mut Node) {
    node.status = None;
    node.metadata.managed_fields = None;
    node.metadata.annotations = None;
    node.metadata.labels = None;
    if let Some(spec) = node.spec.as_mut() {
        spec.taints = None;
        spec.provider_id = None;
        spec.pod_cidrs = None;
        spec.pod_cidr = None;
        spec.config_source = None;
    }
}

/// The annotation the scheduler sets on a claim bound late (WaitForFirstConsumer).
pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
