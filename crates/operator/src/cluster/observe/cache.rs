//! Watch caches of the clusters' children, read by [`super::dereference`] instead of a
//! LIST per kind per pass.
//!
//! - One watch per child kind (per watched namespace), narrowed to pgop's objects by the
//!   managed-by label, feeds both the controller's triggers (`owns_stream`) and an
//!   [`Index`] of the objects by namespace and cluster label. `managedFields` are
//!   dropped on arrival: nothing reads them, and they are a large part of an object; so is
//!   a Pod's spec but for `nodeName` ([`trim_pod`]).
//! - An index keeps a cluster's objects of one kind as one compressed JSON array
//!   ([`Group`]) and decodes it on each read: typed Kubernetes objects cost several times
//!   that in memory, and a fleet's children are tens of thousands of objects read a
//!   cluster at a time.
//! - An index answers only once its first complete LIST has arrived ([`Index::ready`]);
//!   until then, and whenever it may not yet show this operator's own last writes, the
//!   reconcile lists from the API server as before ([`Expectations`]).
//! - A re-list after a broken watch is buffered and swapped in whole, so a reader never
//!   sees half a LIST.
//!
//! Why this file stays whole: it is one idea, the watch caches of the children: what fills
//! an `Index` (`feed`, `Feeds`), how it keeps and serves a cluster's objects (`Group`,
//! `State`), and when a pass may trust it (`Expectations`); about 230 of its lines are the
//! unit tests.

use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::runtime::reflector::Store;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use pgop_api::backup::PostgresBackup;
use pgop_api::labels;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::fmt::Debug;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::cluster::world::Observed;

/// `(namespace, cluster)`.
type Key = (String, String);

/// The objects of one kind of one cluster, as kept: a JSON array of them ordered by name,
/// deflated. A typed object holds every optional field inline, a tree node per map and an
/// allocation per string; a cluster's objects of one kind share their labels, owner and
/// much of their shape (its Secrets the same authority certificate, several times), so
/// one compressed array of them is a small fraction of the typed objects (measured in
/// docs/operator.md#scale). A read decodes the whole group, which is what a pass reads.
struct Group(Box<[u8]>);

impl Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Group({} bytes)", self.0.len())
    }
}

impl Group {
    fn pack<K: Serialize>(objects: &[K]) -> Option<Group> {
        use std::io::Write;
        let json = match serde_json::to_vec(objects) {
            Ok(json) => json,
            Err(e) => {
                // Cannot happen for the API's types: the group is then not kept, and the
                // pass that needs it creates what it lacks, or lists.
                tracing::warn!(error = %e, "cannot keep objects in the cache");
                return None;
            }
        };
        let mut encoder = flate2::write::DeflateEncoder::new(
            Vec::with_capacity(json.len() / 3),
            // The fastest level: a group is written on every change of one of its
            // objects, and the fastest is within a few percent of the best here.
            flate2::Compression::fast(),
        );
        let packed = encoder.write_all(&json).and_then(|()| encoder.finish());
        match packed {
            Ok(packed) => Some(Group(packed.into_boxed_slice())),
            Err(e) => {
                tracing::warn!(error = %e, "cannot compress objects for the cache");
                None
            }
        }
    }

    fn unpack<K: DeserializeOwned>(&self) -> Vec<K> {
        use std::io::Read;
        let mut json = Vec::with_capacity(self.0.len() * 4);
        let read = flate2::read::DeflateDecoder::new(&self.0[..]).read_to_end(&mut json);
        let decoded = read
            .map_err(|e| e.to_string())
            .and_then(|_| serde_json::from_slice(&json).map_err(|e| e.to_string()));
        match decoded {
            Ok(objects) => objects,
            Err(e) => {
                // Cannot happen (this module wrote it); the objects then look absent, and
                // the pass that needs them repairs or lists.
                tracing::warn!(error = %e, "cannot read objects back from the cache");
                Vec::new()
            }
        }
    }
}

fn name_of<K: Resource>(obj: &K) -> &str {
    obj.meta().name.as_deref().unwrap_or_default()
}

/// One namespace's objects of one kind. Its keys are what most of an index's memory is
/// besides the groups (a fleet's children are tens of thousands of objects), so they are
/// kept small: a name once, and a cluster's name once, shared by its group and its
/// objects' entries.
#[derive(Debug, Default)]
struct Namespace {
    /// Objects by cluster label.
    by_cluster: HashMap<Arc<str>, Group>,
    /// The cluster each object was filed under, by name.
    cluster_of: HashMap<Box<str>, Arc<str>>,
}

