//! A contender for a Kubernetes Lease (`coordination.k8s.io/v1`): at most one holder at a
//! time, as long as every holder renews it and stops acting as the holder once it cannot.
//! pgop uses it for an instance's primary Lease (`pgop-instance`: only the holder runs
//! PostgreSQL as a primary) and for the operator's leader election (`pgop-operator`: only
//! the holder runs the controllers).
//!
//! - acquire ([`Contender::try_acquire`]): absent → create; held by me → renew; released
//!   (no holder) → take it; held by another → take it over only once this contender has
//!   seen it unchanged (same resourceVersion) for `leaseDurationSeconds` on its own
//!   monotonic clock, as client-go's leader election does (clock skew between nodes does
//!   not matter).
//! - renew: every few seconds while held ([`keep`]), an update of the version this
//!   contender last wrote, without reading it first (a conflict means someone else wrote
//!   it since: then it is read); a Lease held by someone else, or no renewal for
//!   [`Timings::fence_after`], calls the holder's fence callback once, well before another
//!   contender may take the Lease over.
//! - release ([`Contender::release`]): clear `holderIdentity`, only if this contender holds
//!   it, so that the next one need not wait for it to expire.
//!
//! Every write is an update with the resourceVersion just read or last written
//! (compare-and-swap) or a create: two contenders never both succeed. Only `create`, `get` and `update` are used.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to read Lease {name}")]
    Read {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("failed to write Lease {name}")]
    Write {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("no answer from the API server about Lease {name} within {timeout:?}")]
    Timeout { name: String, timeout: Duration },
}

/// How long things take; each user has its own (an instance's primary Lease, the operator's
/// leader election), tests shorten them. `fence_after` must be well below `duration`: a
/// holder gives up before anyone else may take over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    /// `leaseDurationSeconds`: how long a contender must see the Lease unchanged.
    pub duration: Duration,
    /// How often the holder renews.
    pub renew: Duration,
    /// A holder without a successful renewal for this long fences itself.
    pub fence_after: Duration,
}

/// What one renewal found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Renewal {
    /// Still mine, renewed.
    Renewed,
    /// Someone else holds it (`None`: released by someone else, i.e. no longer mine).
    Lost { holder: Option<String> },
}

/// Why a holder fenced itself (the argument of [`keep`]'s fence callback).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fence {
    /// The Lease names another holder (or none).
    Lost { holder: Option<String> },
    /// No renewal succeeded for this long.
    NotRenewed(Duration),
}

impl std::fmt::Display for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fence::Lost { holder: Some(h) } => write!(f, "the Lease is held by {h}"),
            Fence::Lost { holder: None } => write!(f, "the Lease was released by someone else"),
            Fence::NotRenewed(d) => write!(f, "the Lease was not renewed for {d:?}"),
        }
    }
}

/// The last version of another holder's Lease this contender saw, and since when.
#[derive(Debug, Clone)]
struct Observation {
    resource_version: String,
    since: Instant,
}

/// One contender for a Lease: its name and namespace, and who contends (`identity`, written
/// to `holderIdentity`).
#[derive(Debug)]
pub struct Contender {
    api: Api<Lease>,
    name: String,
    identity: String,
    timings: Timings,
    owner: std::sync::Mutex<Option<OwnerReference>>,
    observed: std::sync::Mutex<Option<Observation>>,
    /// The Lease as this contender last wrote it while holding it: the next renewal
    /// updates that version (compare-and-swap) without reading it first.
    written: std::sync::Mutex<Option<Lease>>,
    /// The `acquireTime` this contender wrote when it last took the Lease: a Lease naming
    /// this identity with another `acquireTime` was taken by another process of the same
    /// identity (a container of the same Pod that died), and is taken anew, not renewed.
    acquired: std::sync::Mutex<Option<MicroTime>>,
}

/// Every request gets at most this long: a hung API server must not delay fencing.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

fn now() -> MicroTime {
    MicroTime(Timestamp::now())
}

fn holder_of(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty())
}

fn is_conflict(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 409)
}

fn is_not_found(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 404)
}

