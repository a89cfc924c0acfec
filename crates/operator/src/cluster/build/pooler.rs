//! The PgBouncer poolers of `spec.poolers`: per pooler a Deployment and a Service
//! `<cluster>-pooler-<name>`; for all of a cluster's poolers one ServiceAccount, Role and
//! RoleBinding `<cluster>.pooler` (a dot: no cluster's own name, a DNS label, can be it).
//! The Pods run `pgop pooler run` from the instances' image; the manager in each follows
//! the cluster's status and points PgBouncer at the primary (`rw`) or the ready standbys
//! (`ro`).
//!
//! Pooler Pods carry [`labels::POOLER`] and not [`labels::CLUSTER`]: whatever selects a
//! cluster's instance Pods (its Services, the operator's reads) never sees them.

use super::pod::{empty_dir, field_env, http_probe, mount, restricted_container, value_env};
use super::rbac::rule;
use super::{Common, Settings};
use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Affinity, Container, ContainerPort, PodAffinityTerm, PodAntiAffinity, PodSecurityContext,
    PodSpec, PodTemplateSpec, SeccompProfile, Secret, Service, ServiceAccount, ServicePort,
    ServiceSpec, WeightedPodAffinityTerm,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use pgop_api::constants::{
    APP_SECRET_SUFFIX, GROUP, MANAGER_PORT, MANAGER_PORT_NAME, PATH_HEALTHZ, PATH_METRICS,
    PATH_READYZ, POSTGRES_PORT, SERVER_TLS_SECRET_SUFFIX,
};
use pgop_api::labels;
use pgop_api::pooler::{AUTH_USER, PoolerSpec, pooler_name};
use pgop_api::v1beta1::PostgresCluster;
use std::collections::BTreeMap;

/// The name of PgBouncer's port on pooler Pods and Services.
pub const PGBOUNCER_PORT_NAME: &str = "pgbouncer";
/// Where pooler Pods keep PgBouncer's configuration, auth file, certificates and socket.
pub const POOLER_RUN_MOUNT: &str = "/run/pgbouncer";

/// Environment of the pooler container, read by `pgop pooler run`.
pub mod env {
    pub const POOLER: &str = "PGOP_POOLER";
    pub const POOLER_DIR: &str = "PGOP_POOLER_DIR";
}

pub use pgop_api::pooler::identity_name;

/// The labels of pooler `name`'s Pods: its selector.
fn pod_labels(c: &Common, full: &str) -> BTreeMap<String, String> {
    [
        (labels::NAME, labels::NAME_POOLER),
        (labels::INSTANCE, c.cluster.as_str()),
        (labels::COMPONENT, labels::COMPONENT_POOLER),
        (labels::POOLER, full),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

fn selector(full: &str) -> BTreeMap<String, String> {
    [(labels::POOLER.to_string(), full.to_string())].into()
}

/// Everything of a cluster's poolers: empty without `spec.poolers`.
#[derive(Clone, Debug, Default)]
pub struct Poolers {
    /// `<cluster>.pooler`, with at least one pooler.
    pub identity: Option<(ServiceAccount, Role, RoleBinding)>,
    /// `<cluster>.pooler`: [`pgop_api::pooler::AUTH_USER`] and its password, generated once.
    pub auth_secret: Option<Secret>,
    pub deployments: Vec<Deployment>,
    pub services: Vec<Service>,
}

pub(crate) fn poolers(
    c: &Common,
    cluster: &PostgresCluster,
    settings: &Settings,
    auth_password: Option<&str>,
) -> Poolers {
    let spec = &cluster.spec;
    if spec.poolers.is_empty() {
        return Poolers::default();
    }
    Poolers {
        identity: Some((service_account(c), role(c), role_binding(c))),
        auth_secret: auth_password.map(|password| auth_secret(c, password)),
        deployments: spec
            .poolers
            .iter()
            .map(|p| deployment(c, cluster, p, settings))
            .collect(),
        services: spec.poolers.iter().map(|p| service(c, p)).collect(),
    }
}

/// `<cluster>.pooler`: the user PgBouncer looks passwords up as, and its password.
fn auth_secret(c: &Common, password: &str) -> Secret {
    super::secret::user_and_password(
        c,
        identity_name(&c.cluster),
        &[(labels::COMPONENT, labels::COMPONENT_POOLER)],
        (AUTH_USER, password),
    )
}

fn service_account(c: &Common) -> ServiceAccount {
    ServiceAccount {
        metadata: c.meta(
            &identity_name(&c.cluster),
            &[(labels::COMPONENT, labels::COMPONENT_POOLER)],
        ),
        ..ServiceAccount::default()
    }
}

/// What a pooler's manager reads: its cluster, the application owner's password, its own
/// Secret (`auth_user`'s password), the server certificate (which names the pooler
/// Services too), and the instance Pods' addresses. It writes nothing.
fn role(c: &Common) -> Role {
    let read = ["get", "list", "watch"];
    Role {
        metadata: c.meta(
            &identity_name(&c.cluster),
            &[(labels::COMPONENT, labels::COMPONENT_POOLER)],
        ),
        rules: Some(vec![
            rule(
                &[GROUP],
                &["postgresclusters"],
                &read,
                std::slice::from_ref(&c.cluster),
            ),
            rule(
                &[""],
                &["secrets"],
                &read,
                &[
                    format!("{}{APP_SECRET_SUFFIX}", c.cluster),
                    format!("{}{SERVER_TLS_SECRET_SUFFIX}", c.cluster),
                    identity_name(&c.cluster),
                ],
            ),
            // The instances' Pod IPs, watched by name; instance names are not known
            // when the Role is written.
            rule(&[""], &["pods"], &read, &[]),
        ]),
    }
}

fn role_binding(c: &Common) -> RoleBinding {
    let name = identity_name(&c.cluster);
    RoleBinding {
        metadata: c.meta(&name, &[(labels::COMPONENT, labels::COMPONENT_POOLER)]),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".to_string(),
            kind: "Role".to_string(),
            name: name.clone(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".to_string(),
            name,
            namespace: Some(c.namespace.clone()),
            ..Subject::default()
        }]),
    }
}