impl Namespace {
    /// Keeps `objects` as the group of `cluster`, or none when empty.
    fn keep<K: Resource + Serialize>(&mut self, cluster: Arc<str>, mut objects: Vec<K>) {
        if objects.is_empty() {
            self.by_cluster.remove(&cluster);
            return;
        }
        objects.sort_by(|a, b| name_of(a).cmp(name_of(b)));
        match Group::pack(&objects) {
            Some(group) => {
                self.by_cluster.insert(cluster, group);
            }
            None => {
                self.by_cluster.remove(&cluster);
            }
        }
    }

    fn objects<K: DeserializeOwned>(&self, cluster: &str) -> Vec<K> {
        self.by_cluster
            .get(cluster)
            .map(Group::unpack)
            .unwrap_or_default()
    }

    /// `cluster` as this namespace already keeps it, so that its entries share one copy.
    fn shared(&self, cluster: &str) -> Arc<str> {
        match self.by_cluster.get_key_value(cluster) {
            Some((kept, _)) => kept.clone(),
            None => Arc::from(cluster),
        }
    }

    fn remove<K: Resource + Serialize + DeserializeOwned>(&mut self, name: &str) {
        if let Some(cluster) = self.cluster_of.remove(name) {
            let mut objects: Vec<K> = self.objects(&cluster);
            objects.retain(|o| name_of(o) != name);
            self.keep(cluster, objects);
        }
    }

    fn is_empty(&self) -> bool {
        self.by_cluster.is_empty() && self.cluster_of.is_empty()
    }
}

#[derive(Debug)]
struct State<K> {
    namespaces: HashMap<Box<str>, Namespace>,
    kind: PhantomData<fn() -> K>,
}

impl<K> Default for State<K> {
    fn default() -> Self {
        Self {
            namespaces: HashMap::new(),
            kind: PhantomData,
        }
    }
}

impl<K: Resource + Clone + Serialize + DeserializeOwned> State<K> {
    fn objects(&self, namespace: &str, cluster: &str) -> Vec<K> {
        self.namespaces
            .get(namespace)
            .map(|ns| ns.objects(cluster))
            .unwrap_or_default()
    }

    fn insert(&mut self, obj: &K) {
        let namespace = obj.meta().namespace.as_deref().unwrap_or_default();
        let name = name_of(obj);
        // An object without the cluster label belongs to no cluster: not filed.
        let cluster = obj
            .meta()
            .labels
            .as_ref()
            .and_then(|l| l.get(labels::CLUSTER))
            .map(String::as_str);
        let filed = self
            .namespaces
            .get(namespace)
            .and_then(|ns| ns.cluster_of.get(name))
            .cloned();
        if filed.is_some() && filed.as_deref() != cluster {
            self.remove(namespace, name);
        }
        let Some(cluster) = cluster else {
            return;
        };
        if !self.namespaces.contains_key(namespace) {
            self.namespaces
                .insert(namespace.into(), Namespace::default());
        }
        let Some(ns) = self.namespaces.get_mut(namespace) else {
            return;
        };
        let cluster = ns.shared(cluster);
        let mut objects: Vec<K> = ns.objects(&cluster);
        objects.retain(|o| name_of(o) != name);
        objects.push(obj.clone());
        ns.keep(cluster.clone(), objects);
        if filed.as_deref() != Some(&*cluster) {
            ns.cluster_of.insert(name.into(), cluster);
        }
    }

    fn remove(&mut self, namespace: &str, name: &str) {
        if let Some(ns) = self.namespaces.get_mut(namespace) {
            ns.remove::<K>(name);
            if ns.is_empty() {
                self.namespaces.remove(namespace);
            }
        }
    }

    fn get(&self, namespace: &str, name: &str) -> Option<K> {
        let ns = self.namespaces.get(namespace)?;
        let cluster = ns.cluster_of.get(name)?;
        ns.objects::<K>(cluster)
            .into_iter()
            .find(|o| name_of(o) == name)
    }

    fn len(&self) -> usize {
        self.namespaces.values().map(|ns| ns.cluster_of.len()).sum()
    }
}

#[derive(Debug)]
struct Inner<K> {
    state: State<K>,
    /// A re-list in progress: filled by `InitApply`, swapped in at `InitDone`.
    buffer: Option<State<K>>,
    ready: bool,
}