impl Contender {
    /// The Lease `name` in `namespace`, contended for as `identity`.
    pub fn new(
        client: kube::Client,
        namespace: &str,
        name: &str,
        identity: &str,
        timings: Timings,
    ) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            identity: identity.to_string(),
            timings,
            owner: std::sync::Mutex::new(None),
            observed: std::sync::Mutex::new(None),
            written: std::sync::Mutex::new(None),
            acquired: std::sync::Mutex::new(None),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    pub fn timings(&self) -> Timings {
        self.timings
    }

    /// An ownerReference written on the Lease from now on (e.g. the PostgresCluster of a
    /// primary Lease, not as controller), so that it is garbage-collected with its owner.
    pub fn set_owner(&self, owner: OwnerReference) {
        *lock(&self.owner) = Some(owner);
    }

    async fn bounded<T>(
        &self,
        request: impl Future<Output = Result<T, kube::Error>>,
        wrap: fn(String, kube::Error) -> Error,
    ) -> Result<T, Error> {
        match tokio::time::timeout(REQUEST_TIMEOUT, request).await {
            Ok(result) => result.map_err(|source| wrap(self.name.clone(), source)),
            Err(_) => Err(Error::Timeout {
                name: self.name.clone(),
                timeout: REQUEST_TIMEOUT,
            }),
        }
    }

    /// The Lease as it is now.
    pub async fn read(&self) -> Result<Option<Lease>, Error> {
        self.bounded(self.api.get_opt(&self.name), |name, source| Error::Read {
            name,
            source,
        })
        .await
    }

    /// Records a version of the Lease seen elsewhere (a watch), held by someone else: the
    /// clock of a takeover starts when a version is first seen, so seeing each renewal as
    /// it happens lets a contender take over an abandoned Lease about its duration after
    /// the last renewal, rather than its duration after it first looked. Safe: a takeover
    /// still needs a fresh read showing that very version ([`Self::try_acquire`]), which
    /// the holder has then not renewed since this contender first saw it.
    pub fn observe(&self, lease: &Lease) {
        let Some(holder) = holder_of(lease) else {
            return;
        };
        if holder == self.identity {
            return;
        }
        let Some(version) = lease.metadata.resource_version.clone() else {
            return;
        };
        let mut observed = lock(&self.observed);
        if observed
            .as_ref()
            .is_none_or(|o| o.resource_version != version)
        {
            *observed = Some(Observation {
                resource_version: version,
                since: Instant::now(),
            });
        }
    }

    /// The current holder (`None`: absent or released).
    pub async fn holder(&self) -> Result<Option<String>, Error> {
        Ok(self
            .read()
            .await?
            .as_ref()
            .and_then(holder_of)
            .map(str::to_string))
    }

    fn with_owner(&self, meta: &mut ObjectMeta) {
        let Some(owner) = lock(&self.owner).clone() else {
            return;
        };
        put_owner(meta, owner);
    }

    /// Records `lease` as just written by this contender (kept only while it holds it).
    fn wrote(&self, lease: Option<Lease>) {
        let mine = lease.filter(|l| holder_of(l) == Some(self.identity.as_str()));
        if let Some(acquired) = mine
            .as_ref()
            .and_then(|l| l.spec.as_ref()?.acquire_time.clone())
        {
            *lock(&self.acquired) = Some(acquired);
        }
        *lock(&self.written) = mine;
    }

    /// Whether `lease`, which names this identity, was taken by this contender (not by an
    /// earlier process of the same identity).
    fn taken_by_me(&self, lease: &Lease) -> bool {
        let acquired = lease.spec.as_ref().and_then(|s| s.acquire_time.as_ref());
        acquired.is_some() && acquired == lock(&self.acquired).as_ref()
    }

    fn duration_seconds(&self) -> i32 {
        i32::try_from(self.timings.duration.as_secs()).unwrap_or(i32::MAX)
    }

