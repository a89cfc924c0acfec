//! What the real-node tests share: a control plane with real nodes (and an infrastructure
//! node for the operator, DNS and clients), pgop installed by its Helm chart, and a writer
//! Pod whose log of acknowledged writes the test reads from the node's filesystem.
//!
//! Why this file stays whole: it is one idea, the real-node environment `RealEnv`: starting
//! it, installing pgop, clusters and client Pods in it, and reading back what happened
//! there (logs, Events, the secret values that must not leak); the writer Pod is a
//! submodule of its own.
#![allow(dead_code)] // each test module (and each benchmark) uses its own subset

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, PostParams};
use pgop_api::PostgresCluster;
use pgop_api::cluster::{ClusterPhase, InstanceRole};
use pgop_testenv::images::Images;
use pgop_testenv::real_nodes::{INFRA_LABEL, NodesOptions, RealNodes};
use pgop_testenv::{ControlPlane, Options};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

mod writer;
#[allow(unused_imports)] // each test module uses its own subset
pub use writer::*;

pub type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Polls `check` every 500 ms until it returns `Ok`, or panics with its last error.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::result::Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match check().await {
            Ok(v) => return v,
            Err(last) if Instant::now() > deadline => {
                panic!("{what}: not within {timeout:?}; last: {last}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// The real-node tests of one process run one at a time: each runs several kubelets and
/// PostgreSQL servers, and two at once on 2 cores would slow every failover.
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub struct RealEnv {
    // Drop order: nodes before the control plane.
    pub nodes: RealNodes,
    pub plane: ControlPlane,
    pub client: kube::Client,
    pub images: Images,
    pub started: Instant,
}

impl Drop for RealEnv {
    /// A test that fails shows what the operator and the instances said last (the nodes'
    /// directories go with them).
    fn drop(&mut self) {
        if std::thread::panicking() || std::env::var_os("PGOP_SHOW_POD_LOGS").is_some() {
            eprintln!(
                "=== pod logs (last 60 lines each) ===\n{}",
                pod_logs(self, "", 60)
            );
        }
    }
}

impl RealEnv {
    /// A control plane and `workload` real nodes (`node-0`...), plus, with `infra`, one
    /// more node for the operator, CoreDNS and clients (tainted: no instance lands there).
    pub async fn start(workload: usize, infra: bool) -> Result<Self> {
        Self::start_with(workload, infra, false).await
    }

    /// [`RealEnv::start`], with the next pgop image (`Images::next`) in every node too when
    /// `next`.
    pub async fn start_with(workload: usize, infra: bool, next: bool) -> Result<Self> {
        let images = pgop_testenv::images::built()?;
        let mut archives = images.archives();
        if next {
            archives.push(images.next()?.1.archive.clone());
        }
        let started = Instant::now();
        let plane = ControlPlane::start(
            Options::default()
                .with_controller_manager()
                .with_scheduler()
                .with_real_nodes(),
        )
        .await?;
        let nodes = RealNodes::start(
            &plane,
            NodesOptions {
                count: workload + usize::from(infra),
                images: archives,
                sandbox_image: images.pause.name.clone(),
                bin_dir: None,
                dns_image: Some(images.coredns.name.clone()),
                infra_node: infra,
            },
        )
        .await?;
        println!(
            "{} real nodes and CoreDNS ready in {:.1?}",
            nodes.names().len(),
            started.elapsed()
        );
        let client = plane.client()?;
        Ok(Self {
            nodes,
            plane,
            client,
            images,
            started,
        })
    }

    pub fn helm(&self, args: &[&str]) -> Result<String> {
        self.tool(pgop_testenv::binaries::Binary::Helm, args)
    }

    /// `kubectl` against the control plane, as an administrator would run it.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        self.tool(pgop_testenv::binaries::Binary::Kubectl, args)
    }

    fn tool(&self, binary: pgop_testenv::binaries::Binary, args: &[&str]) -> Result<String> {
        let program = pgop_testenv::binaries::locate(binary)?;
        let out = Command::new(&program)
            .args(args)
            .env("KUBECONFIG", self.plane.kubeconfig())
            .env("HELM_CACHE_HOME", self.plane.dir().join("helm/cache"))
            .env("HELM_CONFIG_HOME", self.plane.dir().join("helm/config"))
            .env("HELM_DATA_HOME", self.plane.dir().join("helm/data"))
            .output()?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if !out.status.success() {
            return Err(format!("{} {args:?} failed: {text}", program.display()).into());
        }
        Ok(text)
    }

    /// `helm install pgop charts/pgop` with the built image (and `extra` arguments), then
    /// waits until the operator holds its leader Lease.
    pub async fn install_operator(&self, extra: &[&str]) -> Result {
        let (repository, tag) = self
            .images
            .pgop
            .name
            .rsplit_once(':')
            .ok_or("the pgop image has no tag")?;
        let chart = repo().join("charts/pgop").display().to_string();
        let image_repository = format!("image.repository={repository}");
        let image_tag = format!("image.tag={tag}");
        let mut args = vec![
            "install",
            "pgop",
            &chart,
            "--namespace",
            "pgop-system",
            "--create-namespace",
            "--set",
            &image_repository,
            "--set",
            &image_tag,
            "--wait",
            "--timeout",
            "180s",
        ];
        args.extend_from_slice(extra);
        self.helm(&args)?;
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), "pgop-system");
        eventually(
            "the operator holds the leader Lease",
            Duration::from_secs(120),
            || async {
                let holder = leases
                    .get_opt("pgop-operator")
                    .await
                    .map_err(|e| e.to_string())?
                    .and_then(|l| l.spec)
                    .and_then(|s| s.holder_identity)
                    .ok_or("no holder yet")?;
                if holder.starts_with("pgop") {
                    Ok(holder)
                } else {
                    Err(format!("held by {holder}"))
                }
            },
        )
        .await;
        println!("operator leading at {:.1?}", self.started.elapsed());
        self.converting().await;
        Ok(())
    }

    /// Waits until the API server converts a `v1alpha1` PostgresCluster through the
    /// operator's webhook (its keeper writes the CRD's caBundle as it starts, not before
    /// the Lease).
    pub async fn converting(&self) {
        if let Err(e) = pgop_operator::webhook::wait_converting(
            &self.client,
            "pgop-system",
            Duration::from_secs(120),
        )
        .await
        {
            panic!("the conversion webhook answers: {e}");
        }
        println!("conversion answering at {:.1?}", self.started.elapsed());
    }

    /// The Helm arguments that keep the operator on the infrastructure node.
    pub fn on_infra() -> Vec<String> {
        vec![
            "--set-string".into(),
            format!("nodeSelector.{}=true", INFRA_LABEL.replace('.', "\\.")),
            "--set".into(),
            format!("tolerations[0].key={INFRA_LABEL}"),
            "--set".into(),
            "tolerations[0].operator=Exists".into(),
            "--set".into(),
            "tolerations[0].effect=NoSchedule".into(),
        ]
    }

    /// A namespace enforcing the `restricted` Pod Security Standard.
    pub async fn restricted_namespace(&self, name: &str) -> Result {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": name, "labels": {
                        "pod-security.kubernetes.io/enforce": "restricted",
                        "pod-security.kubernetes.io/enforce-version": "latest"
                    }}
                }))?,
            )
            .await?;
        Ok(())
    }

    /// Creates PostgresCluster `name` in `ns` with `spec`.
    pub async fn create_cluster(&self, ns: &str, name: &str, spec: serde_json::Value) -> Result {
        self.clusters(ns)
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "apiVersion": "database.example.com/v1alpha1",
                    "kind": "PostgresCluster",
                    "metadata": {"name": name},
                    "spec": spec
                }))?,
            )
            .await?;
        Ok(())
    }

    pub fn clusters(&self, ns: &str) -> Api<PostgresCluster> {
        Api::namespaced(self.client.clone(), ns)
    }

    pub fn pods(&self, ns: &str) -> Api<Pod> {
        Api::namespaced(self.client.clone(), ns)
    }

    /// Waits until the cluster is Ready with `replicas` ready instances, the current
    /// primary reporting so and every other instance a replica.
    pub async fn wait_ready(
        &self,
        ns: &str,
        name: &str,
        replicas: i32,
        timeout: Duration,
    ) -> PostgresCluster {
        let clusters = self.clusters(ns);
        let pods = self.pods(ns);
        eventually(
            &format!("{name} is Ready with {replicas} instances"),
            timeout,
            || async {
                let c = clusters.get(name).await.map_err(|e| e.to_string())?;
                let status = c.status.clone().unwrap_or_default();
                let roles_ok = status.instances.iter().all(|i| {
                    let want = if status.current_primary.as_deref() == Some(i.name.as_str()) {
                        InstanceRole::Primary
                    } else {
                        InstanceRole::Replica
                    };
                    i.role == Some(want)
                });
                if status.phase == Some(ClusterPhase::Ready)
                    && status.ready_replicas == replicas
                    && status.instances.len() == replicas as usize
                    && status.current_primary == status.target_primary
                    && roles_ok
                {
                    return Ok(c);
                }
                let listed: Vec<String> = pods
                    .list(&Default::default())
                    .await
                    .map(|l| {
                        l.items
                            .iter()
                            .map(|p| {
                                format!(
                                    "{}: {:?}",
                                    p.metadata.name.clone().unwrap_or_default(),
                                    p.status.as_ref().map(|s| &s.phase)
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                Err(format!(
                    "phase {:?}, ready {}, primary {:?}, instances {:?}; pods {listed:?}",
                    status.phase,
                    status.ready_replicas,
                    status.current_primary,
                    status
                        .instances
                        .iter()
                        .map(|i| (&i.name, &i.role))
                        .collect::<Vec<_>>()
                ))
            },
        )
        .await
    }

    /// The node a Pod runs on.
    pub async fn node_of(&self, ns: &str, pod: &str) -> Result<String> {
        Ok(self
            .pods(ns)
            .get(pod)
            .await?
            .spec
            .and_then(|s| s.node_name)
            .ok_or_else(|| format!("{pod} is not scheduled"))?)
    }
}

/// Waits until the Pod's container has terminated; returns its exit code and termination
/// message.
pub async fn finished(pods: &Api<Pod>, name: &str, timeout: Duration) -> (i32, String) {
    eventually(&format!("{name} finishes"), timeout, || async {
        let p = pods.get(name).await.map_err(|e| e.to_string())?;
        let terminated = p
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.first())
            .and_then(|c| c.state.as_ref())
            .and_then(|s| s.terminated.clone());
        match terminated {
            Some(t) => Ok((t.exit_code, t.message.unwrap_or_default())),
            None => Err(format!("{:?}", p.status.map(|s| s.phase))),
        }
    })
    .await
}

/// A bash command running `psql -qAt -h <host> <args>` the way a client would: a
/// connection that fails to open (psql's exit status 2, e.g. "No route to host" while
/// kube-proxy has not yet programmed a Service's new endpoint, which can trail the Pod's
/// readiness by seconds on a loaded machine) is retried once a second for up to 60 s;
/// any other failure ends it at once with psql's status.
pub fn psql_retrying(host: &str, args: &str) -> String {
    format!(
        "n=0; until psql -qAt -h {host} {args}; do s=$?; n=$((n+1)); \
         if [ $s -ne 2 ] || [ $n -ge 60 ]; then exit $s; fi; sleep 1; done"
    )
}

/// The restricted-compliant security settings of a client Pod of the pgop image.
pub fn client_pod(
    name: &str,
    image: &str,
    secret: &str,
    script: &str,
    extra_spec: serde_json::Value,
) -> Result<Pod> {
    let mut pod = json!({
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": true, "runAsUser": 26, "runAsGroup": 26,
                                "fsGroup": 26, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "client", "image": image, "imagePullPolicy": "IfNotPresent",
                "command": ["bash", "-c", script],
                "terminationMessagePolicy": "FallbackToLogsOnError",
                "env": [
                    {"name": "PGUSER", "valueFrom": {"secretKeyRef": {"name": secret, "key": "username"}}},
                    {"name": "PGPASSWORD", "valueFrom": {"secretKeyRef": {"name": secret, "key": "password"}}},
                    {"name": "PGDATABASE", "valueFrom": {"secretKeyRef": {"name": secret, "key": "dbname"}}},
                    {"name": "PGCONNECT_TIMEOUT", "value": "2"},
                    // TLS, verified as a careful client does: the cluster's authority from
                    // the app Secret, the name in the certificate.
                    {"name": "PGSSLMODE", "value": "verify-full"},
                    {"name": "PGSSLROOTCERT", "value": "/etc/pgop-app/ca.crt"}
                ],
                "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                                    "capabilities": {"drop": ["ALL"]}},
                "volumeMounts": [{"name": "out", "mountPath": "/out"},
                                 {"name": "app-ca", "mountPath": "/etc/pgop-app", "readOnly": true}]
            }],
            "volumes": [{"name": "out", "emptyDir": {}},
                        {"name": "app-ca", "secret": {"secretName": secret, "defaultMode": 0o444,
                                                      "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]
        }
    });
    if let (Some(spec), Some(extra)) = (pod["spec"].as_object_mut(), extra_spec.as_object()) {
        for (k, v) in extra {
            spec.insert(k.clone(), v.clone());
        }
    }
    Ok(serde_json::from_value(pod)?)
}

/// Keeps the Pod on the infrastructure node.
pub fn infra_placement() -> serde_json::Value {
    json!({
        "nodeSelector": {INFRA_LABEL: "true"},
        "tolerations": [{"key": INFRA_LABEL, "operator": "Exists", "effect": "NoSchedule"}]
    })
}

/// The Events about `object` in `ns` with `reason`, oldest first (their messages).
pub async fn events(env: &RealEnv, ns: &str, object: &str, reason: &str) -> Result<Vec<String>> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(env.client.clone(), ns);
    let mut found: Vec<(String, String)> = api
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(object))
        .map(|e| {
            let at = e
                .event_time
                .as_ref()
                .map(|t| t.0.to_string())
                .or_else(|| {
                    e.deprecated_first_timestamp
                        .as_ref()
                        .map(|t| t.0.to_string())
                })
                .unwrap_or_default();
            (at, e.note.unwrap_or_default())
        })
        .collect();
    found.sort();
    Ok(found.into_iter().map(|(_, note)| note).collect())
}

/// The last `lines` lines the operator logged (read from the nodes' pod-log
/// directories: `kubectl logs` needs the API server to reach a kubelet, which it cannot
/// from the machine's loopback).
pub fn operator_log(env: &RealEnv, lines: usize) -> String {
    pod_logs(env, "pgop-system_", lines)
}

/// The last `lines` lines of every container log of the Pods whose log directory
/// (`<namespace>_<pod>_<uid>`) starts with `prefix`, on every node.
pub fn pod_logs(env: &RealEnv, prefix: &str, lines: usize) -> String {
    let mut out = String::new();
    for node in env.nodes.names() {
        let dir = env.nodes.dir().join(&node).join("pod-logs");
        let Ok(pods) = std::fs::read_dir(&dir) else {
            continue;
        };
        for pod in pods.flatten() {
            if !pod.file_name().to_string_lossy().starts_with(prefix) {
                continue;
            }
            let Ok(containers) = std::fs::read_dir(pod.path()) else {
                continue;
            };
            for container in containers.flatten() {
                let Ok(logs) = std::fs::read_dir(container.path()) else {
                    continue;
                };
                for log in logs.flatten() {
                    let text = std::fs::read_to_string(log.path()).unwrap_or_default();
                    let all: Vec<&str> = text.lines().collect();
                    let tail = &all[all.len().saturating_sub(lines)..];
                    out.push_str(&format!(
                        "--- {}\n{}\n",
                        log.path().display(),
                        tail.join("\n")
                    ));
                }
            }
        }
    }
    out
}

/// Three workload nodes and an infrastructure node, the operator installed by its chart on
/// the latter, and a Ready 3-instance cluster `db` in `ns` (restricted) with
/// `synchronous: 1, dataDurability: required`: one instance per workload node.
pub async fn synchronous_cluster_on_three_nodes(ns: &str) -> Result<(RealEnv, PostgresCluster)> {
    let env = RealEnv::start(3, true).await?;
    let infra = RealEnv::on_infra();
    let extra: Vec<&str> = infra.iter().map(String::as_str).collect();
    env.install_operator(&extra).await?;
    env.restricted_namespace(ns).await?;
    env.create_cluster(ns, "db", synchronous_spec()).await?;
    let ready = env.wait_ready(ns, "db", 3, Duration::from_secs(300)).await;
    Ok((env, ready))
}

impl RealEnv {
    /// `helm install RELEASE charts/pgop` into `pgop-system` with the pgop image `image`
    /// (a full name, `repository:tag`) and `extra` arguments, then waits until a Pod of
    /// that release holds its leader Lease (`<release>-operator`); returns the holder.
    /// For several releases side by side and upgrades (e2e_real_upgrade).
    pub async fn install_release(
        &self,
        release: &str,
        image: &str,
        extra: &[&str],
    ) -> Result<String> {
        let (repository, tag) = image.rsplit_once(':').ok_or("the image has no tag")?;
        let chart = repo().join("charts/pgop").display().to_string();
        let (repository, tag) = (
            format!("image.repository={repository}"),
            format!("image.tag={tag}"),
        );
        let mut args = vec![
            "install",
            release,
            &chart,
            "--namespace",
            "pgop-system",
            "--create-namespace",
            "--set",
            &repository,
            "--set",
            &tag,
            "--wait",
            "--timeout",
            "180s",
        ];
        args.extend_from_slice(extra);
        self.helm(&args)?;
        self.release_leader(release, image).await
    }

    /// Waits until the leader Lease of `release` is held by a running Pod of that release
    /// whose image is `image` (after an install, an upgrade or a rollback); returns it.
    pub async fn release_leader(&self, release: &str, image: &str) -> Result<String> {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), "pgop-system");
        let pods = self.pods("pgop-system");
        let lease = format!("{release}-operator");
        let holder = eventually(
            &format!("{release} leads with {image}"),
            Duration::from_secs(180),
            || async {
                let holder = leases
                    .get_opt(&lease)
                    .await
                    .map_err(|e| e.to_string())?
                    .and_then(|l| l.spec)
                    .and_then(|s| s.holder_identity)
                    .ok_or("no holder yet")?;
                let pod = pods
                    .get(&holder)
                    .await
                    .map_err(|e| format!("{holder}: {e}"))?;
                let running = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.containers.first())
                    .and_then(|c| c.image.clone())
                    .unwrap_or_default();
                if running == image || running.ends_with(&format!("/{image}")) {
                    Ok(holder)
                } else {
                    Err(format!("held by {holder}, which runs {running}"))
                }
            },
        )
        .await;
        println!(
            "{release} leading ({holder}, {image}) at {:.1?}",
            self.started.elapsed()
        );
        self.converting().await;
        Ok(holder)
    }
}