/// The objects of one kind, by namespace and cluster label, kept by a watch.
#[derive(Debug)]
pub struct Index<K> {
    inner: Arc<RwLock<Inner<K>>>,
}

impl<K> Clone for Index<K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<K> Default for Index<K> {
    fn default() -> Self {
        Self {
            inner: Arc::new(RwLock::new(Inner {
                state: State::default(),
                buffer: None,
                ready: false,
            })),
        }
    }
}

impl<K: Resource + Clone + Serialize + DeserializeOwned> Index<K> {
    /// Applies one watch event.
    pub fn apply(&self, event: &watcher::Event<K>) {
        let Ok(mut inner) = self.inner.write() else {
            return;
        };
        match event {
            watcher::Event::Apply(obj) => inner.state.insert(obj),
            watcher::Event::Delete(obj) => {
                let namespace = obj.meta().namespace.clone().unwrap_or_default();
                inner.state.remove(&namespace, &obj.name_any());
            }
            watcher::Event::Init => inner.buffer = Some(State::default()),
            watcher::Event::InitApply(obj) => match inner.buffer.as_mut() {
                Some(buffer) => buffer.insert(obj),
                None => inner.state.insert(obj),
            },
            watcher::Event::InitDone => {
                if let Some(buffer) = inner.buffer.take() {
                    inner.state = buffer;
                }
                inner.ready = true;
            }
        }
    }

    /// Whether the first complete LIST has arrived.
    pub fn ready(&self) -> bool {
        self.inner.read().map(|i| i.ready).unwrap_or(false)
    }

    /// The objects of cluster `cluster` in `namespace`, ordered by name.
    pub fn of_cluster(&self, namespace: &str, cluster: &str) -> Vec<K> {
        let Ok(inner) = self.inner.read() else {
            return Vec::new();
        };
        inner.state.objects(namespace, cluster)
    }

    /// The (namespace, cluster) of every cluster with an object that `wanted`.
    pub fn clusters_with(&self, wanted: impl Fn(&K) -> bool) -> Vec<(String, String)> {
        let Ok(inner) = self.inner.read() else {
            return Vec::new();
        };
        let mut found = Vec::new();
        for (namespace, ns) in &inner.state.namespaces {
            for (cluster, group) in &ns.by_cluster {
                if group.unpack::<K>().iter().any(&wanted) {
                    found.push((namespace.to_string(), cluster.to_string()));
                }
            }
        }
        found
    }

    /// The resourceVersion and uid of object `name`, if the index holds it.
    fn version_of(&self, namespace: &str, name: &str) -> Option<(String, String)> {
        let inner = self.inner.read().ok()?;
        let obj = inner.state.get(namespace, name)?;
        Some((
            obj.meta().resource_version.clone().unwrap_or_default(),
            obj.meta().uid.clone().unwrap_or_default(),
        ))
    }

