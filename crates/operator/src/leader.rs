//! Leader election: several operator replicas may run, only the holder of one Lease
//! (`coordination.k8s.io/v1`, [`DEFAULT_LEASE_NAME`] in the operator's namespace) runs the
//! controllers. The others wait, healthy and ready, and take over when the leader releases
//! the Lease (a normal shutdown) or stops renewing it (after [`LEASE_DURATION`]).
//!
//! The Lease logic (compare-and-swap, takeover only after the Lease was seen unchanged for
//! its duration on the local monotonic clock, renewal, release) is [`pgop_lease`]'s, the
//! same as an instance's primary Lease.
//!
//! A leader that loses the Lease (someone else holds it, or no renewal succeeded for
//! [`RENEW_DEADLINE`]) stops its controllers at once and [`crate::Operator::run`] returns
//! [`crate::Error::LostLeadership`]: the process exits nonzero and Kubernetes restarts it,
//! so it re-enters the election with empty caches and no reconcile half-done from its
//! time as leader, rather than trying to resume with state that may be stale.

use pgop_lease::{Contender, Fence, Keeper, Timings};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The Lease's name unless told otherwise (`--leader-election-name`).
pub const DEFAULT_LEASE_NAME: &str = "pgop-operator";

/// `leaseDurationSeconds`: a standby takes the Lease over from a leader that stopped
/// renewing it only after seeing it unchanged this long (a released Lease at once).
pub const LEASE_DURATION: Duration = Duration::from_secs(15);
/// How often the leader renews the Lease, and how often a standby tries to acquire it.
pub const RENEW_INTERVAL: Duration = Duration::from_secs(2);
/// A leader without a successful renewal for this long gives up leadership (stops its
/// controllers), well before a standby may take over after [`LEASE_DURATION`].
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// While waiting, "waiting for leadership" is logged at most this often.
pub const WAITING_LOG_INTERVAL: Duration = Duration::from_secs(30);

/// The operator's timings for its Lease.
pub const TIMINGS: Timings = Timings {
    duration: LEASE_DURATION,
    renew: RENEW_INTERVAL,
    fence_after: RENEW_DEADLINE,
};

/// Which Lease the operator replicas contend for, and as whom.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderElection {
    /// Where the Lease lives: the operator's own namespace.
    pub namespace: String,
    /// The Lease's name ([`DEFAULT_LEASE_NAME`] unless told otherwise).
    pub name: String,
    /// This replica's `holderIdentity`: unique among the replicas (the Pod name).
    pub identity: String,
}

impl LeaderElection {
    /// The default Lease ([`DEFAULT_LEASE_NAME`]) in `namespace`, contended for as `identity`.
    pub fn new(namespace: impl Into<String>, identity: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: DEFAULT_LEASE_NAME.to_string(),
            identity: identity.into(),
        }
    }

    pub(crate) fn contender(&self, client: kube::Client) -> Arc<Contender> {
        Arc::new(Contender::new(
            client,
            &self.namespace,
            &self.name,
            &self.identity,
            TIMINGS,
        ))
    }

    /// `namespace/name`, for messages.
    pub fn lease(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// Tries to acquire the Lease every [`RENEW_INTERVAL`] until it is held; returns when the
/// acquiring request was sent (where renewal starts from). Logs who holds it once, then at
/// most every [`WAITING_LOG_INTERVAL`]; API errors are logged and retried.
pub(crate) async fn acquire(lease: &Contender) -> Instant {
    let mut logged: Option<Instant> = None;
    loop {
        let sent = Instant::now();
        match lease.try_acquire().await {
            Ok(true) => return sent,
            Ok(false) => {
                if logged.is_none_or(|at| at.elapsed() >= WAITING_LOG_INTERVAL) {
                    let holder = lease.holder().await.ok().flatten();
                    let holder = holder.as_deref().unwrap_or("nobody");
                    tracing::info!(lease = %lease.name(), "waiting for leadership; held by {holder}");
                    logged = Some(Instant::now());
                }
            }
            Err(err) => {
                tracing::warn!(lease = %lease.name(), error = %crate::error_chain(&err), "failed to acquire the leader Lease; retrying")
            }
        }
        tokio::time::sleep_until(tokio::time::Instant::from_std(sent + RENEW_INTERVAL)).await;
    }
}

/// Renews the held Lease in the background; the returned future resolves with the reason
/// once leadership is lost (never while the [`Keeper`] renews it).
pub(crate) fn keep(
    lease: Arc<Contender>,
    acquired: Instant,
) -> (Keeper, impl Future<Output = Fence> + Send) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let keeper = pgop_lease::keep(lease, acquired, move |reason| {
        let _ = tx.send(reason);
        std::future::ready(())
    });
    let lost = async move {
        match rx.await {
            Ok(reason) => reason,
            // The keeper was stopped without losing the Lease.
            Err(_) => std::future::pending().await,
        }
    };
    (keeper, lost)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_gives_up_well_before_a_standby_may_take_over() {
        assert!(RENEW_INTERVAL * 3 <= RENEW_DEADLINE);
        assert!(RENEW_DEADLINE + RENEW_INTERVAL <= LEASE_DURATION);
        assert_eq!(LeaderElection::new("ns", "me").name, DEFAULT_LEASE_NAME);
        assert_eq!(LeaderElection::new("ns", "me").lease(), "ns/pgop-operator");
    }
}