/// The spec of the real-node fault tests' cluster: 3 instances, one synchronous standby,
/// `dataDurability: required`.
pub fn synchronous_spec() -> serde_json::Value {
    json!({
        "replicas": 3,
        "storage": {"size": "1Gi"},
        "replication": {"synchronous": 1, "dataDurability": "required"}
    })
}

/// The secret values of `cluster` in `ns`, named: the app and replication passwords, and
/// the keys of the manager channel's authority and of the managers' certificate (their
/// longest base64 line, which nothing else could contain by chance).
pub async fn secret_values(
    env: &RealEnv,
    ns: &str,
    cluster: &str,
) -> Result<Vec<(String, String)>> {
    use k8s_openapi::api::core::v1::Secret;
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), ns);
    let mut out = Vec::new();
    for (suffix, key) in [
        ("-app", "password"),
        ("-replication", "password"),
        ("-ca", "ca.key"),
        ("-manager-tls", "tls.key"),
        ("-postgres-ca", "ca.key"),
        ("-server-tls", "tls.key"),
        ("-replication-tls", "tls.key"),
    ] {
        let name = format!("{cluster}{suffix}");
        let secret = secrets.get(&name).await?;
        let value = secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .map(|v| String::from_utf8_lossy(&v.0).into_owned())
            .ok_or_else(|| format!("{name} has no {key}"))?;
        let value = if key.ends_with(".key") {
            value
                .lines()
                .filter(|l| !l.starts_with("-----"))
                .max_by_key(|l| l.len())
                .unwrap_or_default()
                .to_string()
        } else {
            value
        };
        if value.len() < 16 {
            return Err(format!("{name}/{key} is too short to search for").into());
        }
        out.push((format!("{name}/{key}"), value));
    }
    Ok(out)
}