    /// How many objects the index holds.
    pub fn len(&self) -> usize {
        self.inner.read().map(|i| i.state.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A boxed stream of one child kind's watched objects, for `Controller::owns_stream`.
pub type Feed<K> = Pin<Box<dyn Stream<Item = Result<K, watcher::Error>> + Send>>;

/// Drops what no reader needs before an object is kept: `managedFields`.
pub fn trim<K: Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
}

/// [`trim`], and of a Pod's spec all but `nodeName`: a Pod is created once and never
/// applied again (only its metadata is repaired), so no pass compares its spec, and the
/// spec is most of a Pod's size. Its status stays whole.
pub fn trim_pod(pod: &mut Pod) {
    trim(pod);
    if let Some(spec) = pod.spec.as_mut() {
        *spec = k8s_openapi::api::core::v1::PodSpec {
            node_name: spec.node_name.take(),
            ..Default::default()
        };
    }
}

/// A watch of `K` (narrowed by `config`) that keeps `index` (each object as `trim`
/// leaves it) and yields every object it touches.
fn feed<K>(api: Api<K>, config: watcher::Config, index: Index<K>, trim: fn(&mut K)) -> Feed<K>
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug + Send + Sync + 'static,
{
    watcher(api, config)
        .default_backoff()
        .modify(trim)
        .map_ok(move |event| {
            index.apply(&event);
            event
        })
        .touched_objects()
        .boxed()
}

/// The caches of every child kind of the clusters in one scope (a namespace, or all).
#[derive(Clone, Debug, Default)]
pub struct Caches {
    pub service_accounts: Index<ServiceAccount>,
    pub roles: Index<Role>,
    pub role_bindings: Index<RoleBinding>,
    pub secrets: Index<Secret>,
    pub services: Index<Service>,
    pub pod_disruption_budgets: Index<PodDisruptionBudget>,
    pub pvcs: Index<PersistentVolumeClaim>,
    pub pods: Index<Pod>,
    pub network_policies: Index<NetworkPolicy>,
    pub deployments: Index<Deployment>,
    /// The PostgresBackups of the scope, from the backup controller's store.
    pub backups: Option<Store<PostgresBackup>>,
}

/// The watches that fill [`Caches`], one per kind.
pub struct Feeds {
    pub service_accounts: Feed<ServiceAccount>,
    pub roles: Feed<Role>,
    pub role_bindings: Feed<RoleBinding>,
    pub secrets: Feed<Secret>,
    pub services: Feed<Service>,
    pub pod_disruption_budgets: Feed<PodDisruptionBudget>,
    pub pvcs: Feed<PersistentVolumeClaim>,
    pub pods: Feed<Pod>,
    pub network_policies: Feed<NetworkPolicy>,
    pub deployments: Feed<Deployment>,
}

impl Caches {
    /// Caches of the children in `namespace` (all namespaces when `None`), and the
    /// watches that fill them: nothing is watched until the feeds are polled.
    pub fn watch(client: &Client, namespace: Option<&str>) -> (Caches, Feeds) {
        // Children are watched through the managed-by label only, so the caches hold
        // pgop's objects and not every Pod and Secret of the cluster.
        let config = watcher::Config::default().labels(&format!(
            "{}={}",
            labels::MANAGED_BY,
            labels::MANAGED_BY_VALUE
        ));
        let caches = Caches::default();
        let feeds = Feeds {
            service_accounts: feed(
                crate::api(client, namespace),
                config.clone(),
                caches.service_accounts.clone(),
                trim,
            ),
            roles: feed(
                crate::api(client, namespace),
                config.clone(),
                caches.roles.clone(),
                trim,
            ),
            role_bindings: feed(
                crate::api(client, namespace),
                config.clone(),
                caches.role_bindings.clone(),
                trim,
            ),
            secrets: feed(
                crate::api(client, namespace),
                config.clone(),
                caches.secrets.clone(),
                trim,
            ),
            services: feed(
                crate::api(client, namespace),
                config.clone(),
                caches.services.clone(),
                trim,
            ),
            pod_disruption_budgets: feed(
                crate::api(client, namespace),
                config.clone(),
                caches.pod_disruption_budgets.clone(),
                trim,
            ),
            pvcs: feed(
                crate::api(client, namespace),
                config.clone(),
                caches.pvcs.clone(),
                trim,
            ),
            pods: feed(
                crate::api(client, namespace),
                config.clone(),
                caches.pods.clone(),
                trim_pod,
            ),
            network_policies: feed(
                crate::api(client, namespace),
                config.clone(),
                caches.network_policies.clone(),
                trim,
            ),
            deployments: feed(
                crate::api(client, namespace),
                config,
                caches.deployments.clone(),
                trim,
            ),
        };
        (caches, feeds)
    }

    /// Whether every child kind's first LIST has arrived.
    pub fn ready(&self) -> bool {
        self.service_accounts.ready()
            && self.roles.ready()
            && self.role_bindings.ready()
            && self.secrets.ready()
            && self.services.ready()
            && self.pod_disruption_budgets.ready()
            && self.pvcs.ready()
            && self.pods.ready()
            && self.network_policies.ready()
            && self.deployments.ready()
    }

    /// The clusters with an instance Pod bound to node `node` (see
    /// [`crate::cluster::triggers`]).
    pub fn clusters_on_node(
        &self,
        node: &str,
    ) -> Vec<kube::runtime::reflector::ObjectRef<pgop_api::v1beta1::PostgresCluster>> {
        self.pods
            .clusters_with(|pod| {
                pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
            })
            .into_iter()
            .map(|(namespace, cluster)| {
                kube::runtime::reflector::ObjectRef::new(&cluster).within(&namespace)
            })
            .collect()
    }

    /// Every child of one cluster, as the caches hold them.
    pub fn observe(&self, namespace: &str, cluster: &str) -> Observed {
        Observed {
            service_accounts: self.service_accounts.of_cluster(namespace, cluster),
            roles: self.roles.of_cluster(namespace, cluster),
            role_bindings: self.role_bindings.of_cluster(namespace, cluster),
            secrets: self.secrets.of_cluster(namespace, cluster),
            services: self.services.of_cluster(namespace, cluster),
            pod_disruption_budgets: self.pod_disruption_budgets.of_cluster(namespace, cluster),
            pvcs: self.pvcs.of_cluster(namespace, cluster),
            pods: self.pods.of_cluster(namespace, cluster),
            network_policies: self.network_policies.of_cluster(namespace, cluster),
            deployments: self.deployments.of_cluster(namespace, cluster),
        }
    }

    /// The resourceVersion and uid of a child, by its kind.
    fn version_of(&self, kind: &str, namespace: &str, name: &str) -> Option<(String, String)> {
        match kind {
            "ServiceAccount" => self.service_accounts.version_of(namespace, name),
            "Role" => self.roles.version_of(namespace, name),
            "RoleBinding" => self.role_bindings.version_of(namespace, name),
            "Secret" => self.secrets.version_of(namespace, name),
            "Service" => self.services.version_of(namespace, name),
            "PodDisruptionBudget" => self.pod_disruption_budgets.version_of(namespace, name),
            "PersistentVolumeClaim" => self.pvcs.version_of(namespace, name),
            "Pod" => self.pods.version_of(namespace, name),
            "NetworkPolicy" => self.network_policies.version_of(namespace, name),
            "Deployment" => self.deployments.version_of(namespace, name),
            _ => None,
        }
    }

    /// Whether the caches show `written`: the object at that resourceVersion or later,
    /// or, for a deletion, no longer that object.
    fn shows(&self, namespace: &str, written: &Written) -> bool {
        let seen = self.version_of(written.kind, namespace, &written.name);
        match (&written.version, seen) {
            (Some(version), Some((seen, _))) => at_least(&seen, version),
            (Some(_), None) => false,
            (None, None) => true,
            (None, Some((_, uid))) => written.uid.as_deref().is_some_and(|gone| gone != uid),
        }
    }
}

/// Whether resourceVersion `seen` is `wanted` or later. Kubernetes calls resource
/// versions opaque; the API server's are etcd revisions, numbers that only grow, which is
/// what this relies on. Anything else compares for equality only.
fn at_least(seen: &str, wanted: &str) -> bool {
    match (seen.parse::<u64>(), wanted.parse::<u64>()) {
        (Ok(seen), Ok(wanted)) => seen >= wanted,
        _ => seen == wanted,
    }
}

/// One write of a reconcile to a child, remembered until the caches show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Written {
    pub kind: &'static str,
    pub name: String,
    /// The resourceVersion the write returned; `None` for a deletion.
    pub version: Option<String>,
    /// For a deletion, the uid of the object deleted (a new one of the same name is not it).
    pub uid: Option<String>,
}

/// How long a write is waited for in the caches before it is forgotten: a watch that has
/// not caught up by then is broken, and the cache's next re-list repairs it.
pub const EXPECTATION_TTL: Duration = Duration::from_secs(30);

#[derive(Debug)]
enum Expected {
    /// A pass is writing, or failed while writing: what it wrote is not known.
    Unknown,
    /// These writes, made at this moment.
    Writes(Instant, Vec<Written>),
}

/// Read-your-writes over the caches: what each cluster's last pass wrote, until the caches
/// show it. A cluster with writes the caches do not show yet is read from the API server.
#[derive(Debug, Default)]
pub struct Expectations {
    by_cluster: Mutex<HashMap<Key, Expected>>,
}

impl Expectations {
    /// A pass of this cluster starts writing: until [`Expectations::wrote`], its next pass
    /// reads from the API server.
    pub fn writing(&self, namespace: &str, cluster: &str) {
        if let Ok(mut map) = self.by_cluster.lock() {
            map.insert(
                (namespace.to_string(), cluster.to_string()),
                Expected::Unknown,
            );
        }
    }

