//! Build: the desired children of a cluster as plain values. Pure functions only —
//! nothing here reads the clock, the network or the environment; tests feed YAML
//! fixtures and compare the objects.

mod network;
mod pdb;
pub mod pooler;
pub use pdb::Budgets;
pub(crate) mod pod;
pub mod pvc;
pub use pgop_api::quantity;
mod rbac;
mod secret;
mod service;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use pgop_api::labels;
use pgop_api::v1beta1::PostgresCluster;
use std::collections::BTreeMap;

pub use secret::{APP_DERIVED_KEYS, REPLICATION_USER};

/// The image instance pods run when neither the cluster nor the operator names one.
pub const DEFAULT_IMAGE: &str = concat!("pgop:", env!("CARGO_PKG_VERSION"));

/// Operator-wide settings that shape every child.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Image of instance pods when a cluster names none (PostgreSQL plus the pgop binary).
    pub image: String,
    /// uid and gid the instance containers run as (non-root; PostgreSQL refuses root).
    pub run_as_user: i64,
    pub run_as_group: i64,
    /// The operator's own namespace when it runs in the cluster (`POD_NAMESPACE`): the
    /// NetworkPolicies admit the managers' TLS port from its Pods only.
    pub operator_namespace: Option<String>,
    /// The OTLP/HTTP endpoint the instance managers export their traces to
    /// (`OTEL_EXPORTER_OTLP_ENDPOINT` in their containers); none when `None`. A change
    /// changes every instance Pod (a rolling restart).
    pub instance_otlp_endpoint: Option<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            image: DEFAULT_IMAGE.to_string(),
            run_as_user: 26,
            run_as_group: 26,
            operator_namespace: None,
            instance_otlp_endpoint: None,
        }
    }
}

/// One instance to build: its name, whether it is the primary, and the PostgreSQL it runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceSpec {
    pub name: String,
    pub primary: bool,
    /// The PostgreSQL major version the instance runs: the one the cluster's data holds
    /// (`status.postgresVersion`).
    pub major: i32,
    /// An in-place major upgrade of this instance's data from this major, in this mode
    /// (the primary's Pod while `status.majorUpgrade` is `Upgrading`); left out of the
    /// Pod's spec hash, so the upgraded primary is not replaced once the upgrade is over.
    pub upgrade_from: Option<(i32, pgop_api::cluster::MajorUpgradeMode)>,
}

/// The passwords of the credentials Secrets and the certificates, as step 6 decided them
/// (`decide::credentials`, `decide::certificates`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials {
    pub passwords: Passwords,
    pub certificates: Certificates,
}

/// The passwords of one pass.
#[derive(Clone, PartialEq, Eq)]
pub struct Passwords {
    pub app: String,
    /// The app password comes from `spec.credentials.appSecret`: `<cluster>-app`'s
    /// `password` follows it.
    pub app_copied: bool,
    pub replication: String,
    /// With `superuserAccess` only: the superuser's password, and whether it is copied
    /// from `superuserSecret`.
    pub superuser: Option<(String, bool)>,
    /// With `spec.poolers` only: the password of the poolers' `auth_user`
    /// (`<cluster>.pooler`).
    pub pooler: Option<String>,
}

impl std::fmt::Debug for Passwords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the passwords.
        f.debug_struct("Passwords")
            .field("app_copied", &self.app_copied)
            .field("superuser", &self.superuser.as_ref().map(|(_, c)| c))
            .finish_non_exhaustive()
    }
}

/// The cluster's authorities and certificates, PEM-encoded (see `decide::certificates`).
#[derive(Clone, PartialEq, Eq)]
pub struct Certificates {
    pub ca_cert: String,
    pub ca_key: String,
    pub manager_cert: String,
    pub manager_key: String,
    pub manager_not_after: String,
    /// PostgreSQL's authority.
    pub postgres_ca_cert: String,
    pub postgres_ca_key: String,
    /// PostgreSQL's server certificate, the authority that verifies it, and its Secret's
    /// annotations (see `decide::certificates::Pki`).
    pub server: pgop_tls::Issued,
    pub server_ca_cert: String,
    pub server_annotations: Vec<(&'static str, String)>,
    /// The replication user's client certificate.
    pub replication: pgop_tls::Issued,
    /// The authorities PostgreSQL accepts client certificates from.
    pub client_ca_cert: String,
}

impl std::fmt::Debug for Certificates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the keys.
        f.debug_struct("Certificates")
            .field("manager_not_after", &self.manager_not_after)
            .finish_non_exhaustive()
    }
}

