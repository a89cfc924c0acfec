//! The objects the manager reads, kept from watches instead of read on every pass: its
//! cluster, the Secrets it uses, the primary's Pod. Each is one watch narrowed to one
//! object (`fieldSelector=metadata.name=<name>`), which RBAC authorizes against the
//! `resourceNames` of the instance Role. A pass reads the latest version the watch saw, so
//! that a manager in its steady state sends no request at all.
//!
//! Each watch computes a digest of what the manager uses of its object and wakes the
//! manager's loop only when that digest changes: the operator's status writes that do not
//! concern the manager (LSNs, conditions) wake nothing.
//!
//! Until a watch has listed its object (or while the API server refuses it), a read falls
//! back to a GET, as before the watches existed: a manager under an older instance Role
//! (without `list`/`watch` on Pods or Secrets) still works, at the former cost.

use futures::StreamExt;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, watch};

/// How long a read waits for a new watch's first list before it falls back to a GET.
const FIRST_LIST: Duration = Duration::from_secs(5);

/// A digest of `value` (its JSON form): equal values, equal digests.
pub fn digest(value: &impl Serialize) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_vec(value)
        .unwrap_or_default()
        .hash(&mut hasher);
    hasher.finish()
}

/// What a watch knows of its object.
#[derive(Debug)]
enum Seen<K> {
    /// Not listed yet; `failing`: the watch has failed since it started (e.g. refused).
    Unknown {
        failing: bool,
    },
    Absent,
    Present(Arc<K>),
}

/// One object `name`, kept from its watch. Dropping it ends the watch.
pub struct Named<K> {
    api: Api<K>,
    name: String,
    seen: watch::Receiver<Seen<K>>,
    task: tokio::task::JoinHandle<()>,
}

impl<K> Drop for Named<K> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What a [`Named`] object can be.
pub trait Object:
    kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
}

impl<K> Object for K where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
}

impl<K: Object> Named<K> {
    /// Watches `name` through `api`; wakes `wake` when `concern` (a digest of what the
    /// manager uses of the object, or its absence) changes, the first list included.
    pub fn start(api: Api<K>, name: &str, concern: fn(&K) -> u64, wake: Arc<Notify>) -> Self {
        let (tx, seen) = watch::channel(Seen::Unknown { failing: false });
        let task = tokio::spawn(follow(api.clone(), name.to_string(), concern, tx, wake));
        Self {
            api,
            name: name.to_string(),
            seen,
            task,
        }
    }

    /// The object as its watch last saw it (`None`: it does not exist). Before the
    /// watch's first list, it waits for it (at most [`FIRST_LIST`], not at all once the
    /// watch failed) and otherwise reads it with a GET.
    pub async fn get(&self) -> Result<Option<Arc<K>>, kube::Error> {
        let mut seen = self.seen.clone();
        let _ = tokio::time::timeout(
            FIRST_LIST,
            seen.wait_for(|s| !matches!(s, Seen::Unknown { failing: false })),
        )
        .await;
        let known = match &*seen.borrow() {
            Seen::Present(k) => Some(Some(k.clone())),
            Seen::Absent => Some(None),
            Seen::Unknown { .. } => None,
        };
        match known {
            Some(known) => Ok(known),
            None => Ok(self.api.get_opt(&self.name).await?.map(Arc::new)),
        }
    }
}

/// Runs the watch of `name` until its [`Named`] is dropped.
async fn follow<K: Object>(
    api: Api<K>,
    name: String,
    concern: fn(&K) -> u64,
    tx: watch::Sender<Seen<K>>,
    wake: Arc<Notify>,
) {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    // With back-off: a refused or failing watch must not spin.
    let events = watcher::watcher(api, config).default_backoff();
    let mut events = std::pin::pin!(events);
    // The object found by a list in progress.
    let mut listing: Option<K> = None;
    // The digest last seen (`Some(None)`: absent), `None` before the first list.
    let mut last: Option<Option<u64>> = None;
    let mut warned = false;
    let kind = K::kind(&());
    while let Some(event) = events.next().await {
        let now = match event {
            Ok(Event::Init) => {
                listing = None;
                continue;
            }
            Ok(Event::InitApply(object)) => {
                listing = Some(object);
                continue;
            }
            Ok(Event::InitDone) => listing.take(),
            Ok(Event::Apply(object)) => Some(object),
            Ok(Event::Delete(_)) => None,
            Err(err) => {
                if !warned {
                    tracing::warn!(%kind, %name, error = %crate::error_chain(&err), "watching (retrying; reads fall back to GET until it lists)");
                    warned = true;
                }
                tx.send_if_modified(|s| match s {
                    Seen::Unknown { failing } if !*failing => {
                        *failing = true;
                        true
                    }
                    _ => false,
                });
                continue;
            }
        };
        warned = false;
        let concern = now.as_ref().map(concern);
        let changed = last != Some(concern);
        last = Some(concern);
        tx.send_replace(match now {
            Some(object) => Seen::Present(Arc::new(object)),
            None => Seen::Absent,
        });
        if changed {
            wake.notify_one();
        }
    }
}

