//! The primary Lease of a dead holder: during a failover, when the kubelet reports that
//! the old primary's container is not running (it observed the exit), the Lease that
//! container held is released, so the new primary need not wait for it to expire.
//!
//! The instance manager releases a Lease still naming its Pod when it starts again, but a
//! container the kubelet restarts with a back-off (a second crash within minutes) starts
//! only after 10 s or more; until then the standby chosen waited for the Lease's full
//! duration (measured 12.7–13.5 s from a kill to the first write instead of 2–3 s).
//!
//! Safe because only the kubelet's own report counts: a container it reports terminated or
//! waiting has no process left, and PostgreSQL runs inside it; a container it restarts
//! meanwhile releases a Lease naming its Pod before anything else and never runs as the
//! primary without taking the Lease again. A Pod that is merely missing, being deleted or
//! on an unreachable node (status `Unknown`, or a kubelet that stopped reporting) proves
//! nothing, and its Lease is left to expire. The release is a compare-and-swap on the
//! Lease's resourceVersion: a holder that renewed meanwhile keeps it.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use pgop_api::constants::primary_lease_name;

/// The instance container of a pgop Pod.
const CONTAINER: &str = "postgres";

/// Whether the kubelet reports the Pod's instance container as not running: terminated, or
/// waiting (created, or in a restart back-off), with the Pod's phase still known.
pub fn container_dead(pod: &Pod) -> bool {
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    if status.phase.as_deref() == Some("Unknown") {
        return false;
    }
    status
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == CONTAINER)
        .and_then(|c| c.state.as_ref())
        .is_some_and(|s| s.running.is_none() && (s.terminated.is_some() || s.waiting.is_some()))
}

/// Releases the primary Lease of `cluster` when `holder`'s Pod is `pod`, its container is
/// dead ([`container_dead`]) and the Lease still names it. Returns whether it released.
pub async fn release_if_dead(
    client: &kube::Client,
    namespace: &str,
    cluster: &str,
    holder: &str,
    pod: Option<&Pod>,
) -> Result<bool, kube::Error> {
    if !pod.is_some_and(container_dead) {
        return Ok(false);
    }
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let name = primary_lease_name(cluster);
    let Some(mut lease) = api.get_opt(&name).await? else {
        return Ok(false);
    };
    let spec = lease.spec.get_or_insert_with(Default::default);
    if spec.holder_identity.as_deref() != Some(holder) {
        return Ok(false);
    }
    spec.holder_identity = None;
    spec.renew_time = None;
    spec.acquire_time = None;
    match api.replace(&name, &PostParams::default(), &lease).await {
        Ok(_) => Ok(true),
        // Renewed or taken meanwhile: not ours to release.
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(phase: &str, state: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "db-1"},
            "status": {"phase": phase, "containerStatuses": [
                {"name": "postgres", "image": "pgop", "imageID": "", "ready": false,
                 "restartCount": 1, "state": state}
            ]}
        }))
        .expect("pod")
    }

    #[test]
    fn only_a_kubelet_report_of_a_stopped_container_counts() {
        let back_off = serde_json::json!({"waiting": {"reason": "CrashLoopBackOff"}});
        let exited = serde_json::json!({"terminated": {"exitCode": 137}});
        let running = serde_json::json!({"running": {}});
        assert!(container_dead(&pod("Running", back_off.clone())));
        assert!(container_dead(&pod("Running", exited.clone())));
        assert!(container_dead(&pod("Failed", exited)));
        assert!(!container_dead(&pod("Running", running)));
        // A node that stopped reporting: its last word proves nothing.
        assert!(!container_dead(&pod("Unknown", back_off)));
        assert!(!container_dead(&pod("Running", serde_json::json!({}))));
        let no_status: Pod =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "db-1"}})).expect("pod");
        assert!(!container_dead(&no_status));
    }
}
