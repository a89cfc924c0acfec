//! The instance Pod: `pgop instance run` as PID 1, its data volume, ports, probes and a
//! security context that passes the Pod Security "restricted" profile.

use super::{Common, InstanceSpec, Settings, quantity};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    HTTPGetAction, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    ObjectFieldSelector, PersistentVolumeClaimVolumeSource, Pod, PodAffinityTerm, PodAntiAffinity,
    PodSecurityContext, PodSpec, PreferredSchedulingTerm, Probe, SeccompProfile, SecurityContext,
    Toleration, TopologySpreadConstraint, Volume, VolumeMount, WeightedPodAffinityTerm,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use pgop_api::affinity::{AffinitySpec, PodAntiAffinityType};
use pgop_api::constants::ANNOTATION_SPEC_HASH;
use pgop_api::constants::{
    MANAGER_PORT, MANAGER_PORT_NAME, MANAGER_TLS_PORT, MANAGER_TLS_PORT_NAME, PATH_HEALTHZ,
    PATH_METRICS, PATH_READYZ, POSTGRES_PORT, POSTGRES_PORT_NAME,
};
use pgop_api::labels;
use pgop_api::v1beta1::PostgresClusterSpec;

/// Where the instance's PVC is mounted; PGDATA is a directory below it, so that the
/// volume's root (often owned by root, with lost+found) is never the data directory.
pub const DATA_MOUNT: &str = "/var/lib/postgresql/data";
pub const PGDATA: &str = "/var/lib/postgresql/data/pgdata";
/// Writable scratch space on a read-only root filesystem: the socket directory and /tmp.
/// Where the instance's WAL claim is mounted (`spec.walStorage`); the manager keeps the
/// WAL in a directory below it and makes `PGDATA/pg_wal` a link to it.
pub const WAL_MOUNT: &str = "/var/lib/postgresql/wal";
pub const RUN_MOUNT: &str = "/run/postgresql";
pub const TMP_MOUNT: &str = "/tmp";
/// Where a volume backup store is mounted (the instance manager's default
/// `--backup-volume`).
pub const BACKUP_MOUNT: &str = "/var/lib/postgresql/backup";

/// Environment variable names the instance manager reads.
pub mod env {
    pub const POD_NAME: &str = "POD_NAME";
    pub const POD_NAMESPACE: &str = "POD_NAMESPACE";
    pub const POD_IP: &str = "POD_IP";
    pub const CLUSTER: &str = "PGOP_CLUSTER";
    pub const PGDATA: &str = "PGDATA";
    pub const SOCKET_DIR: &str = "PGOP_SOCKET_DIR";
    /// The WAL volume's mount (`spec.walStorage`); unset without one.
    pub const WAL_DIR: &str = "PGOP_WAL_DIR";
    /// The PostgreSQL major version to run: the one the cluster's data holds
    /// (`status.postgresVersion`).
    pub const POSTGRES_MAJOR: &str = "PGOP_POSTGRES_MAJOR";
    /// An in-place major upgrade of the data from this major (the primary's Pod during a
    /// major upgrade), and pg_upgrade's mode, `link` or `copy`.
    pub const UPGRADE_FROM: &str = "PGOP_UPGRADE_FROM";
    pub const UPGRADE_MODE: &str = "PGOP_UPGRADE_MODE";
}

pub(super) fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.to_string(),
                ..ObjectFieldSelector::default()
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

pub(super) fn value_env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value: Some(value.to_string()),
        ..EnvVar::default()
    }
}

pub(super) fn http_probe(path: &str, period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_string()),
            port: IntOrString::String(MANAGER_PORT_NAME.to_string()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        timeout_seconds: Some(2),
        failure_threshold: Some(failures),
        ..Probe::default()
    }
}

/// A container's security context that passes the restricted Pod Security Standard:
/// non-root, no privilege escalation, every capability dropped, a read-only root
/// filesystem, the runtime's default seccomp profile.
pub(super) fn restricted_container() -> SecurityContext {
    SecurityContext {
        run_as_non_root: Some(true),
        allow_privilege_escalation: Some(false),
        privileged: Some(false),
        read_only_root_filesystem: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_string()]),
            ..Capabilities::default()
        }),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".to_string(),
            ..SeccompProfile::default()
        }),
        ..SecurityContext::default()
    }
}