/// Every child of one cluster. Destructured without `..` by the applier, so adding a
/// child type here without applying it does not compile.
#[derive(Clone, Debug)]
pub struct Children {
    pub service_account: ServiceAccount,
    pub role: Role,
    pub role_binding: RoleBinding,
    pub app_secret: Secret,
    /// The keys of the app Secret kept in line with the spec at every reconcile (see
    /// [`secret::app_derived_keys`]).
    pub app_derived_keys: Vec<&'static str>,
    pub replication_secret: Secret,
    /// `<cluster>-superuser`, with `spec.credentials.superuserAccess` only (an existing one
    /// is deleted otherwise), and its derived keys.
    pub superuser_secret: Option<(Secret, Vec<&'static str>)>,
    /// `<cluster>-superuser`'s name, to delete it when `superuser_secret` is `None`.
    pub superuser_secret_name: String,
    /// The authority (`<cluster>-ca`): created once, never rewritten.
    pub ca_secret: Secret,
    /// The managers' certificate (`<cluster>-manager-tls`): rewritten when renewed.
    pub manager_tls_secret: Secret,
    /// PostgreSQL's authority (`<cluster>-postgres-ca`): created once, never rewritten.
    pub postgres_ca_secret: Secret,
    /// PostgreSQL's server certificate (`<cluster>-server-tls`): rewritten when renewed.
    pub server_tls_secret: Secret,
    /// The replication client certificate (`<cluster>-replication-tls`): rewritten when
    /// renewed.
    pub replication_tls_secret: Secret,
    pub services: Vec<Service>,
    /// The replicas' budget, and the primary's while a switchover could move it.
    pub pod_disruption_budgets: Vec<PodDisruptionBudget>,
    pub pvcs: Vec<PersistentVolumeClaim>,
    pub pods: Vec<Pod>,
    /// The instances' NetworkPolicy; `None` when `spec.networkPolicy.enabled` is off
    /// (an existing one is then deleted).
    pub network_policy: Option<NetworkPolicy>,
    /// The PgBouncer poolers of `spec.poolers` (nothing without).
    pub poolers: pooler::Poolers,
}

/// Failure to build children from a cluster that lacks what every stored object has.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the cluster has no {0} (is it a stored object?)")]
    MissingMetadata(&'static str),
}

/// What every child has in common: name, namespace, labels, and the controller
/// ownerReference that lets the garbage collector delete it with the cluster.
pub(crate) struct Common {
    pub cluster: String,
    pub namespace: String,
    pub owner: OwnerReference,
}

impl Common {
    fn new(cluster: &PostgresCluster) -> Result<Self, Error> {
        let name = cluster
            .metadata
            .name
            .clone()
            .ok_or(Error::MissingMetadata("name"))?;
        let namespace = cluster
            .metadata
            .namespace
            .clone()
            .ok_or(Error::MissingMetadata("namespace"))?;
        let uid = cluster
            .metadata
            .uid
            .clone()
            .ok_or(Error::MissingMetadata("uid"))?;
        Ok(Self {
            owner: OwnerReference {
                api_version: pgop_api::constants::CLUSTER_OWNER_API_VERSION.to_string(),
                kind: "PostgresCluster".to_string(),
                name: name.clone(),
                uid,
                controller: Some(true),
                block_owner_deletion: Some(true),
            },
            cluster: name,
            namespace,
        })
    }

    pub fn labels(&self, extra: &[(&str, &str)]) -> BTreeMap<String, String> {
        let mut l = labels::cluster_labels(&self.cluster);
        for (k, v) in extra {
            l.insert((*k).to_string(), (*v).to_string());
        }
        l
    }

    pub fn meta(&self, name: &str, extra_labels: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(self.namespace.clone()),
            labels: Some(self.labels(extra_labels)),
            owner_references: Some(vec![self.owner.clone()]),
            ..ObjectMeta::default()
        }
    }
}

/// Builds every child of `cluster` (whose spec is already defaulted and validated);
/// `budgets`: what its PodDisruptionBudgets hold (see `pdb`).
pub fn children(
    cluster: &PostgresCluster,
    instances: &[InstanceSpec],
    passwords: &Credentials,
    settings: &Settings,
    budgets: &Budgets,
) -> Result<Children, Error> {
    let common = Common::new(cluster)?;
    let spec = &cluster.spec;
    Ok(Children {
        service_account: rbac::service_account(&common),
        role: rbac::role(&common, cluster),
        role_binding: rbac::role_binding(&common),
        app_secret: secret::app(
            &common,
            spec,
            &passwords.passwords.app,
            &passwords.certificates,
        ),
        app_derived_keys: secret::derived_keys(passwords.passwords.app_copied),
        replication_secret: secret::replication(&common, &passwords.passwords.replication),
        superuser_secret_name: secret::superuser_name(&common),
        superuser_secret: passwords.passwords.superuser.as_ref().map(|(p, copied)| {
            (
                secret::superuser(&common, p, &passwords.certificates),
                secret::derived_keys(*copied),
            )
        }),
        ca_secret: secret::authority(&common, &passwords.certificates),
        manager_tls_secret: secret::manager_tls(&common, &passwords.certificates),
        postgres_ca_secret: secret::postgres_authority(&common, &passwords.certificates),
        server_tls_secret: secret::server_tls(&common, &passwords.certificates),
        replication_tls_secret: secret::replication_tls(&common, &passwords.certificates),
        services: service::all(&common),
        pod_disruption_budgets: pdb::pod_disruption_budgets(&common, budgets)
            .into_iter()
            .chain(pooler::budgets(&common, cluster))
            .collect(),
        pvcs: instances
            .iter()
            .flat_map(|i| pvc::pvcs(&common, spec, &i.name))
            .collect(),
        pods: instances
            .iter()
            .map(|i| pod::pod(&common, spec, i, settings))
            .collect(),
        network_policy: network::network_policy(
            &common,
            &spec.network_policy,
            settings,
            !spec.poolers.is_empty(),
        ),
        poolers: pooler::poolers(
            &common,
            cluster,
            settings,
            passwords.passwords.pooler.as_deref(),
        ),
    })
}

/// Each instance's Pod spec hash (the `ANNOTATION_SPEC_HASH` its Pod carries), as
/// [`children`] builds it: what the rolling update compares the live Pods' with. It does
/// not depend on which instance is labelled the primary (the label is metadata).
pub fn pod_spec_hashes(
    cluster: &PostgresCluster,
    instances: &[InstanceSpec],
    settings: &Settings,
) -> Result<std::collections::BTreeMap<String, String>, Error> {
    let common = Common::new(cluster)?;
    Ok(instances
        .iter()
        .map(|i| {
            let pod = pod::pod(&common, &cluster.spec, i, settings);
            (i.name.clone(), pod::spec_hash(&pod.spec))
        })
        .collect())
}

#[cfg(test)]
pub(crate) mod tests;
