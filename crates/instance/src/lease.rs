//! The primary Lease (`coordination.k8s.io/v1`, named after the cluster): only its holder may
//! run PostgreSQL as a primary, so two primaries never accept writes at once, whatever the
//! cluster status says while it changes.
//!
//! A thin layer over [`pgop_lease`] (acquire by compare-and-swap, takeover only after the
//! Lease was seen unchanged for its duration, renewal in the background, release): the
//! Lease's name ([`primary_lease_name`]), pgop's timings for it (the `PRIMARY_LEASE_*`
//! constants in `pgop_api::constants`), and self-fencing: a primary whose Lease is held by
//! someone else, or not renewed for the fence time, stops PostgreSQL at once, well before
//! another instance may take the Lease over.

use pgop_api::constants::{
    PRIMARY_LEASE_DURATION_SECONDS, PRIMARY_LEASE_FENCE_AFTER_SECONDS, PRIMARY_LEASE_RENEW_SECONDS,
    primary_lease_name,
};
pub use pgop_lease::{Contender, Error, Fence, Keeper, Renewal, Timings};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// pgop's timings for the primary Lease.
pub const PRIMARY_TIMINGS: Timings = Timings {
    duration: Duration::from_secs(PRIMARY_LEASE_DURATION_SECONDS.unsigned_abs() as u64),
    renew: Duration::from_secs(PRIMARY_LEASE_RENEW_SECONDS),
    fence_after: Duration::from_secs(PRIMARY_LEASE_FENCE_AFTER_SECONDS),
};

/// One instance contending for its cluster's primary Lease: a [`Contender`] for the Lease
/// named after the cluster (all of [`Contender`]'s methods apply).
#[derive(Debug)]
pub struct PrimaryLease(Arc<Contender>);

impl PrimaryLease {
    /// The primary Lease of `cluster` in `namespace`, contended for as `identity` (the pod).
    pub fn new(
        client: kube::Client,
        namespace: &str,
        cluster: &str,
        identity: &str,
        timings: Timings,
    ) -> Self {
        Self(Arc::new(Contender::new(
            client,
            namespace,
            &primary_lease_name(cluster),
            identity,
            timings,
        )))
    }
}

impl std::ops::Deref for PrimaryLease {
    type Target = Contender;

    fn deref(&self) -> &Contender {
        &self.0
    }
}

/// Renews the primary Lease in the background ([`pgop_lease::keep`]); when it is lost or
/// not renewed in time, logs that PostgreSQL is being fenced and calls `fence` (which stops
/// it) once.
pub fn keep<F, Fut>(lease: Arc<PrimaryLease>, acquired: Instant, fence: F) -> Keeper
where
    F: FnOnce(Fence) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    pgop_lease::keep(lease.0.clone(), acquired, move |reason| {
        tracing::error!(reason = %reason, "fencing: stopping PostgreSQL at once, it must not run as a primary without the Lease");
        fence(reason)
    })
}
