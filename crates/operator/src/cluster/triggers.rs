//! What wakes a cluster besides its own watch, its children's watches ([`super::cache`])
//! and the prober: the objects a pass reads that are not its children. With these, a
//! cluster needs no frequent resync ([`super::RESYNC`]).
//!
//! In all, a cluster runs when it or a child changes (the watches), when something else it
//! reads changes (below), when one of its instances changes significantly (the
//! [`super::prober`], which polls them apart from the reconciles: how a failed primary is
//! noticed), and otherwise as [`super::decide::next_pass`] says: every
//! [`super::RESYNC`] (5 minutes), sooner while a decision waits on the clock, a scheduled
//! backup is due or WAL positions wait to be published.
//!
//! - **The user's Secrets** a cluster names (`spec.credentials.appSecret`,
//!   `spec.credentials.superuserSecret`, `spec.tls.serverSecret`,
//!   `spec.tls.clientCASecret`): a metadata-only watch of the Secrets pgop does not manage
//!   ([`user_secrets`]); a change wakes every cluster of the namespace that names it.
//! - **PostgresBackups**: a change wakes the cluster backed up (its status shows the last
//!   backup and the recoverability window) and every cluster of the namespace that
//!   recovers from it ([`clusters_of_backup`]).
//! - **Nodes**: a node cordoned, uncordoned or deleted wakes every cluster with an
//!   instance Pod on it ([`NodeChanges`], [`super::cache::Caches::clusters_on_node`]), for
//!   the decisions of [`super::nodes`].

use super::nodes::{NodeFacts, NodeState};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::PartialObjectMeta;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use pgop_api::backup::PostgresBackup;
use pgop_api::labels;
use pgop_api::v1beta1::PostgresCluster;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// The user's Secrets a pass of `cluster` reads.
pub fn secrets_named(cluster: &PostgresCluster) -> impl Iterator<Item = &str> {
    let spec = &cluster.spec;
    [
        spec.credentials.app_secret.as_deref(),
        spec.credentials.superuser_secret.as_deref(),
        spec.tls.server_secret.as_deref(),
        spec.tls.client_ca_secret.as_deref(),
    ]
    .into_iter()
    .flatten()
}

/// The clusters of `namespace` that name Secret `secret`.
pub fn clusters_naming_secret(
    clusters: &[Arc<PostgresCluster>],
    namespace: &str,
    secret: &str,
) -> Vec<ObjectRef<PostgresCluster>> {
    clusters
        .iter()
        .filter(|c| c.namespace().as_deref() == Some(namespace))
        .filter(|c| secrets_named(c).any(|s| s == secret))
        .map(|c| ObjectRef::from_obj(c.as_ref()))
        .collect()
}

/// The cluster `backup` is of, and the clusters of its namespace that recover from it.
pub fn clusters_of_backup(
    clusters: &[Arc<PostgresCluster>],
    backup: &PostgresBackup,
) -> Vec<ObjectRef<PostgresCluster>> {
    let namespace = backup.namespace().unwrap_or_default();
    let name = backup.name_any();
    let mut refs = vec![ObjectRef::new(&backup.spec.cluster.name).within(&namespace)];
    refs.extend(
        clusters
            .iter()
            .filter(|c| c.namespace().as_deref() == Some(namespace.as_str()))
            .filter(|c| {
                c.spec
                    .bootstrap
                    .as_ref()
                    .and_then(|b| b.recovery.as_ref())
                    .and_then(|r| r.backup.as_deref())
                    == Some(name.as_str())
            })
            .map(|c| ObjectRef::from_obj(c.as_ref())),
    );
    refs
}

/// A metadata-only watch (an `Api` of `PartialObjectMeta` asks for metadata only) of the
/// Secrets of `api` that pgop does not manage (its own are children, watched whole by the
/// caches): each change, as the Secret's metadata.
pub fn user_secrets(
    api: Api<PartialObjectMeta<Secret>>,
) -> impl Stream<Item = Result<PartialObjectMeta<Secret>, watcher::Error>> + Send + 'static {
    let config = watcher::Config::default().labels(&format!(
        "{}!={}",
        labels::MANAGED_BY,
        labels::MANAGED_BY_VALUE
    ));
    watcher(api, config).default_backoff().touched_objects()
}