fn meta(c: &Common, full: &str) -> ObjectMeta {
    c.meta(
        full,
        &[
            (labels::COMPONENT, labels::COMPONENT_POOLER),
            (labels::POOLER, full),
        ],
    )
}

fn deployment(
    c: &Common,
    cluster: &PostgresCluster,
    pooler: &PoolerSpec,
    settings: &Settings,
) -> Deployment {
    use super::pod::env as pod_env;
    let full = pooler_name(&c.cluster, &pooler.name);
    let image = cluster
        .spec
        .image
        .clone()
        .unwrap_or_else(|| settings.image.clone());
    let container = Container {
        name: "pgbouncer".to_string(),
        image: Some(image),
        image_pull_policy: Some("IfNotPresent".to_string()),
        command: Some(vec![
            "pgop".to_string(),
            "pooler".to_string(),
            "run".to_string(),
        ]),
        env: Some(vec![
            field_env(pod_env::POD_NAME, "metadata.name"),
            field_env(pod_env::POD_NAMESPACE, "metadata.namespace"),
            field_env(pod_env::POD_IP, "status.podIP"),
            value_env(pod_env::CLUSTER, &c.cluster),
            value_env(env::POOLER, &pooler.name),
            value_env(env::POOLER_DIR, POOLER_RUN_MOUNT),
        ]),
        ports: Some(vec![
            ContainerPort {
                name: Some(PGBOUNCER_PORT_NAME.to_string()),
                container_port: i32::from(POSTGRES_PORT),
                protocol: Some("TCP".to_string()),
                ..ContainerPort::default()
            },
            ContainerPort {
                name: Some(MANAGER_PORT_NAME.to_string()),
                container_port: i32::from(MANAGER_PORT),
                protocol: Some("TCP".to_string()),
                ..ContainerPort::default()
            },
        ]),
        liveness_probe: Some(http_probe(PATH_HEALTHZ, 10, 3)),
        // Ready only with a server to send connections to: an `ro` pooler without a ready
        // standby leaves its Service's endpoints.
        readiness_probe: Some(http_probe(PATH_READYZ, 2, 1)),
        resources: pooler.resources.clone(),
        security_context: Some(restricted_container()),
        volume_mounts: Some(vec![
            mount("run", POOLER_RUN_MOUNT),
            mount("tmp", super::pod::TMP_MOUNT),
        ]),
        ..Container::default()
    };
    let mut annotations = BTreeMap::new();
    for (key, value) in [
        ("prometheus.io/scrape", "true".to_string()),
        ("prometheus.io/port", MANAGER_PORT.to_string()),
        ("prometheus.io/path", PATH_METRICS.to_string()),
    ] {
        annotations.insert(key.to_string(), value);
    }
    Deployment {
        metadata: meta(c, &full),
        spec: Some(DeploymentSpec {
            replicas: Some(pooler.instances),
            selector: LabelSelector {
                match_labels: Some(selector(&full)),
                ..LabelSelector::default()
            },
            // One new Pod ready before an old one goes: a change never leaves the
            // pooler without a Pod.
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".to_string()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_unavailable: Some(IntOrString::Int(0)),
                    max_surge: Some(IntOrString::Int(1)),
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels(c, &full)),
                    annotations: Some(annotations),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(identity_name(&c.cluster)),
                    enable_service_links: Some(false),
                    // PgBouncer drains for 20 s, then 5 s to stop (pgop_instance::pooler).
                    termination_grace_period_seconds: Some(30),
                    // Its Pods on different nodes when they can be: one node lost, the
                    // pooler keeps serving.
                    affinity: Some(Affinity {
                        pod_anti_affinity: Some(PodAntiAffinity {
                            preferred_during_scheduling_ignored_during_execution: Some(vec![
                                WeightedPodAffinityTerm {
                                    weight: 100,
                                    pod_affinity_term: PodAffinityTerm {
                                        label_selector: Some(LabelSelector {
                                            match_labels: Some(selector(&full)),
                                            ..LabelSelector::default()
                                        }),
                                        topology_key: "kubernetes.io/hostname".to_string(),
                                        ..PodAffinityTerm::default()
                                    },
                                },
                            ]),
                            ..PodAntiAffinity::default()
                        }),
                        ..Affinity::default()
                    }),
                    security_context: Some(PodSecurityContext {
                        run_as_non_root: Some(true),
                        run_as_user: Some(settings.run_as_user),
                        run_as_group: Some(settings.run_as_group),
                        seccomp_profile: Some(SeccompProfile {
                            type_: "RuntimeDefault".to_string(),
                            ..SeccompProfile::default()
                        }),
                        ..PodSecurityContext::default()
                    }),
                    containers: vec![container],
                    volumes: Some(vec![empty_dir("run"), empty_dir("tmp")]),
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        }),
        ..Deployment::default()
    }
}