/// Fails naming where a secret value was found: the log of any container of any Pod on any
/// node (the operator's, every instance's, the clients'), any Event in the cluster, or the
/// status of any PostgresCluster or PostgresBackup in `ns`.
pub async fn assert_no_secret_in_logs_events_or_status(
    env: &RealEnv,
    ns: &str,
    secrets: &[(String, String)],
) -> Result {
    use k8s_openapi::api::core::v1::Event;
    let mut places: Vec<(String, String)> = Vec::new();
    places.push(("pod logs".into(), pod_logs(env, "", usize::MAX)));
    let events: Api<Event> = Api::all(env.client.clone());
    for e in events.list(&Default::default()).await?.items {
        places.push((
            format!(
                "Event {}/{}",
                e.metadata.namespace.clone().unwrap_or_default(),
                e.metadata.name.clone().unwrap_or_default()
            ),
            serde_json::to_string(&e)?,
        ));
    }
    for c in env.clusters(ns).list(&Default::default()).await?.items {
        places.push((
            format!(
                "PostgresCluster {} status",
                c.metadata.name.clone().unwrap_or_default()
            ),
            serde_json::to_string(&c.status)?,
        ));
    }
    let backups: Api<pgop_api::backup::PostgresBackup> = Api::namespaced(env.client.clone(), ns);
    for b in backups.list(&Default::default()).await?.items {
        places.push((
            format!(
                "PostgresBackup {} status",
                b.metadata.name.clone().unwrap_or_default()
            ),
            serde_json::to_string(&b.status)?,
        ));
    }
    let searched: usize = places.iter().map(|(_, text)| text.len()).sum();
    for (what, value) in secrets {
        for (place, text) in &places {
            assert!(!text.contains(value.as_str()), "{what} found in {place}");
        }
    }
    println!(
        "{} secret values absent from {} places ({searched} bytes: pod logs, Events, statuses)",
        secrets.len(),
        places.len()
    );
    Ok(())
}
