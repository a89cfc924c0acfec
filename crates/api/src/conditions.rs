//! Condition types of pgop's resources and the one way to set a condition.
//!
//! Conditions follow the Kubernetes conventions (`kubectl wait --for=condition=Ready`):
//! a CamelCase `reason`, a `message` for people, and a `lastTransitionTime` that moves only
//! when the condition's status changes — never on a mere change of reason or message.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// The cluster serves reads and writes with every desired instance ready.
pub const READY: &str = "Ready";
/// pgop is moving the cluster towards its spec (creating, scaling, updating).
pub const PROGRESSING: &str = "Progressing";
/// The cluster serves, but with fewer ready instances than desired, or without its
/// synchronous standbys.
pub const DEGRADED: &str = "Degraded";
/// The spec passed pgop's validation; when False the phase is Invalid and the message
/// names the field.
pub const SPEC_VALID: &str = "SpecValid";
/// The current primary runs and answers its instance manager's status probe; False (with
/// the time it became so) starts the failover clock of `spec.failoverDelay`.
pub const PRIMARY_AVAILABLE: &str = "PrimaryAvailable";
/// The last backup (scheduled or on demand) completed.
pub const BACKUP_SUCCEEDED: &str = "BackupSucceeded";
/// WAL reaches the backup store: False (with the failing WAL file) while the primary's
/// archiver fails, so that a broken archive is never silent.
pub const CONTINUOUS_ARCHIVING: &str = "ContinuousArchiving";

/// Every instance that answers runs with `spec.postgresql`: False (reason
/// `ParametersRefused`, naming instance, parameter and reason) while any instance refused a
/// parameter or pg_hba rule, or PostgreSQL refused the file; the last good value is then in
/// effect. True again once the spec is fixed.
pub const CONFIGURATION_APPLIED: &str = "ConfigurationApplied";

/// A rolling update (restart or Pod replacement) stopped: True (reason
/// `InstanceNotBack` or `RestartRefused`, naming the instance and PostgreSQL's last error
/// lines) while the instance it restarted or replaced is not back within
/// `spec.switchoverTimeout`, or refused the restart after a failed dry run. The other
/// instances are left untouched until the spec changes or the instance comes back.
pub const ROLLOUT_BLOCKED: &str = "RolloutBlocked";

/// Every instance Pod that exists has a node, or is still being placed: False (reason
/// `Unschedulable`, naming each Pod and quoting the scheduler's message) while the
/// scheduler finds no node for one (`spec.affinity` asks for more nodes or zones than
/// there are, no node matches the node selector, taints, resources). True again once it
/// is placed, or the Pod is gone.
pub const INSTANCES_SCHEDULED: &str = "InstancesScheduled";

/// True while `spec.hibernate` holds the cluster down (reason `Hibernating` while Pods
/// are still being deleted, `Hibernated` once none is left); False after it resumed.
pub const HIBERNATED: &str = "Hibernated";

/// The in-place major upgrade asked for by raising `spec.postgresVersion`: False while it
/// runs (reason `BackingUp`, `Stopping`, `Upgrading` or `Cloning`) or when it cannot start
/// or failed (`Waiting`, `Failed`, with the reason in the message), True once every
/// instance runs the new major (`Completed`). Absent on a cluster never upgraded.
pub const MAJOR_UPGRADED: &str = "MajorUpgraded";

/// Whether every role of `spec.roles` is as declared on the primary: False (reason
/// `RoleFailed`) names each role PostgreSQL refused and quotes its error; absent while
/// the spec declares no role.
pub const ROLES_APPLIED: &str = "RolesApplied";

/// Whether every volume has the size the cluster asks for: False with reason `Resizing`
/// while an accepted expansion is under way (a claim's capacity below its request, or the
/// filesystem an instance reports not grown yet), `ResizeRefused` when the API server
/// refused one (the message quotes it), True (`Resized`) otherwise.
pub const VOLUMES_RESIZED: &str = "VolumesResized";

/// Whether every database of `spec.databases` (with its schemas and extensions) is as
/// declared on the primary: False (reason `DatabaseFailed`) names each database with what
/// PostgreSQL refused; absent while the spec declares no database.
pub const DATABASES_APPLIED: &str = "DatabasesApplied";

/// A replica cluster (`spec.replica`) follows its source: True (reason `Streaming`) while
/// its designated primary streams from it within `spec.replica.maxLagSeconds`; False with
/// the reason why not (`DesignatedPrimaryDown`, `NotStreaming`, `LagOverBound`, or the
/// source's refusal: `SourceUnreachable`, `SourceTLSRefused`, `SourceAuthenticationFailed`,
/// `SourceNoReplication`, `SourceRefused`, `SourceWalGone`, `SystemIdentifierMismatch`),
/// with an Event. Absent on a cluster that is no replica cluster.
pub const REPLICA_FOLLOWING: &str = "ReplicaFollowing";

/// A replica cluster's promotion (`spec.replica.enabled: false`): False with reason
/// `PromotionRefused` (and an Event) while `spec.replica.promotionMaxLagSeconds` or a
/// cluster with no data of the source refuses it, `Promoting` once approved, True
/// (`Promoted`) once its designated primary takes writes. Absent until asked.
pub const REPLICA_PROMOTED: &str = "ReplicaPromoted";