/// Per pooler, `<cluster>-pooler-<name>`: a drain evicts one of its Pods at a time (the
/// Deployment's scale subresource lets the budget count them).
pub(crate) fn budgets(c: &Common, cluster: &PostgresCluster) -> Vec<PodDisruptionBudget> {
    cluster
        .spec
        .poolers
        .iter()
        .map(|pooler| {
            let full = pooler_name(&c.cluster, &pooler.name);
            PodDisruptionBudget {
                metadata: c.meta(&full, &[(labels::COMPONENT, labels::COMPONENT_POOLER)]),
                spec: Some(PodDisruptionBudgetSpec {
                    max_unavailable: Some(IntOrString::Int(1)),
                    selector: Some(LabelSelector {
                        match_labels: Some(selector(&full)),
                        ..LabelSelector::default()
                    }),
                    ..PodDisruptionBudgetSpec::default()
                }),
                ..PodDisruptionBudget::default()
            }
        })
        .collect()
}

fn service(c: &Common, pooler: &PoolerSpec) -> Service {
    let full = pooler_name(&c.cluster, &pooler.name);
    Service {
        metadata: meta(c, &full),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_string()),
            selector: Some(selector(&full)),
            ports: Some(vec![ServicePort {
                name: Some(PGBOUNCER_PORT_NAME.to_string()),
                port: i32::from(POSTGRES_PORT),
                target_port: Some(IntOrString::String(PGBOUNCER_PORT_NAME.to_string())),
                protocol: Some("TCP".to_string()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// `status.poolers`: each pooler's Pods as its Deployment reports them (none yet: 0).
pub fn status(
    cluster: &str,
    spec: &[PoolerSpec],
    deployments: &[Deployment],
) -> Vec<pgop_api::pooler::PoolerStatus> {
    spec.iter()
        .map(|p| {
            let full = pooler_name(cluster, &p.name);
            let observed = deployments
                .iter()
                .find(|d| d.metadata.name.as_deref() == Some(full.as_str()))
                .and_then(|d| d.status.as_ref());
            pgop_api::pooler::PoolerStatus {
                name: p.name.clone(),
                service: full.clone(),
                instances: observed.and_then(|s| s.replicas).unwrap_or(0),
                ready_instances: observed.and_then(|s| s.ready_replicas).unwrap_or(0),
            }
        })
        .collect()
}
