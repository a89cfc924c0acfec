//! The PodDisruptionBudget: voluntary disruptions (node drains) take one instance at a time.

use super::Common;
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use pgop_api::labels;

pub fn pod_disruption_budget(c: &Common) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: c.meta(&c.cluster, &[]),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(
                    [
                        (labels::CLUSTER.to_string(), c.cluster.clone()),
                        (
                            labels::COMPONENT.to_string(),
                            labels::COMPONENT_DATABASE.to_string(),
                        ),
                    ]
                    .into(),
                ),
                ..LabelSelector::default()
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        ..PodDisruptionBudget::default()
    }
}
