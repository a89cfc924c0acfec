//! What every step of a cluster pass shares, a leaf the others import: the clock, the
//! cluster's key, and how soon a cluster is looked at again.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use std::time::Duration;

/// How often a cluster is looked at while a decision waits on the clock (see
/// [`super::decide::next_pass`]).
pub const POLL: Duration = Duration::from_secs(1);
/// How often a cluster is looked at when nothing wakes it: a safety net, since the
/// watches ([`super::cache`], [`super::triggers`]) and the prober wake it on every change
/// that matters.
pub const RESYNC: Duration = Duration::from_secs(300);
/// How often during a failover or switchover.
pub const POLL_TRANSITION: Duration = Duration::from_millis(300);

/// `namespace/name`, for logs and the backoff.
pub(super) fn key(cluster: &impl ResourceExt) -> String {
    format!(
        "{}/{}",
        cluster.namespace().unwrap_or_default(),
        cluster.name_any()
    )
}

/// The pass's clock.
pub(super) fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}
