//! Whole-pass table tests: each `passes/NAME.world.yaml` is what an ordinary pass read (the
//! cluster, its Pods and claims, the instances' `/pg/status`, its PostgresBackups, the
//! nodes, the Secrets of the user's the spec names, the clock), `passes/NAME.pass.yaml` what it decides (the status, the Events, the
//! annotations to clear, the backups to create, the Lease to release, the Pods to build,
//! what to delete, when to look again). Steps 2 to 4 run as `reconcile` runs them, then
//! [`super::ordinary`] (or, for a cluster asked to hibernate, [`super::hibernate`]): the
//! tests a controller needs an API mock for, without one.
//! A fixture's Pod that names no `spec-hash` annotation was built from the current spec.
//! Set `PGOP_UPDATE_FIXTURES=1` to rewrite the expected files after an intended change,
//! then review their diff.

use super::{nodes, upgrade};
use crate::cluster::build;
use crate::cluster::world::Probe;
use crate::cluster::world::{Observed, Reads, UserSecret, UserSecrets, World};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::runtime::reflector::store;
use kube::runtime::watcher::Event;
use pgop_api::PostgresClusterStatus;
use pgop_api::backup::PostgresBackup;
use pgop_api::instance_status::PgStatus;
use pgop_api::v1beta1::PostgresCluster;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What a pass read, as a fixture has it.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Fixture {
    /// What the case shows, in a sentence.
    #[allow(dead_code)]
    about: String,
    now: String,
    cluster: PostgresCluster,
    #[serde(default)]
    pods: Vec<Pod>,
    #[serde(default)]
    pvcs: Vec<PersistentVolumeClaim>,
    /// Each instance's answer: its status, or why it did not answer.
    #[serde(default)]
    probes: BTreeMap<String, Answer>,
    /// The cluster's PostgresBackups (read only when it has a backup section).
    #[serde(default)]
    backups: Vec<PostgresBackup>,
    /// The nodes that exist (none given: the node cache is not filled).
    #[serde(default)]
    nodes: Option<Vec<String>>,
    /// The PersistentVolume of an unplaced instance whose node is missing.
    #[serde(default)]
    unplaced_volumes: BTreeMap<String, PersistentVolume>,
    /// The Secrets of the user's, by name: those the spec names are read (one not here
    /// does not exist).
    #[serde(default)]
    user_secrets: BTreeMap<String, UserSecretFixture>,
}

/// A Secret of the user's: its keys and (text) values, or why it could not be read.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct UserSecretFixture {
    #[serde(default)]
    data: BTreeMap<String, String>,
    unreadable: Option<String>,
}

/// The reads of `observe::user_secrets`, from the fixture's Secrets.
fn user_secrets(
    spec: &pgop_api::v1beta1::PostgresClusterSpec,
    fixture: &BTreeMap<String, UserSecretFixture>,
) -> UserSecrets {
    UserSecrets::from_reads(UserSecrets::names(spec).map(|name| {
        let name = name?.to_string();
        let read = match fixture.get(&name) {
            None => Err("does not exist".to_string()),
            Some(UserSecretFixture {
                unreadable: Some(why),
                ..
            }) => Err(format!("cannot be read: {why}")),
            Some(UserSecretFixture { data, .. }) => Ok(Secret {
                metadata: kube::api::ObjectMeta {
                    name: Some(name.clone()),
                    ..Default::default()
                },
                data: Some(
                    data.iter()
                        .map(|(k, v)| (k.clone(), ByteString(v.as_bytes().to_vec())))
                        .collect(),
                ),
                ..Secret::default()
            }),
        };
        Some(UserSecret { name, read })
    }))
}

/// An instance's answer: `status` (what its manager reported), or `unreachable` (why it
/// did not answer).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Answer {
    status: Option<Box<PgStatus>>,
    unreachable: Option<String>,
}

