//! The primary Lease of a dead holder: during a failover, when the kubelet reports that
//! the old primary's container is not running (it observed the exit), the Lease that
//! container held is released, so the new primary need not wait for it to expire.
//!
//! The instance manager releases a Lease still naming its Pod when it starts again, but a
//! container the kubelet restarts with a back-off (a second crash within minutes) starts
//! only after 10 s or more; until then the standby chosen waited for the Lease's full
//! duration (measured 12.7–13.5 s from a kill to the first write instead of 2–3 s).
//!
//! Only the kubelet's own report counts: a container it reports terminated, or waiting
//! after one that terminated, has no process left, and PostgreSQL runs inside it. A Pod
//! that is merely missing, being deleted or on an unreachable node (status `Unknown`, or a
//! kubelet that stopped reporting) proves nothing, and its Lease is left to expire.
//!
//! The holder's identity is its Pod's name, the same for every container the Pod runs, and
//! the operator's view of the Pod can lag: the kubelet may already have restarted the
//! container, whose manager took the Lease again and started PostgreSQL as the primary.
//! Releasing that Lease let another instance promote while this one still accepted
//! commits (CI, 2026-12-04: one acknowledged write lost). So the Lease is released only
//! when it was acquired before the dead container finished (`acquireTime` before the
//! kubelet's `finishedAt`, both written with the clock of the Pod's node: the manager's
//! and the kubelet's); a manager takes the Lease with a fresh `acquireTime` in every
//! container (`pgop_lease::Contender::try_acquire`). `finishedAt` has whole seconds, so a
//! Lease acquired in the second its holder died is left to expire. The release is a
//! compare-and-swap on the Lease's resourceVersion: a holder that renewed meanwhile keeps it.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use pgop_api::constants::primary_lease_name;

/// The instance container of a pgop Pod.
const CONTAINER: &str = "postgres";

/// When the kubelet reports the Pod's instance container finished, while it reports none
/// running: terminated, or waiting (in a restart back-off) after one that terminated, with
/// the Pod's phase still known. `None`: running, never started, or not known.
pub fn died_at(pod: &Pod) -> Option<Timestamp> {
    let status = pod.status.as_ref()?;
    if status.phase.as_deref() == Some("Unknown") {
        return None;
    }
    let container = status
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == CONTAINER)?;
    let state = container.state.as_ref()?;
    if state.running.is_some() {
        return None;
    }
    let terminated = match (&state.terminated, &state.waiting) {
        (Some(t), _) => t,
        (None, Some(_)) => container.last_state.as_ref()?.terminated.as_ref()?,
        (None, None) => return None,
    };
    terminated.finished_at.as_ref().map(|t| t.0)
}

/// Whether `lease` was acquired before `died` (see the module's comment): a Lease with no
/// `acquireTime` was not written by a pgop manager, and is left to expire.
fn acquired_before(lease: &Lease, died: Timestamp) -> bool {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.acquire_time.as_ref())
        .is_some_and(|t| t.0 < died)
}

/// Releases the primary Lease of `cluster` when `holder`'s Pod is `pod`, its container is
/// dead ([`died_at`]), the Lease still names it and was acquired before that container
/// finished. Returns whether it released.
pub async fn release_if_dead(
    client: &kube::Client,
    namespace: &str,
    cluster: &str,
    holder: &str,
    pod: Option<&Pod>,
) -> Result<bool, kube::Error> {
    let Some(died) = pod.and_then(died_at) else {
        return Ok(false);
    };
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let name = primary_lease_name(cluster);
    let Some(mut lease) = api.get_opt(&name).await? else {
        return Ok(false);
    };
    if !acquired_before(&lease, died) {
        return Ok(false);
    }
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

    fn pod(phase: &str, state: serde_json::Value, last: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "db-1"},
            "status": {"phase": phase, "containerStatuses": [
                {"name": "postgres", "image": "pgop", "imageID": "", "ready": false,
                 "restartCount": 1, "state": state, "lastState": last}
            ]}
        }))
        .expect("pod")
    }

    fn at(t: &str) -> Timestamp {
        t.parse().expect("timestamp")
    }

    #[test]
    fn only_a_kubelet_report_of_a_finished_container_counts() {
        let none = serde_json::json!({});
        let finished = serde_json::json!({"terminated": {"exitCode": 137, "finishedAt": "2026-12-04T00:13:56Z"}});
        let back_off = serde_json::json!({"waiting": {"reason": "CrashLoopBackOff"}});
        let running = serde_json::json!({"running": {}});
        let died = Some(at("2026-12-04T00:13:56Z"));
        assert_eq!(
            died_at(&pod("Running", back_off.clone(), finished.clone())),
            died
        );
        assert_eq!(
            died_at(&pod("Running", finished.clone(), none.clone())),
            died
        );
        assert_eq!(
            died_at(&pod("Failed", finished.clone(), none.clone())),
            died
        );
        // Restarted: the last termination is history.
        assert_eq!(died_at(&pod("Running", running, finished.clone())), None);
        // Never started (a Pod created anew under the old name): no container died here.
        let creating = serde_json::json!({"waiting": {"reason": "ContainerCreating"}});
        assert_eq!(died_at(&pod("Pending", creating, none.clone())), None);
        // A node that stopped reporting: its last word proves nothing.
        assert_eq!(died_at(&pod("Unknown", back_off, finished)), None);
        assert_eq!(died_at(&pod("Running", none.clone(), none)), None);
        let no_status: Pod =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "db-1"}})).expect("pod");
        assert_eq!(died_at(&no_status), None);
    }

    fn lease(acquired: Option<&str>) -> Lease {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "db"},
            "spec": {"holderIdentity": "db-1", "acquireTime": acquired},
        }))
        .expect("lease")
    }

    #[test]
    fn only_a_lease_acquired_before_the_container_finished_is_released() {
        let died = at("2026-12-04T00:13:56Z");
        // Held by the container that died.
        assert!(acquired_before(
            &lease(Some("2026-12-04T00:13:04.926000Z")),
            died
        ));
        // Taken again by the restarted container (the kubelet's report lagged): kept.
        assert!(!acquired_before(
            &lease(Some("2026-12-04T00:13:56.400000Z")),
            died
        ));
        // Taken in the second the holder died: finishedAt's whole seconds cannot tell.
        assert!(!acquired_before(
            &lease(Some("2026-12-04T00:13:56.000000Z")),
            died
        ));
        assert!(!acquired_before(&lease(None), died));
    }
}