    /// The pass finished writing: these are its writes.
    pub fn wrote(&self, namespace: &str, cluster: &str, written: Vec<Written>) {
        if let Ok(mut map) = self.by_cluster.lock() {
            let key = (namespace.to_string(), cluster.to_string());
            if written.is_empty() {
                map.remove(&key);
            } else {
                map.insert(key, Expected::Writes(Instant::now(), written));
            }
        }
    }

    /// Whether the caches show every write this cluster's passes made; forgets the writes
    /// once they do (or once they are older than [`EXPECTATION_TTL`]).
    pub fn met(&self, caches: &Caches, namespace: &str, cluster: &str) -> bool {
        let Ok(mut map) = self.by_cluster.lock() else {
            return false;
        };
        let key = (namespace.to_string(), cluster.to_string());
        let met = match map.get(&key) {
            None => return true,
            Some(Expected::Unknown) => false,
            Some(Expected::Writes(at, written)) => {
                at.elapsed() > EXPECTATION_TTL || written.iter().all(|w| caches.shows(namespace, w))
            }
        };
        if met {
            map.remove(&key);
        }
        met
    }

    /// Forgets a deleted cluster.
    pub fn forget(&self, namespace: &str, cluster: &str) {
        if let Ok(mut map) = self.by_cluster.lock() {
            map.remove(&(namespace.to_string(), cluster.to_string()));
        }
    }
}

/// The cluster that controls `child`: its controller ownerReference to a PostgresCluster
/// of pgop's group, in whichever version it names (`v1beta1` since pgop made its children
/// so, `v1alpha1` for children made before: [`pgop_api::owner`]).
pub fn owning_cluster<K: kube::Resource>(
    child: K,
) -> Option<kube::runtime::reflector::ObjectRef<pgop_api::v1beta1::PostgresCluster>> {
    let meta = child.meta();
    let namespace = meta.namespace.as_deref()?;
    meta.owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true) && pgop_api::owner::names_cluster(o))
        .map(|o| kube::runtime::reflector::ObjectRef::new(&o.name).within(namespace))
}