/// What a pass decided, as the expected files have it.
#[derive(Default, Serialize)]
#[serde(rename_all = "camelCase")]
struct Decided {
    status: PostgresClusterStatus,
    /// `Type Reason [instance]: message`, in the order they are published.
    events: Vec<String>,
    cleared_annotations: Vec<String>,
    scheduled_backups: Vec<String>,
    release_lease_of: Option<String>,
    lost_volumes: Vec<String>,
    /// The instance Pods built, the primary-labelled one marked.
    pods: Vec<String>,
    deleted_instances: Vec<String>,
    /// The Pods deleted: the one a rollout replaces, those a hibernation takes down.
    deleted_pods: Vec<String>,
    requeue_after: String,
}

fn node(name: &str) -> Node {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]}
    }))
    .expect("node")
}

fn node_facts(names: Option<&[String]>) -> nodes::NodeFacts {
    let (reader, mut writer) = store::<Node>();
    if let Some(names) = names {
        writer.apply_watcher_event(&Event::Init);
        for name in names {
            writer.apply_watcher_event(&Event::InitApply(node(name)));
        }
        writer.apply_watcher_event(&Event::InitDone);
    }
    nodes::NodeFacts::new(reader)
}

/// Runs steps 2 to 4 as `reconcile` does for a valid spec, then decides the rest.
fn decide(fixture: Fixture) -> Decided {
    let Fixture {
        now,
        cluster,
        pods,
        pvcs,
        probes,
        backups,
        nodes,
        unplaced_volumes,
        user_secrets: users,
        ..
    } = fixture;
    let now = Time(now.parse().expect("now is a timestamp"));
    let mut defaulted = cluster.clone();
    defaulted.spec = pgop_api::v1beta1::with_defaults(cluster.spec.clone());
    let valid =
        pgop_api::validation::validate_cluster(&pgop_api::PostgresCluster::from(defaulted.clone()));
    assert!(valid.is_ok(), "the fixture's spec is refused: {valid:?}");
    let major = defaulted
        .spec
        .postgresql
        .version
        .unwrap_or(pgop_api::cluster::DEFAULT_POSTGRES_VERSION);
    let settings = crate::Settings::default();
    let mut observed = Observed {
        pods,
        pvcs,
        ..Observed::default()
    };
    // A Pod that names no spec hash was built from the current spec.
    let named: Vec<(String, i32)> = observed
        .pods
        .iter()
        .filter_map(|p| {
            Some((
                p.name_any(),
                super::serials::serial_of(&cluster.name_any(), &p.name_any())?,
            ))
        })
        .collect();
    let hashes = build::pod_spec_hashes(
        &defaulted,
        &super::instances::specs(&named, None, major),
        &settings,
    )
    .expect("hashes");
    for pod in &mut observed.pods {
        if let Some(hash) = hashes.get(&pod.name_any()) {
            pod.annotations_mut()
                .entry(pgop_api::constants::ANNOTATION_SPEC_HASH.to_string())
                .or_insert_with(|| hash.clone());
        }
    }
    let planned = super::instances::plan(&cluster, &defaulted, &observed);
    let upgrade = upgrade::decide(&upgrade::Input {
        cluster: &defaulted,
        held: major,
        wanted: major,
        instances: planned.named.len(),
        pods: &observed.pods,
        backups: &[],
        primary_probe: None,
        now: now.clone(),
    });
    assert_eq!(
        upgrade.pass,
        upgrade::Pass::Ordinary { major },
        "an ordinary pass"
    );
    let probes = probes
        .into_iter()
        .map(|(instance, answer)| {
            let probe = match answer {
                Answer {
                    status: Some(status),
                    unreachable: None,
                } => Probe::Status(status),
                Answer {
                    status: None,
                    unreachable: Some(why),
                } => Probe::Unreachable(why),
                _ => panic!("{instance}: either status or unreachable"),
            };
            (instance, probe)
        })
        .collect();
    let facts = node_facts(nodes.as_deref());
    let world = World {
        cluster: &cluster,
        defaulted: &defaulted,
        namespace: "ns",
        observed: &observed,
        reads: Reads {
            probes,
            user_secrets: user_secrets(&defaulted.spec, &users),
            backups: cluster.spec.backup.is_some().then_some(backups),
            recovery: None,
            unplaced_volumes: unplaced_volumes.into_iter().collect(),
        },
        nodes: &facts,
        settings: &settings,
        now,
    };
    let event = |n: &crate::cluster::notes::Note| {
        let about = n
            .instance
            .as_deref()
            .map(|i| format!(" [{i}]"))
            .unwrap_or_default();
        format!("{:?} {}{about}: {}", n.kind, n.reason, n.message)
    };
    if super::hibernates(&cluster, &defaulted) {
        let (credentials, refused) = super::credentials::credentials(super::credentials::Input {
            cluster: &cluster.name_any(),
            namespace: world.namespace,
            spec: &defaulted.spec,
            instances: &planned.named,
            secrets: &observed.secrets,
            users: &world.reads.user_secrets,
            now: world.now.0,
        })
        .expect("the credentials");
        let input = super::DownInput {
            cluster: &cluster,
            defaulted: &defaulted,
            observed: &observed,
            planned: &planned,
            credentials: &credentials,
            settings: &settings,
            now: &world.now,
        };
        let backups = world.reads.backups.as_deref().unwrap_or_default();
        let down = super::hibernate(input, major, backups).expect("the children build");
        return Decided {
            status: down.status,
            events: refused.iter().chain(&down.notes).map(event).collect(),
            pods: down.children.pods.iter().map(|p| p.name_any()).collect(),
            deleted_instances: down.removed,
            deleted_pods: down.delete,
            requeue_after: format!("{:?}", down.requeue),
            ..Decided::default()
        };
    }
    let settled = super::Settled {
        named: &planned.named,
        plan: &planned.plan,
        existing: &planned.existing,
        major,
        upgrade: &upgrade,
    };
    let pass = super::ordinary(&world, settled).expect("the children build");
    let mut events: Vec<String> = pass.refused.iter().map(event).collect();
    events.extend(pass.status_notes.iter().map(event));
    events.extend(pass.requests.notes.iter().map(event));
    events.extend(pass.scaled.iter().map(event));
    let primary_label = pgop_api::labels::ROLE;
    Decided {
        status: pass.status,
        events,
        cleared_annotations: pass.requests.clear.iter().map(|a| a.to_string()).collect(),
        scheduled_backups: pass
            .scheduled
            .iter()
            .map(|(name, method)| format!("{name} ({method:?})"))
            .collect(),
        release_lease_of: pass.release_lease,
        lost_volumes: pass
            .lost
            .iter()
            .map(|(instance, node)| format!("{instance} (on {node})"))
            .collect(),
        pods: pass
            .children
            .pods
            .iter()
            .map(
                |p| match p.labels().get(primary_label).map(String::as_str) {
                    Some(pgop_api::labels::ROLE_PRIMARY) => format!("{} (primary)", p.name_any()),
                    _ => p.name_any(),
                },
            )
            .collect(),
        deleted_instances: pass.removed,
        deleted_pods: pass.replace.into_iter().collect(),
        requeue_after: format!("{:?}", pass.requeue),
    }
}