    async fn create(&self) -> Result<bool, Error> {
        let mut lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.identity.clone()),
                lease_duration_seconds: Some(self.duration_seconds()),
                acquire_time: Some(now()),
                renew_time: Some(now()),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        };
        self.with_owner(&mut lease.metadata);
        match self
            .bounded(
                self.api.create(&PostParams::default(), &lease),
                |name, source| Error::Write { name, source },
            )
            .await
        {
            Ok(written) => {
                self.wrote(Some(written));
                Ok(true)
            }
            Err(Error::Write { source, .. }) if is_conflict(&source) => Ok(false),
            Err(err) => Err(err),
        }
    }

    /// Writes `lease` back (update with the resourceVersion it was read with); `false` when
    /// someone else wrote it first.
    async fn replace(&self, lease: &Lease) -> Result<bool, Error> {
        self.wrote(None);
        match self
            .bounded(
                self.api.replace(&self.name, &PostParams::default(), lease),
                |name, source| Error::Write { name, source },
            )
            .await
        {
            Ok(written) => {
                self.wrote(Some(written));
                Ok(true)
            }
            Err(Error::Write { source, .. }) if is_conflict(&source) => Ok(false),
            Err(err) => Err(err),
        }
    }

    /// Takes `lease` (released, or expired as observed) or renews it (mine).
    async fn take(&self, mut lease: Lease, mine: bool) -> Result<bool, Error> {
        self.with_owner(&mut lease.metadata);
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if !mine {
            spec.holder_identity = Some(self.identity.clone());
            spec.acquire_time = Some(now());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
        }
        spec.lease_duration_seconds = Some(self.duration_seconds());
        spec.renew_time = Some(now());
        self.replace(&lease).await
    }

    /// Tries once to become (or stay) the holder; `Ok(false)`: someone else holds it.
    pub async fn try_acquire(&self) -> Result<bool, Error> {
        let Some(lease) = self.read().await? else {
            return self.create().await;
        };
        match holder_of(&lease) {
            Some(holder) if holder == self.identity => {
                // Written by an earlier process of this identity (a container that died
                // while holding it): taken anew, with a fresh acquireTime, so that what
                // judges that holder dead by its acquireTime (the operator) cannot
                // release this one.
                let mine = self.taken_by_me(&lease);
                self.take(lease, mine).await
            }
            None => self.take(lease, false).await,
            Some(holder) => {
                let version = lease.metadata.resource_version.clone().unwrap_or_default();
                let declared = lease
                    .spec
                    .as_ref()
                    .and_then(|s| s.lease_duration_seconds)
                    .and_then(|s| u64::try_from(s).ok())
                    .map(Duration::from_secs)
                    .unwrap_or_default();
                let duration = declared.max(self.timings.duration);
                let expired = {
                    let mut observed = lock(&self.observed);
                    match observed.as_ref() {
                        Some(o) if o.resource_version == version => o.since.elapsed() >= duration,
                        _ => {
                            *observed = Some(Observation {
                                resource_version: version,
                                since: Instant::now(),
                            });
                            false
                        }
                    }
                };
                if !expired {
                    return Ok(false);
                }
                tracing::warn!(lease = %self.name, %holder, ?duration, "taking the Lease over: its holder has not renewed it");
                self.take(lease, false).await
            }
        }
    }

    /// One renewal by the holder: an update of the version it last wrote, else (written by
    /// someone else since, deleted, or not known) read and written.
    pub async fn renew(&self) -> Result<Renewal, Error> {
        let written = lock(&self.written).take();
        if let Some(lease) = written {
            match self.take(lease, true).await {
                Ok(true) => return Ok(Renewal::Renewed),
                // Written by someone else since: read it below.
                Ok(false) => {}
                Err(Error::Write { source, .. }) if is_not_found(&source) => {}
                Err(err) => return Err(err),
            }
        }
        for _ in 0..2 {
            let Some(lease) = self.read().await? else {
                // Deleted: nobody holds it; a create is a compare-and-swap too.
                if self.create().await? {
                    return Ok(Renewal::Renewed);
                }
                continue;
            };
            match holder_of(&lease) {
                Some(holder) if holder == self.identity => {
                    if self.take(lease, true).await? {
                        return Ok(Renewal::Renewed);
                    }
                }
                holder => {
                    return Ok(Renewal::Lost {
                        holder: holder.map(str::to_string),
                    });
                }
            }
        }
        // Written by someone else twice in a row while this one was renewing: re-read.
        match self.read().await?.as_ref().and_then(holder_of) {
            Some(holder) if holder == self.identity => Ok(Renewal::Renewed),
            holder => Ok(Renewal::Lost {
                holder: holder.map(str::to_string),
            }),
        }
    }

    /// Gives the Lease up (clears `holderIdentity`) if this contender holds it, so that the
    /// next holder need not wait for it to expire. `true` when it was released now.
    pub async fn release(&self) -> Result<bool, Error> {
        for _ in 0..3 {
            let Some(mut lease) = self.read().await? else {
                return Ok(false);
            };
            if holder_of(&lease) != Some(self.identity.as_str()) {
                return Ok(false);
            }
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            spec.holder_identity = Some(String::new());
            spec.renew_time = Some(now());
            if self.replace(&lease).await? {
                tracing::info!(lease = %self.name, "released the Lease");
                return Ok(true);
            }
        }
        Ok(false)
    }
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The background renewal of a held Lease ([`keep`]). Dropping it stops renewing.
#[derive(Debug)]
pub struct Keeper {
    task: tokio::task::JoinHandle<()>,
    fenced: Arc<std::sync::Mutex<Option<Fence>>>,
}