/// A watch of the PostgresBackups of `api`, as a trigger only (no store: the backup
/// controller keeps the one the clusters read).
pub fn backups(
    api: Api<PostgresBackup>,
) -> impl Stream<Item = Result<PostgresBackup, watcher::Error>> + Send + 'static {
    watcher(api, watcher::Config::default())
        .default_backoff()
        .touched_objects()
}

/// Which nodes changed in a way [`super::nodes`] decides on ([`NodeState`]: cordoned,
/// schedulable, gone), from the events of the Node watch. The first listing only records;
/// a re-list (after a broken watch) tells what changed meanwhile, deletions included.
#[derive(Debug, Default)]
pub struct NodeChanges {
    known: HashMap<String, NodeState>,
    /// Whether a first listing has completed.
    primed: bool,
    /// The nodes seen so far by a listing in progress.
    listing: Option<HashSet<String>>,
}

impl NodeChanges {
    /// The names of the nodes whose state `event` changed.
    pub fn changed(&mut self, event: &watcher::Event<Node>) -> Vec<String> {
        let mut record = |node: &Node| {
            let name = node.name_any();
            let state = NodeFacts::state_of(node);
            let old = self.known.insert(name.clone(), state);
            (old != Some(state)).then_some(name)
        };
        match event {
            watcher::Event::Init => {
                self.listing = Some(HashSet::new());
                Vec::new()
            }
            watcher::Event::InitApply(node) => {
                if let Some(listing) = &mut self.listing {
                    listing.insert(node.name_any());
                }
                let changed = record(node);
                changed.filter(|_| self.primed).into_iter().collect()
            }
            watcher::Event::InitDone => {
                let listed = self.listing.take().unwrap_or_default();
                let gone: Vec<String> = self
                    .known
                    .keys()
                    .filter(|name| !listed.contains(*name))
                    .cloned()
                    .collect();
                for name in &gone {
                    self.known.remove(name);
                }
                let primed = std::mem::replace(&mut self.primed, true);
                if primed { gone } else { Vec::new() }
            }
            watcher::Event::Apply(node) => record(node).into_iter().collect(),
            watcher::Event::Delete(node) => {
                let name = node.name_any();
                self.known.remove(&name);
                vec![name]
            }
        }
    }
}