#[test]
fn each_world_decides_its_pass() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/cluster/decide/passes");
    let mut cases: Vec<std::path::PathBuf> = std::fs::read_dir(&dir)
        .expect("the fixtures' directory")
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.to_string_lossy().ends_with(".world.yaml"))
        .collect();
    cases.sort();
    assert!(cases.len() >= 6, "the cases in {}", dir.display());
    let mut differ = Vec::new();
    for world in &cases {
        let text = std::fs::read_to_string(world).expect("read the fixture");
        let fixture: Fixture =
            serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", world.display()));
        let actual = serde_yaml::to_string(&decide(fixture)).expect("serialise the pass");
        let expected_path = world.to_string_lossy().replace(".world.yaml", ".pass.yaml");
        if std::env::var_os("PGOP_UPDATE_FIXTURES").is_some() {
            std::fs::write(&expected_path, &actual).expect("write the expected pass");
        }
        let expected = std::fs::read_to_string(&expected_path).unwrap_or_default();
        if actual != expected {
            differ.push(format!("{expected_path}:\n{actual}"));
        }
    }
    assert!(
        differ.is_empty(),
        "decided passes differ from the expected files (if the change is intended, rerun with PGOP_UPDATE_FIXTURES=1 and review the diff):\n{}",
        differ.join("\n")
    );
}