impl Keeper {
    /// Why the holder fenced itself, once it has (renewal then stops).
    pub fn fenced(&self) -> Option<Fence> {
        lock(&self.fenced).clone()
    }

    /// Stops renewing (the Lease stays as last written).
    pub async fn stop(mut self) {
        self.task.abort();
        let _ = (&mut self.task).await;
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Renews `lease` every `renew` interval from `acquired` (when the acquiring request was
/// sent). When the Lease is found held by someone else, or no renewal succeeded for
/// `fence_after`, calls `fence` once and stops renewing.
pub fn keep<F, Fut>(lease: Arc<Contender>, acquired: Instant, fence: F) -> Keeper
where
    F: FnOnce(Fence) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let fenced = Arc::new(std::sync::Mutex::new(None));
    let record = fenced.clone();
    let task = tokio::spawn(async move {
        let timings = lease.timings();
        let mut renewed = acquired;
        let mut next = tokio::time::Instant::from_std(acquired);
        let reason = loop {
            next += timings.renew;
            tokio::time::sleep_until(next).await;
            let sent = Instant::now();
            let left = timings.fence_after.saturating_sub(renewed.elapsed());
            match tokio::time::timeout(left.max(Duration::from_millis(1)), lease.renew()).await {
                Ok(Ok(Renewal::Renewed)) => renewed = sent,
                Ok(Ok(Renewal::Lost { holder })) => break Fence::Lost { holder },
                Ok(Err(err)) => {
                    tracing::warn!(lease = %lease.name(), error = %error_chain(&err), "failed to renew the Lease")
                }
                Err(_) => {
                    tracing::warn!(lease = %lease.name(), "failed to renew the Lease in time")
                }
            }
            if renewed.elapsed() >= timings.fence_after {
                break Fence::NotRenewed(renewed.elapsed());
            }
            // A renewal that overran the interval: go on from now.
            let now = tokio::time::Instant::now();
            if next < now {
                next = now;
            }
        };
        tracing::warn!(lease = %lease.name(), %reason, "lost the Lease");
        *lock(&record) = Some(reason.clone());
        fence(reason).await;
    });
    Keeper { task, fenced }
}

/// `err` and its sources, `: `-separated.
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// Puts `owner` among `meta`'s ownerReferences: added, or replacing the reference to the
/// same owner (uid) when that one names it otherwise (another apiVersion, say).
fn put_owner(meta: &mut ObjectMeta, owner: OwnerReference) {
    let refs = meta.owner_references.get_or_insert_with(Vec::new);
    match refs.iter_mut().find(|r| r.uid == owner.uid) {
        Some(r) => *r = owner,
        None => refs.push(owner),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(api_version: &str, uid: &str) -> OwnerReference {
        OwnerReference {
            api_version: api_version.into(),
            kind: "PostgresCluster".into(),
            name: "db".into(),
            uid: uid.into(),
            ..OwnerReference::default()
        }
    }

    #[test]
    fn the_owner_is_added_once_and_renamed_in_place() {
        let mut meta = ObjectMeta::default();
        put_owner(&mut meta, owner("example.com/v1alpha1", "1"));
        put_owner(&mut meta, owner("example.com/v1alpha1", "1"));
        assert_eq!(
            meta.owner_references.as_deref(),
            Some(&[owner("example.com/v1alpha1", "1")][..])
        );
        meta.owner_references
            .get_or_insert_with(Vec::new)
            .push(owner("other/v1", "2"));
        put_owner(&mut meta, owner("example.com/v1beta1", "1"));
        assert_eq!(
            meta.owner_references.as_deref(),
            Some(&[owner("example.com/v1beta1", "1"), owner("other/v1", "2")][..])
        );
    }
}