impl Feeds {
    /// Makes every child kind's watch a trigger of `controller` (each change of a child
    /// reconciles its cluster), filling the caches as it goes.
    pub fn attach(
        self,
        controller: kube::runtime::Controller<pgop_api::v1beta1::PostgresCluster>,
    ) -> kube::runtime::Controller<pgop_api::v1beta1::PostgresCluster> {
        // Not `owns_stream`: kube matches an ownerReference's apiVersion exactly, and
        // children made before `v1beta1` name `v1alpha1` until their first pass rewrites them.
        controller
            .watches_stream(self.pods, owning_cluster)
            .watches_stream(self.pvcs, owning_cluster)
            .watches_stream(self.services, owning_cluster)
            .watches_stream(self.secrets, owning_cluster)
            .watches_stream(self.pod_disruption_budgets, owning_cluster)
            .watches_stream(self.network_policies, owning_cluster)
            .watches_stream(self.service_accounts, owning_cluster)
            .watches_stream(self.roles, owning_cluster)
            .watches_stream(self.role_bindings, owning_cluster)
            .watches_stream(self.deployments, owning_cluster)
    }

    /// Drives every watch without a controller (tests, tools): the caches fill and follow.
    pub async fn run(self) {
        let Feeds {
            service_accounts,
            roles,
            role_bindings,
            secrets,
            services,
            pod_disruption_budgets,
            pvcs,
            pods,
            network_policies,
            deployments,
        } = self;
        fn unit<K: Send + 'static>(feed: Feed<K>) -> Pin<Box<dyn Stream<Item = ()> + Send>> {
            feed.map(|_| ()).boxed()
        }
        futures::stream::select_all([
            unit(service_accounts),
            unit(roles),
            unit(role_bindings),
            unit(secrets),
            unit(services),
            unit(pod_disruption_budgets),
            unit(pvcs),
            unit(pods),
            unit(network_policies),
            unit(deployments),
        ])
        .for_each(|()| async {})
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_wakes_the_cluster_its_controller_reference_names_in_either_version() {
        let child = |owners: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "db-1", "namespace": "ns", "ownerReferences": owners}
            }))
            .expect("a pod")
        };
        let owner = |api_version: &str, kind: &str, controller: bool| {
            serde_json::json!({"apiVersion": api_version, "kind": kind, "name": "db",
                               "uid": "u1", "controller": controller})
        };
        let expected = Some(kube::runtime::reflector::ObjectRef::new("db").within("ns"));
        for version in ["v1alpha1", "v1beta1"] {
            let named = child(serde_json::json!([owner(
                &format!("database.example.com/{version}"),
                "PostgresCluster",
                true
            )]));
            assert_eq!(owning_cluster(named), expected, "{version}");
        }
        for other in [
            owner("database.example.com/v1alpha1", "PostgresCluster", false),
            owner("other.example.com/v1", "PostgresCluster", true),
            owner("database.example.com/v1alpha1", "PostgresBackup", true),
        ] {
            assert_eq!(
                owning_cluster(child(serde_json::json!([other.clone()]))),
                None,
                "{other}"
            );
        }
        assert_eq!(owning_cluster(child(serde_json::json!([]))), None);
    }

    fn pod(name: &str, cluster: Option<&str>, rv: &str, uid: &str) -> Pod {
        let mut labels = serde_json::Map::new();
        if let Some(c) = cluster {
            labels.insert(labels::CLUSTER.into(), c.into());
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ns", "labels": labels,
                         "resourceVersion": rv, "uid": uid},
        }))
        .expect("pod")
    }

    fn names(pods: &[Pod]) -> Vec<String> {
        pods.iter().map(|p| p.name_any()).collect()
    }

    #[test]
    fn objects_are_filed_by_cluster_label_and_follow_relabelling_and_deletion() {
        let index = Index::<Pod>::default();
        index.apply(&watcher::Event::Init);
        index.apply(&watcher::Event::InitApply(pod("a-1", Some("a"), "1", "u1")));
        assert!(!index.ready(), "not ready before the LIST is complete");
        index.apply(&watcher::Event::InitDone);
        assert!(index.ready());
        index.apply(&watcher::Event::Apply(pod("a-2", Some("a"), "2", "u2")));
        index.apply(&watcher::Event::Apply(pod("b-1", Some("b"), "3", "u3")));
        index.apply(&watcher::Event::Apply(pod("loose", None, "4", "u4")));
        assert_eq!(names(&index.of_cluster("ns", "a")), ["a-1", "a-2"]);
        assert_eq!(names(&index.of_cluster("ns", "b")), ["b-1"]);
        assert_eq!(names(&index.of_cluster("other", "a")), Vec::<String>::new());
        // Relabelled to another cluster: it moves.
        index.apply(&watcher::Event::Apply(pod("a-2", Some("b"), "5", "u2")));
        assert_eq!(names(&index.of_cluster("ns", "a")), ["a-1"]);
        assert_eq!(names(&index.of_cluster("ns", "b")), ["a-2", "b-1"]);
        index.apply(&watcher::Event::Delete(pod("a-1", Some("a"), "6", "u1")));
        assert_eq!(names(&index.of_cluster("ns", "a")), Vec::<String>::new());
        assert_eq!(index.len(), 2);
        // Which clusters hold an object that matches.
        let mut found = index.clusters_with(|p| p.metadata.uid.as_deref() == Some("u2"));
        found.sort();
        assert_eq!(found, [("ns".to_string(), "b".to_string())]);
        assert!(index.clusters_with(|_| false).is_empty());
    }

    #[test]
    fn a_cluster_name_is_kept_once_and_an_emptied_namespace_goes() {
        let mut state = State::<Pod>::default();
        state.insert(&pod("a-1", Some("a"), "1", "u1"));
        state.insert(&pod("a-2", Some("a"), "2", "u2"));
        state.insert(&pod("a-2", Some("a"), "3", "u2"));
        let ns = state.namespaces.get("ns").expect("namespace kept");
        let (kept, _) = ns.by_cluster.get_key_value("a").expect("group kept");
        for name in ["a-1", "a-2"] {
            assert!(
                Arc::ptr_eq(kept, &ns.cluster_of[name]),
                "{name} shares its group's copy of the cluster's name"
            );
        }
        // The same name in another namespace is another object.
        let mut elsewhere = pod("a-1", Some("a"), "4", "u4");
        elsewhere.metadata.namespace = Some("other".into());
        state.insert(&elsewhere);
        assert_eq!(state.len(), 3);
        state.remove("ns", "a-1");
        state.remove("ns", "a-2");
        assert!(!state.namespaces.contains_key("ns"), "emptied, so gone");
        let kept = state.get("other", "a-1").and_then(|p| p.metadata.uid);
        assert_eq!(kept.as_deref(), Some("u4"));
        assert_eq!(state.len(), 1);
    }

    #[test]
    fn a_relist_is_swapped_in_whole() {
        let index = Index::<Pod>::default();
        index.apply(&watcher::Event::Init);
        index.apply(&watcher::Event::InitApply(pod("a-1", Some("a"), "1", "u1")));
        index.apply(&watcher::Event::InitApply(pod("a-2", Some("a"), "1", "u2")));
        index.apply(&watcher::Event::InitDone);
        // The watch broke; the re-list finds a-2 gone and a-3 new.
        index.apply(&watcher::Event::Init);
        index.apply(&watcher::Event::InitApply(pod("a-1", Some("a"), "7", "u1")));
        assert_eq!(
            names(&index.of_cluster("ns", "a")),
            ["a-1", "a-2"],
            "the old state serves until the re-list is complete"
        );
        index.apply(&watcher::Event::InitApply(pod("a-3", Some("a"), "8", "u3")));
        index.apply(&watcher::Event::InitDone);
        assert_eq!(names(&index.of_cluster("ns", "a")), ["a-1", "a-3"]);
        assert!(index.ready());
    }

    #[test]
    fn a_group_gives_back_exactly_what_was_kept() {
        let secret: Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a-ca", "namespace": "ns", "labels": {labels::CLUSTER: "a"},
                         "annotations": {"x": "quote \" newline \n"},
                         "resourceVersion": "7", "uid": "u7"},
            "type": "Opaque",
            "data": {"ca.crt": "LS0tLS1CRUdJTg==", "ca.key": "AAEC/w=="},
        }))
        .expect("secret");
        let mut pod = pod("a-1", Some("a"), "8", "u8");
        pod.status = serde_json::from_value(serde_json::json!({
            "phase": "Running", "podIP": "10.0.0.1",
            "conditions": [{"type": "Ready", "status": "True",
                            "lastTransitionTime": "2026-12-02T12:00:00Z"}],
        }))
        .expect("status");
        let secrets = Index::<Secret>::default();
        secrets.apply(&watcher::Event::Apply(secret.clone()));
        assert_eq!(secrets.of_cluster("ns", "a"), [secret]);
        let pods = Index::<Pod>::default();
        pods.apply(&watcher::Event::Apply(pod.clone()));
        assert_eq!(pods.of_cluster("ns", "a"), [pod]);
        assert_eq!(
            pods.version_of("ns", "a-1"),
            Some(("8".to_string(), "u8".to_string()))
        );
        assert_eq!(pods.version_of("ns", "a-2"), None);
    }

    fn ready_caches() -> Caches {
        let caches = Caches::default();
        caches.pods.apply(&watcher::Event::Init);
        caches.pods.apply(&watcher::Event::InitDone);
        caches
    }

    #[test]
    fn writes_are_expected_until_the_caches_show_them() {
        let caches = ready_caches();
        let expectations = Expectations::default();
        assert!(expectations.met(&caches, "ns", "a"), "nothing written");
        expectations.writing("ns", "a");
        assert!(!expectations.met(&caches, "ns", "a"), "a pass in flight");
        let created = Written {
            kind: "Pod",
            name: "a-1".into(),
            version: Some("10".into()),
            uid: None,
        };
        expectations.wrote("ns", "a", vec![created]);
        assert!(
            !expectations.met(&caches, "ns", "a"),
            "not in the cache yet"
        );
        caches
            .pods
            .apply(&watcher::Event::Apply(pod("a-1", Some("a"), "9", "u1")));
        assert!(!expectations.met(&caches, "ns", "a"), "an older version");
        caches
            .pods
            .apply(&watcher::Event::Apply(pod("a-1", Some("a"), "12", "u1")));
        assert!(expectations.met(&caches, "ns", "a"), "a later version");
        assert!(expectations.met(&caches, "ns", "b"), "other clusters");

        // A deletion is shown once the object is gone, or replaced by a new one.
        let deleted = Written {
            kind: "Pod",
            name: "a-1".into(),
            version: None,
            uid: Some("u1".into()),
        };
        expectations.wrote("ns", "a", vec![deleted.clone()]);
        assert!(!expectations.met(&caches, "ns", "a"));
        caches
            .pods
            .apply(&watcher::Event::Apply(pod("a-1", Some("a"), "14", "u9")));
        assert!(
            expectations.met(&caches, "ns", "a"),
            "a new Pod of that name"
        );
        expectations.wrote("ns", "a", vec![deleted]);
        caches
            .pods
            .apply(&watcher::Event::Delete(pod("a-1", Some("a"), "15", "u9")));
        assert!(expectations.met(&caches, "ns", "a"), "gone");
        // A pass that wrote nothing expects nothing.
        expectations.writing("ns", "a");
        expectations.wrote("ns", "a", Vec::new());
        assert!(expectations.met(&caches, "ns", "a"));
    }

    #[test]
    fn resource_versions_compare_as_numbers_when_they_are() {
        assert!(at_least("10", "9"));
        assert!(!at_least("9", "10"));
        assert!(at_least("abc", "abc"));
        assert!(!at_least("abd", "abc"));
    }
}