/// Condition status `True`.
pub const TRUE: &str = "True";
/// Condition status `False`.
pub const FALSE: &str = "False";
/// Condition status `Unknown`.
pub const UNKNOWN: &str = "Unknown";

/// A condition to hand to [`set_condition`]; its `lastTransitionTime` is filled in there.
pub fn new_condition(
    type_: &str,
    status: bool,
    reason: &str,
    message: impl Into<String>,
    observed_generation: Option<i64>,
    now: Time,
) -> Condition {
    Condition {
        type_: type_.to_string(),
        status: if status { TRUE } else { FALSE }.to_string(),
        reason: reason.to_string(),
        message: message.into(),
        observed_generation,
        last_transition_time: now,
    }
}

/// Sets `new` in `conditions`, replacing the condition of the same type.
///
/// `lastTransitionTime` becomes `now` when the condition is new or its status changed, and
/// stays as it was otherwise (whatever `new` carries). Returns whether anything changed, so
/// that a reconcile that finds everything in place writes nothing.
///
/// `now` is cut to whole seconds: that is all a `Time` keeps on the wire, and a status
/// computed with sub-second times would never equal the one read back.
pub fn set_condition(conditions: &mut Vec<Condition>, mut new: Condition, now: Time) -> bool {
    let now = whole_seconds(now);
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        Some(existing) => {
            new.last_transition_time = if existing.status == new.status {
                existing.last_transition_time.clone()
            } else {
                now
            };
            if *existing == new {
                return false;
            }
            *existing = new;
            true
        }
        None => {
            new.last_transition_time = now;
            conditions.push(new);
            true
        }
    }
}

/// `time` without its fraction of a second, as it comes back from the API server.
pub fn whole_seconds(time: Time) -> Time {
    match k8s_openapi::jiff::Timestamp::from_second(time.0.as_second()) {
        Ok(t) => Time(t),
        Err(_) => time,
    }
}

/// The condition of the given type, if present.
pub fn find_condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the condition of the given type is present with status `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find_condition(conditions, type_).is_some_and(|c| c.status == TRUE)
}

/// `SpecValid=True`: the spec passed validation in this pass.
pub fn set_spec_valid(c: &mut Vec<Condition>, generation: Option<i64>, now: &Time) {
    set_condition(
        c,
        new_condition(
            SPEC_VALID,
            true,
            "Valid",
            "the spec is valid".to_string(),
            generation,
            now.clone(),
        ),
        now.clone(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(second: i64) -> Time {
        Time(Timestamp::from_second(second).expect("valid timestamp"))
    }

    fn ready(status: bool, reason: &str, message: &str) -> Condition {
        new_condition(READY, status, reason, message, Some(1), at(0))
    }

    #[test]
    fn a_new_condition_gets_now_as_transition_time() {
        let mut conditions = Vec::new();
        assert!(set_condition(
            &mut conditions,
            ready(false, "Creating", "creating instances"),
            at(10)
        ));
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0].last_transition_time, at(10));
        assert_eq!(conditions[0].status, FALSE);
    }

    #[test]
    fn same_status_keeps_the_transition_time_but_updates_reason_and_message() {
        let mut conditions = Vec::new();
        set_condition(&mut conditions, ready(false, "Creating", "0/3"), at(10));
        assert!(set_condition(
            &mut conditions,
            ready(false, "Creating", "1/3"),
            at(20)
        ));
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0].last_transition_time, at(10));
        assert_eq!(conditions[0].message, "1/3");
    }

    #[test]
    fn a_status_change_moves_the_transition_time() {
        let mut conditions = Vec::new();
        set_condition(&mut conditions, ready(false, "Creating", "0/3"), at(10));
        set_condition(&mut conditions, ready(true, "AllReady", "3/3"), at(30));
        assert_eq!(conditions[0].last_transition_time, at(30));
        assert_eq!(conditions[0].status, TRUE);
        assert!(is_true(&conditions, READY));
    }

    #[test]
    fn setting_the_same_condition_again_changes_nothing() {
        let mut conditions = Vec::new();
        set_condition(&mut conditions, ready(true, "AllReady", "3/3"), at(10));
        let before = conditions.clone();
        assert!(!set_condition(
            &mut conditions,
            ready(true, "AllReady", "3/3"),
            at(50)
        ));
        assert_eq!(conditions, before);
    }

    #[test]
    fn transition_times_are_whole_seconds_as_on_the_wire() {
        let mut conditions = Vec::new();
        let precise = Time(Timestamp::from_nanosecond(10_500_000_000).expect("valid timestamp"));
        set_condition(&mut conditions, ready(true, "AllReady", "3/3"), precise);
        assert_eq!(conditions[0].last_transition_time, at(10));
    }

    #[test]
    fn other_condition_types_are_left_alone() {
        let mut conditions = Vec::new();
        set_condition(&mut conditions, ready(true, "AllReady", "3/3"), at(10));
        let valid = new_condition(SPEC_VALID, true, "Valid", "", Some(1), at(0));
        set_condition(&mut conditions, valid, at(20));
        assert_eq!(conditions.len(), 2);
        assert_eq!(
            find_condition(&conditions, READY).map(|c| c.last_transition_time.clone()),
            Some(at(10))
        );
        assert!(is_true(&conditions, SPEC_VALID));
        assert!(!is_true(&conditions, DEGRADED));
    }
}