/// A stream of the items sent on `tx` from now on (a receiver that falls behind skips
/// what it missed: the resync catches up).
pub fn subscribe<T: Clone + Send + 'static>(
    tx: &tokio::sync::broadcast::Sender<T>,
) -> impl Stream<Item = T> + Send + 'static {
    futures::stream::unfold(tx.subscribe(), |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok(item) => return Some((item, rx)),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::debug!(
                        missed,
                        "a trigger receiver fell behind; the resync catches up"
                    );
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(namespace: &str, name: &str, mut spec: serde_json::Value) -> Arc<PostgresCluster> {
        spec["storage"] = serde_json::json!({"size": "1Gi"});
        let mut c: PostgresCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "database.example.com/v1beta1",
            "kind": "PostgresCluster",
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec,
        }))
        .expect("a cluster");
        c.metadata.uid = Some(format!("uid-{name}"));
        Arc::new(c)
    }

    fn names(refs: Vec<ObjectRef<PostgresCluster>>) -> Vec<String> {
        refs.into_iter()
            .map(|r| format!("{}/{}", r.namespace.unwrap_or_default(), r.name))
            .collect()
    }

    #[test]
    fn a_user_secret_wakes_the_clusters_of_its_namespace_that_name_it() {
        let clusters = [
            cluster(
                "a",
                "one",
                serde_json::json!({"credentials": {"appSecret": "shared"}}),
            ),
            cluster(
                "a",
                "two",
                serde_json::json!({"tls": {"serverSecret": "shared"}}),
            ),
            cluster(
                "a",
                "three",
                serde_json::json!({
                    "credentials": {"superuserAccess": true, "superuserSecret": "root"},
                    "tls": {"clientCASecret": "cas"}
                }),
            ),
            cluster(
                "b",
                "four",
                serde_json::json!({"credentials": {"appSecret": "shared"}}),
            ),
        ];
        assert_eq!(
            names(clusters_naming_secret(&clusters, "a", "shared")),
            ["a/one", "a/two"]
        );
        assert_eq!(
            names(clusters_naming_secret(&clusters, "a", "root")),
            ["a/three"]
        );
        assert_eq!(
            names(clusters_naming_secret(&clusters, "a", "cas")),
            ["a/three"]
        );
        assert!(clusters_naming_secret(&clusters, "a", "other").is_empty());
        assert!(clusters_naming_secret(&clusters, "c", "shared").is_empty());
    }

    #[test]
    fn a_backup_wakes_its_cluster_and_those_that_recover_from_it() {
        let clusters = [
            cluster(
                "a",
                "restored",
                serde_json::json!({
                    "bootstrap": {"recovery": {"backup": "nightly"}}
                }),
            ),
            cluster(
                "a",
                "elsewhere",
                serde_json::json!({
                    "bootstrap": {"recovery": {"backup": "weekly"}}
                }),
            ),
            cluster(
                "b",
                "restored",
                serde_json::json!({
                    "bootstrap": {"recovery": {"backup": "nightly"}}
                }),
            ),
        ];
        let backup: PostgresBackup = serde_json::from_value(serde_json::json!({
            "apiVersion": "database.example.com/v1alpha1",
            "kind": "PostgresBackup",
            "metadata": {"name": "nightly", "namespace": "a"},
            "spec": {"cluster": {"name": "main"}},
        }))
        .expect("a backup");
        assert_eq!(
            names(clusters_of_backup(&clusters, &backup)),
            ["a/main", "a/restored"]
        );
    }

    #[test]
    fn a_node_counts_as_changed_when_cordoned_uncordoned_or_deleted() {
        let node = |name: &str, cordoned: Option<bool>| -> Node {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name},
                "spec": {"unschedulable": cordoned},
            }))
            .expect("a node")
        };
        let mut changes = NodeChanges::default();
        // The first listing records.
        assert!(changes.changed(&watcher::Event::Init).is_empty());
        assert!(
            changes
                .changed(&watcher::Event::InitApply(node("n1", None)))
                .is_empty()
        );
        assert!(
            changes
                .changed(&watcher::Event::InitApply(node("n0", None)))
                .is_empty()
        );
        assert!(changes.changed(&watcher::Event::InitDone).is_empty());
        // A status update (same state): nothing.
        assert!(
            changes
                .changed(&watcher::Event::Apply(node("n1", Some(false))))
                .is_empty()
        );
        assert_eq!(
            changes.changed(&watcher::Event::Apply(node("n1", Some(true)))),
            ["n1"]
        );
        assert_eq!(
            changes.changed(&watcher::Event::Apply(node("n1", None))),
            ["n1"]
        );
        // A new node, then its deletion.
        assert_eq!(
            changes.changed(&watcher::Event::Apply(node("n2", None))),
            ["n2"]
        );
        assert_eq!(
            changes.changed(&watcher::Event::Delete(node("n2", None))),
            ["n2"]
        );
        // A re-list after a broken watch tells what changed meanwhile: n1 cordoned, n3
        // new, n4 gone.
        assert_eq!(
            changes.changed(&watcher::Event::Apply(node("n4", None))),
            ["n4"]
        );
        assert!(changes.changed(&watcher::Event::Init).is_empty());
        assert_eq!(
            changes.changed(&watcher::Event::InitApply(node("n1", Some(true)))),
            ["n1"]
        );
        assert_eq!(
            changes.changed(&watcher::Event::InitApply(node("n3", None))),
            ["n3"]
        );
        assert!(
            changes
                .changed(&watcher::Event::InitApply(node("n0", None)))
                .is_empty()
        );
        assert_eq!(changes.changed(&watcher::Event::InitDone), ["n4"]);
        assert!(
            changes
                .changed(&watcher::Event::Apply(node("n1", Some(true))))
                .is_empty()
        );
    }
}
