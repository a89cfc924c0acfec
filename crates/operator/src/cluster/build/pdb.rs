//! PodDisruptionBudgets: voluntary disruptions (node drains) take one standby at a time,
//! and the primary only after a switchover (see `cluster::nodes`).
//!
//! Two budgets, because the Eviction API refuses a Pod that more than one budget selects:
//! - `<cluster>`: the Pods labelled replica, `maxUnavailable: 1`. During a change of
//!   primary every Pod is labelled replica, so it covers them all.
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

pub fn pod_disruption_budgets(c: &Common, primary_budget: bool) -> Vec<PodDisruptionBudget> {
    let mut budgets = vec![budget(
        c,
        &c.cluster,
        labels::ROLE_REPLICA,
        PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            ..PodDisruptionBudgetSpec::default()
        },
    )];
    if primary_budget {
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