pub(super) fn mount(name: &str, path: &str) -> VolumeMount {
    VolumeMount {
        name: name.to_string(),
        mount_path: path.to_string(),
        ..VolumeMount::default()
    }
}

pub(super) fn empty_dir(name: &str) -> Volume {
    Volume {
        name: name.to_string(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Volume::default()
    }
}

/// The instances' pod anti-affinity: no two instances of the cluster in one topology
/// domain, as a weighted preference or as a rule. The preferred form over
/// `kubernetes.io/hostname` is what every Pod had before `spec.scheduling` existed, built the
/// same way so that its spec hash (and so the Pod) does not change.
pub fn affinity(cluster: &str, spec: &AffinitySpec) -> Affinity {
    let term = PodAffinityTerm {
        label_selector: Some(LabelSelector {
            match_labels: Some([(labels::CLUSTER.to_string(), cluster.to_string())].into()),
            ..LabelSelector::default()
        }),
        topology_key: spec.topology_key.clone(),
        ..PodAffinityTerm::default()
    };
    let anti_affinity = match spec.pod_anti_affinity_type {
        PodAntiAffinityType::Preferred => PodAntiAffinity {
            preferred_during_scheduling_ignored_during_execution: Some(vec![
                WeightedPodAffinityTerm {
                    weight: 100,
                    pod_affinity_term: term,
                },
            ]),
            ..PodAntiAffinity::default()
        },
        PodAntiAffinityType::Required => PodAntiAffinity {
            required_during_scheduling_ignored_during_execution: Some(vec![term]),
            ..PodAntiAffinity::default()
        },
    };
    Affinity {
        pod_anti_affinity: Some(anti_affinity),
        node_affinity: spec.node_affinity.as_ref().and_then(node_affinity),
        ..Affinity::default()
    }
}

/// `spec.scheduling.nodeAffinity` as Kubernetes writes it; nothing for an empty one.
fn node_affinity(spec: &pgop_api::affinity::NodeAffinity) -> Option<NodeAffinity> {
    let term = |expressions: &[pgop_api::affinity::NodeSelectorRequirement]| NodeSelectorTerm {
        match_expressions: Some(
            expressions
                .iter()
                .map(|e| NodeSelectorRequirement {
                    key: e.key.clone(),
                    operator: e.operator.as_str().to_string(),
                    values: (!e.values.is_empty()).then(|| e.values.clone()),
                })
                .collect(),
        ),
        match_fields: None,
    };
    let required = (!spec.required.is_empty()).then(|| NodeSelector {
        node_selector_terms: spec
            .required
            .iter()
            .map(|t| term(&t.match_expressions))
            .collect(),
    });
    let preferred = (!spec.preferred.is_empty()).then(|| {
        spec.preferred
            .iter()
            .map(|t| PreferredSchedulingTerm {
                weight: t.weight,
                preference: term(&t.match_expressions),
            })
            .collect()
    });
    (required.is_some() || preferred.is_some()).then_some(NodeAffinity {
        required_during_scheduling_ignored_during_execution: required,
        preferred_during_scheduling_ignored_during_execution: preferred,
    })
}

/// `spec.scheduling.topologySpread` as the Pods' constraints, each counting this cluster's
/// instances only.
fn topology_spread(cluster: &str, spec: &AffinitySpec) -> Option<Vec<TopologySpreadConstraint>> {
    (!spec.topology_spread.is_empty()).then(|| {
        spec.topology_spread
            .iter()
            .map(|t| TopologySpreadConstraint {
                label_selector: Some(LabelSelector {
                    match_labels: Some([(labels::CLUSTER.to_string(), cluster.to_string())].into()),
                    ..LabelSelector::default()
                }),
                max_skew: t.max_skew,
                topology_key: t.topology_key.clone(),
                when_unsatisfiable: t.when_unsatisfiable.as_str().to_string(),
                ..TopologySpreadConstraint::default()
            })
            .collect()
    })
}

/// A toleration of the spec as Kubernetes writes it.
fn toleration(t: &pgop_api::affinity::Toleration) -> Toleration {
    Toleration {
        key: t.key.clone(),
        operator: Some(t.operator.as_str().to_string()),
        value: t.value.clone(),
        effect: t.effect.map(|e| e.as_str().to_string()),
        toleration_seconds: t.toleration_seconds,
    }
}

pub fn pod(
    c: &Common,
    spec: &PostgresClusterSpec,
    instance: &InstanceSpec,
    settings: &Settings,
) -> Pod {
    let role = if instance.primary {
        labels::ROLE_PRIMARY
    } else {
        labels::ROLE_REPLICA
    };
    let image = spec.image.clone().unwrap_or_else(|| settings.image.clone());
    // A volume backup store is mounted where the instance manager looks for it
    // (`--backup-volume`, default /var/lib/postgresql/backup).
    let backup_claim = spec
        .backup
        .as_ref()
        .and_then(|b| b.store.as_ref())
        .and_then(|s| s.volume.as_ref())
        .map(|v| v.claim_name.clone());
    let container = Container {
        name: "postgres".to_string(),
        image: Some(image),
        image_pull_policy: Some("IfNotPresent".to_string()),
        command: Some(vec![
            "pgop".to_string(),
            "instance".to_string(),
            "run".to_string(),
        ]),
        env: Some(
            [
                field_env(env::POD_NAME, "metadata.name"),
                field_env(env::POD_NAMESPACE, "metadata.namespace"),
                field_env(env::POD_IP, "status.podIP"),
                value_env(env::CLUSTER, &c.cluster),
                value_env(env::PGDATA, PGDATA),
                value_env(env::SOCKET_DIR, RUN_MOUNT),
                value_env(env::POSTGRES_MAJOR, &instance.major.to_string()),
            ]
            .into_iter()
            .chain(instance.upgrade_from.iter().flat_map(|(from, mode)| {
                [
                    value_env(env::UPGRADE_FROM, &from.to_string()),
                    value_env(env::UPGRADE_MODE, mode.as_str()),
                ]
            }))
            .chain(
                spec.wal_storage
                    .as_ref()
                    .map(|_| value_env(env::WAL_DIR, WAL_MOUNT)),
            )
            .chain(
                settings
                    .instance_otlp_endpoint
                    .as_deref()
                    .map(|url| value_env("OTEL_EXPORTER_OTLP_ENDPOINT", url)),
            )
            .collect(),
        ),
        ports: Some(vec![
            ContainerPort {
                name: Some(POSTGRES_PORT_NAME.to_string()),
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
            ContainerPort {
                name: Some(MANAGER_TLS_PORT_NAME.to_string()),
                container_port: i32::from(MANAGER_TLS_PORT),
                protocol: Some("TCP".to_string()),
                ..ContainerPort::default()
            },
        ]),
        // Bootstrap (initdb, or cloning a large primary) may take long: the startup probe
        // allows an hour before liveness takes over.
        startup_probe: Some(http_probe(PATH_HEALTHZ, 10, 360)),
        liveness_probe: Some(http_probe(PATH_HEALTHZ, 10, 3)),
        // Short period: readiness drives the -rw/-ro endpoints and failover detection.
        readiness_probe: Some(http_probe(PATH_READYZ, 2, 1)),
        resources: spec.resources.clone(),
        security_context: Some(restricted_container()),
        volume_mounts: Some({
            let mut mounts = vec![
                mount("pgdata", DATA_MOUNT),
                mount("run", RUN_MOUNT),
                mount("tmp", TMP_MOUNT),
            ];
            if spec.wal_storage.is_some() {
                mounts.push(mount("pgwal", WAL_MOUNT));
            }
            if backup_claim.is_some() {
                mounts.push(mount("backup", BACKUP_MOUNT));
            }
            mounts
        }),
        ..Container::default()
    };
    let mut pod = Pod {
        metadata: c.meta(
            &instance.name,
            &[
                (labels::COMPONENT, labels::COMPONENT_DATABASE),
                (labels::INSTANCE_NAME, &instance.name),
                (labels::ROLE, role),
            ],
        ),
        spec: Some(PodSpec {
            hostname: Some(instance.name.clone()),
            service_account_name: Some(c.cluster.clone()),
            enable_service_links: Some(false),
            restart_policy: Some("Always".to_string()),
            termination_grace_period_seconds: Some(i64::from(spec.ha.switchover_timeout.max(30))),
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                run_as_user: Some(settings.run_as_user),
                run_as_group: Some(settings.run_as_group),
                fs_group: Some(settings.run_as_group),
                // Change the volume's ownership only when its root does not match already
                // (its first mount): with `Always`, every new Pod on an old volume would
                // find PGDATA made group-writable, which PostgreSQL refuses, and a large
                // volume would be walked file by file at each start.
                fs_group_change_policy: Some("OnRootMismatch".to_string()),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".to_string(),
                    ..SeccompProfile::default()
                }),
                ..PodSecurityContext::default()
            }),
            affinity: Some(affinity(&c.cluster, &spec.scheduling)),
            node_selector: (!spec.scheduling.node_selector.is_empty())
                .then(|| spec.scheduling.node_selector.clone()),
            tolerations: (!spec.scheduling.tolerations.is_empty())
                .then(|| spec.scheduling.tolerations.iter().map(toleration).collect()),
            topology_spread_constraints: topology_spread(&c.cluster, &spec.scheduling),
            priority_class_name: spec.scheduling.priority_class_name.clone(),
            containers: vec![container],
            volumes: Some(
                vec![
                    Volume {
                        name: "pgdata".to_string(),
                        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                            claim_name: instance.name.clone(),
                            ..PersistentVolumeClaimVolumeSource::default()
                        }),
                        ..Volume::default()
                    },
                    empty_dir("run"),
                    empty_dir("tmp"),
                ]
                .into_iter()
                .chain(spec.wal_storage.as_ref().map(|_| Volume {
                    name: "pgwal".to_string(),
                    persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                        claim_name: labels::wal_claim(&instance.name),
                        ..PersistentVolumeClaimVolumeSource::default()
                    }),
                    ..Volume::default()
                }))
                .chain(backup_claim.map(|claim| Volume {
                    name: "backup".to_string(),
                    persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                        claim_name: claim,
                        ..PersistentVolumeClaimVolumeSource::default()
                    }),
                    ..Volume::default()
                }))
                .collect(),
            ),
            ..PodSpec::default()
        }),
        ..Pod::default()
    };
    // A Pod's spec cannot change: the hash of the spec it was built from tells the
    // rolling update which Pods must be replaced.
    let hash = spec_hash(&pod.spec);
    let annotations = pod
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    annotations.insert(ANNOTATION_SPEC_HASH.to_string(), hash);
    // The conventional hints for annotation-based Prometheus scrape configs (a PodMonitor
    // selects the named manager port instead). Metadata, not spec: no rolling update.
    for (key, value) in [
        ("prometheus.io/scrape", "true".to_string()),
        ("prometheus.io/port", MANAGER_PORT.to_string()),
        ("prometheus.io/path", PATH_METRICS.to_string()),
    ] {
        annotations.insert(key.to_string(), value);
    }
    pod
}

