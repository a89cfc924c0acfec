//! What a pass knows of the world: data only, read by `dereference` (and the caches) and
//! used by every step after it.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};

/// Every child of one cluster as the API server has it now.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    pub service_accounts: Vec<ServiceAccount>,
    pub roles: Vec<Role>,
    pub role_bindings: Vec<RoleBinding>,
    pub secrets: Vec<Secret>,
    pub services: Vec<Service>,
    pub pod_disruption_budgets: Vec<PodDisruptionBudget>,
    pub pvcs: Vec<PersistentVolumeClaim>,
    pub pods: Vec<Pod>,
    pub network_policies: Vec<NetworkPolicy>,
    /// The poolers' Deployments (`spec.poolers`).
    pub deployments: Vec<Deployment>,
}
