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

/// What an ordinary pass has read by the time it decides steps 5 to 11: data only (what
/// steps 1 to 4 decided comes beside it, `decide::Settled`).
pub(in crate::cluster) struct World<'a> {
    /// The cluster as read, and with its defaults (the volumes at least as large as
    /// auto-grow made them).
    pub cluster: &'a pgop_api::v1beta1::PostgresCluster,
    pub defaulted: &'a pgop_api::v1beta1::PostgresCluster,
    pub namespace: &'a str,
    pub observed: &'a Observed,
    /// What steps 5 to 11 read ([`super::observe::reads`]).
    pub reads: Reads,
    pub nodes: &'a super::nodes::NodeFacts,
    pub settings: &'a crate::Settings,
    pub now: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
}

/// The reads of steps 5 to 11 of an ordinary pass ([`super::observe::reads`]).
pub(in crate::cluster) struct Reads {
    /// Step 5: every instance's `/pg/status`.
    pub probes: std::collections::BTreeMap<String, Probe>,
    /// Step 6: the Secrets of the user's that the spec names.
    pub user_secrets: UserSecrets,
    /// The cluster's PostgresBackups, when it has a backup section.
    pub backups: Option<Vec<pgop_api::backup::PostgresBackup>>,
    /// The recovery source, when it is still to be resolved.
    pub recovery: Option<Result<Option<pgop_api::cluster::RecoverySource>, String>>,
    /// The volumes of instances not placed on a node whose claim's node is missing (or not
    /// recorded): the instance and its PersistentVolume.
    pub unplaced_volumes: Vec<(String, k8s_openapi::api::core::v1::PersistentVolume)>,
}

/// What one probe found.
#[derive(Clone, Debug, PartialEq)]
pub enum Probe {
    /// The manager answered with its status.
    Status(Box<pgop_api::instance_status::PgStatus>),
    /// No Pod IP yet, a refused or timed-out connection, or an unreadable answer.
    Unreachable(String),
}

impl Probe {
    pub fn status(&self) -> Option<&pgop_api::instance_status::PgStatus> {
        match self {
            Probe::Status(s) => Some(s),
            Probe::Unreachable(_) => None,
        }
    }
}

/// The Secrets the spec names for pgop to read only (step 6), as read; what they are worth
/// is decided (`decide::credentials`).
#[derive(Clone, Debug, Default)]
pub struct UserSecrets {
    /// `spec.credentials.appSecret`.
    pub app: Option<UserSecret>,
    /// `spec.credentials.superuserSecret`, read only with `superuserAccess`.
    pub superuser: Option<UserSecret>,
    /// `spec.tls.serverSecret`.
    pub server: Option<UserSecret>,
    /// `spec.tls.clientCASecret`.
    pub client_ca: Option<UserSecret>,
}

impl UserSecrets {
    /// The names of the Secrets a pass reads, by the spec, in the order it reads them: the
    /// app's, the superuser's (only with `superuserAccess`), the server certificate's and
    /// the client authorities'.
    pub fn names(spec: &pgop_api::v1beta1::PostgresClusterSpec) -> [Option<&str>; 4] {
        let credentials = &spec.credentials;
        [
            credentials.app_secret.as_deref(),
            credentials
                .superuser_secret
                .as_deref()
                .filter(|_| credentials.superuser_access),
            spec.tls.server_secret.as_deref(),
            spec.tls.client_ca_secret.as_deref(),
        ]
    }

    /// What the reads of [`Self::names`] found, in that order.
    pub fn from_reads([app, superuser, server, client_ca]: [Option<UserSecret>; 4]) -> Self {
        Self {
            app,
            superuser,
            server,
            client_ca,
        }
    }
}

/// One Secret of the user's: its name, and the Secret or why it could not be read
/// ("cannot be read: …", "does not exist").
#[derive(Clone, Debug)]
pub struct UserSecret {
    pub name: String,
    pub read: Result<Secret, String>,
}
