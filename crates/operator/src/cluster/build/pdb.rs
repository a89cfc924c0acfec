//! PodDisruptionBudgets: voluntary disruptions (node drains) take one standby at a time,
//! and the primary only after a switchover (see `cluster::nodes`).
//!
//! Two budgets, because the Eviction API refuses a Pod that more than one budget selects:
//! - `<cluster>`: the Pods labelled replica, one of them evictable at a time:
//!   `minAvailable` = the standbys less one (`instances - 2`). During a change of primary
//!   every Pod is labelled replica, so it covers them all and keeps all but one
//!   (`instances - 1`). An integer `minAvailable`, not `maxUnavailable`: for Pods whose
//!   controller has no scale subresource (a PostgresCluster), the disruption controller
//!   can only count the Pods a budget selects, and a `maxUnavailable` budget never allows
//!   an eviction.
//! - `<cluster>-primary`: the Pod labelled primary, `minAvailable: 1`, only while a
//!   switchover could move the primary away (`primary_budget`). An eviction of the
//!   primary is then refused until the operator has switched over; without it (a single
//!   instance, or no healthy standby on a schedulable node) the primary is evicted like
//!   any Pod, so a drain never waits for a switchover that cannot happen.

use super::Common;
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use pgop_api::labels;

/// What the budgets hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budgets {
    /// `minAvailable` of the Pods labelled replica.
    pub replicas_min_available: i32,
    /// Whether the primary's budget exists.
    pub primary: bool,
}

impl Budgets {
    /// For `instances` instances: one standby evictable at a time (all but one Pod kept
    /// during a change of primary, when every Pod is labelled replica); the primary's
    /// budget when `primary`.
    pub fn new(instances: usize, in_transition: bool, primary: bool) -> Self {
        let n = i32::try_from(instances).unwrap_or(i32::MAX);
        let keep = if in_transition { n - 1 } else { n - 2 };
        Self {
            replicas_min_available: keep.max(0),
            primary,
        }
    }
}

/// The suffix of the primary's budget.
pub const PRIMARY_BUDGET_SUFFIX: &str = "-primary";

fn budget(
    c: &Common,
    name: &str,
    role: &str,
    spec: PodDisruptionBudgetSpec,
) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: c.meta(name, &[]),
        spec: Some(PodDisruptionBudgetSpec {
            selector: Some(LabelSelector {
                match_labels: Some(
                    [
                        (labels::CLUSTER.to_string(), c.cluster.clone()),
                        (
                            labels::COMPONENT.to_string(),
                            labels::COMPONENT_DATABASE.to_string(),
                        ),
                        (labels::ROLE.to_string(), role.to_string()),
                    ]
                    .into(),
                ),
                ..LabelSelector::default()
            }),
            ..spec
        }),
        ..PodDisruptionBudget::default()
    }
}

pub fn pod_disruption_budgets(c: &Common, shape: &Budgets) -> Vec<PodDisruptionBudget> {
    let mut budgets = vec![budget(
        c,
        &c.cluster,
        labels::ROLE_REPLICA,
        PodDisruptionBudgetSpec {
            min_available: Some(IntOrString::Int(shape.replicas_min_available)),
            ..PodDisruptionBudgetSpec::default()
        },
    )];
    if shape.primary {
        budgets.push(budget(
            c,
            &format!("{}{PRIMARY_BUDGET_SUFFIX}", c.cluster),
            labels::ROLE_PRIMARY,
            PodDisruptionBudgetSpec {
                min_available: Some(IntOrString::Int(1)),
                ..PodDisruptionBudgetSpec::default()
            },
        ));
    }
    budgets
}

#[cfg(test)]
mod tests {
    use super::Budgets;

    #[test]
    fn one_standby_at_a_time_and_all_but_one_pod_during_a_change_of_primary() {
        assert_eq!(Budgets::new(3, false, true).replicas_min_available, 1);
        assert_eq!(Budgets::new(3, true, true).replicas_min_available, 2);
        assert_eq!(Budgets::new(5, false, false).replicas_min_available, 3);
        // Two instances: the one standby may go; a single instance: no standby at all.
        assert_eq!(Budgets::new(2, false, true).replicas_min_available, 0);
        assert_eq!(Budgets::new(1, false, false).replicas_min_available, 0);
        assert_eq!(Budgets::new(1, true, false).replicas_min_available, 0);
    }
}