/// A watch and when it was last read.
type Used<K> = (Arc<Named<K>>, Instant);

/// Watches of several objects of one kind by name, started at their first read.
pub struct Watches<K> {
    api: Api<K>,
    concern: fn(&K) -> u64,
    wake: Arc<Notify>,
    watches: Mutex<HashMap<String, Used<K>>>,
}

impl<K: Object> Watches<K> {
    pub fn new(api: Api<K>, concern: fn(&K) -> u64, wake: Arc<Notify>) -> Self {
        Self {
            api,
            concern,
            wake,
            watches: Mutex::new(HashMap::new()),
        }
    }

    /// Object `name` ([`Named::get`]), watched from now on.
    pub async fn get(&self, name: &str) -> Result<Option<Arc<K>>, kube::Error> {
        let named = {
            let mut watches = self.watches.lock().unwrap_or_else(PoisonError::into_inner);
            let (named, used) = watches.entry(name.to_string()).or_insert_with(|| {
                let named = Named::start(self.api.clone(), name, self.concern, self.wake.clone());
                (Arc::new(named), Instant::now())
            });
            *used = Instant::now();
            named.clone()
        };
        named.get().await
    }

    /// Ends the watches not read for `idle` (e.g. a Secret the spec no longer names).
    pub fn forget_idle(&self, idle: Duration) {
        let mut watches = self.watches.lock().unwrap_or_else(PoisonError::into_inner);
        watches.retain(|_, (_, used)| used.elapsed() < idle);
    }

    /// Ends every watch but that of `name`.
    pub fn keep_only(&self, name: &str) {
        let mut watches = self.watches.lock().unwrap_or_else(PoisonError::into_inner);
        watches.retain(|n, _| n == name);
    }
}

/// What a manager (of an instance, or of a pooler) reads of the API server, each kept
/// from a watch: its cluster by name, Secrets and Pods each by name, and the [`Notify`]
/// every one of them wakes when what the manager uses of it changes.
pub struct Inputs {
    pub cluster: Named<pgop_api::v1beta1::PostgresCluster>,
    pub secrets: Watches<k8s_openapi::api::core::v1::Secret>,
    pub pods: Watches<k8s_openapi::api::core::v1::Pod>,
    pub wake: Arc<Notify>,
}

/// The digests of what a manager uses of each kind (see [`Named::start`]).
pub struct Concerns {
    pub cluster: fn(&pgop_api::v1beta1::PostgresCluster) -> u64,
    pub secret: fn(&k8s_openapi::api::core::v1::Secret) -> u64,
    pub pod: fn(&k8s_openapi::api::core::v1::Pod) -> u64,
}

impl Inputs {
    /// Starts the watch of `cluster` in `namespace`; those of Secrets and Pods start with
    /// their first read.
    pub fn start(
        client: &kube::Client,
        namespace: &str,
        cluster: &str,
        concerns: Concerns,
    ) -> Self {
        let wake = Arc::new(Notify::new());
        Self {
            cluster: Named::start(
                Api::namespaced(client.clone(), namespace),
                cluster,
                concerns.cluster,
                wake.clone(),
            ),
            secrets: Watches::new(
                Api::namespaced(client.clone(), namespace),
                concerns.secret,
                wake.clone(),
            ),
            pods: Watches::new(
                Api::namespaced(client.clone(), namespace),
                concerns.pod,
                wake.clone(),
            ),
            wake,
        }
    }
}