/// FNV-1a (64 bit) of the spec's JSON, in hex: stable across runs and builds, which is all
/// a change detector needs. The containers' resources are hashed in canonical form, so
/// that another way of writing the same quantity (`1.5Gi` for `1536Mi`, `0.5` for `500m`)
/// replaces no Pod; a spec written in canonical form hashes as it always did.
pub fn spec_hash(spec: &Option<PodSpec>) -> String {
    let mut spec = spec.clone();
    if let Some(spec) = spec.as_mut() {
        // The upgrade request is for the Pod that runs pg_upgrade: the same instance's
        // Pod without it (once the upgrade is over) is not a change to roll out.
        for container in spec.containers.iter_mut() {
            if let Some(vars) = container.env.as_mut() {
                vars.retain(|v| v.name != env::UPGRADE_FROM && v.name != env::UPGRADE_MODE);
            }
        }
        let containers = spec
            .containers
            .iter_mut()
            .chain(spec.init_containers.iter_mut().flatten());
        for resources in containers.filter_map(|c| c.resources.as_mut()) {
            for quantities in [&mut resources.requests, &mut resources.limits]
                .into_iter()
                .flatten()
            {
                for value in quantities.values_mut() {
                    if let Some(canonical) = quantity::canonical(&value.0) {
                        value.0 = canonical;
                    }
                }
            }
        }
    }
    let json = serde_json::to_string(&spec).unwrap_or_default();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in json.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{hash:016x}")
}
