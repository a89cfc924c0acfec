//! The end-to-end environment shared by the e2e tests and the HA benchmark: a real API
//! server with kube-controller-manager, the local node running `pgop instance run` (this
//! crate's binary) as pods, the operator in-process, and real PostgreSQL.
//!
//! This file holds `Env`, how it starts and stops, the scenario helpers over it (a
//! cluster's waits, a failover after a kill) and `eventually`. Beside it: `sql`, the
//! PostgreSQL client helpers; `secrets`, the Secret fixtures; `requests`, the counter of
//! API requests. Each is re-exported here, so a test names `common::connect`,
//! `common::secret` or `common::Requests`.
#![allow(dead_code)] // each test module (and each benchmark) uses its own subset

pub mod pg;
/// `pg` on PostgreSQL 18: the same file compiled again, whose module path picks 18.
#[allow(clippy::duplicate_mod)]
#[path = "pg.rs"]
pub mod pg18;
mod requests;
mod secrets;
pub mod sites;
mod sql;

// Each test module (and each benchmark) uses its own subset of these too.
#[allow(unused_imports)]
pub use requests::{Requests, counting_client, is_watch};
#[allow(unused_imports)]
pub use secrets::{postgres_tls_secrets, secret};
#[allow(unused_imports)]
pub use sql::{
    Writer, connect, connect_to, connect_verified, connect_within, count_on, postmaster_started,
    start_times, wait_rows, write_through_rw,
};

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use pgop_api::PostgresCluster;
use pgop_api::cluster::ClusterPhase;
use pgop_testenv::node::{LocalNode, NodeOptions};
use pgop_testenv::{ControlPlane, Options, TestNamespace, wait};
use std::time::Duration;

pub type Result<T = (), E = Box<dyn std::error::Error + Send + Sync>> = std::result::Result<T, E>;

pub const TIMEOUT: Duration = Duration::from_secs(180);

pub struct Env {
    pub plane: ControlPlane,
    pub client: Client,
    pub ns: TestNamespace,
    pub node: LocalNode,
    options: pgop_operator::Options,
    operator: Option<(
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    )>,
}

/// The e2e tests of one process run one at a time: each brings up a control plane and
/// several PostgreSQL servers, and 2 cores shared by all of them would make every
/// failover slow.
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub async fn start(prefix: &str) -> Result<Env> {
    let mut env = start_without_operator(prefix).await?;
    env.start_operator();
    Ok(env)
}

/// pgop's CRDs as deploy/ has them, converting between `v1alpha1` and `v1beta1` through
/// this process's callback endpoint (pgop's conversion, [`pgop_api::v1beta1::review_json`]):
/// the CRD's own Service does not exist here.
pub async fn install_crds(client: &kube::Client) -> Result<(), pgop_testenv::crds::Error> {
    pgop_testenv::crds::install_converting(
        client,
        pgop_api::crds(),
        pgop_api::v1beta1::review_json,
        pgop_api::CONVERT_PATH,
    )
    .await
}

/// [`start`] without the operator: for a caller that runs its own (as a process, say).
pub async fn start_without_operator(prefix: &str) -> Result<Env> {
    start_with_crds(prefix, Crds::Current).await
}

/// The CRDs an environment starts with.
pub enum Crds {
    /// pgop's, as deploy/ has them ([`install_crds`]).
    Current,
    /// Those of a pgop before `v1beta1`: `v1alpha1` served and stored alone
    /// ([`pgop_api::crds_v1alpha1`]), for the upgrade from them.
    BeforeV1beta1,
}

/// [`start_without_operator`] with the CRDs `crds`.
pub async fn start_with_crds(prefix: &str, crds: Crds) -> Result<Env> {
    let plane = ControlPlane::start(Options::default().with_controller_manager()).await?;
    let client = plane.client()?;
    match crds {
        Crds::Current => install_crds(&client).await?,
        Crds::BeforeV1beta1 => {
            pgop_testenv::crds::install(&client, pgop_api::crds_v1alpha1()).await?
        }
    }
    let ns = TestNamespace::create(plane.config(), prefix).await?;
    let node = LocalNode::start(
        &plane,
        NodeOptions {
            name: format!("node-{}", ns.name()),
            namespace: Some(ns.name().to_string()),
            image: "pgop:".into(),
            pgop_binary: env!("CARGO_BIN_EXE_pgop").into(),
            pod_ports: vec![
                pgop_api::constants::POSTGRES_PORT,
                pgop_api::constants::MANAGER_PORT,
                pgop_api::constants::MANAGER_TLS_PORT,
            ],
        },
    )
    .await?;
    let (uid, gid) = pgop_testenv::node::local_user("postgres")
        .ok_or("no postgres user: apt-get install postgresql-15")?;
    let options = pgop_operator::Options {
        namespaces: vec![ns.name().to_string()],
        settings: pgop_operator::Settings {
            run_as_user: i64::from(uid),
            run_as_group: i64::from(gid),
            ..pgop_operator::Settings::default()
        },
        ..pgop_operator::Options::default()
    };
    Ok(Env {
        plane,
        client,
        ns,
        node,
        options,
        operator: None,
    })
}

impl Env {
    pub fn n(&self) -> &str {
        self.ns.name()
    }

    /// A claim's request and capacity, and the filesystem of its volume (size and use, in
    /// MiB) as `statvfs` sees it on this machine.
    pub async fn volume(&self, claim: &str) -> Result<(String, String, u64, u64)> {
        use k8s_openapi::api::core::v1::PersistentVolumeClaim;
        const MIB: u64 = 1024 * 1024;
        let pvc = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), self.n())
            .get(claim)
            .await?;
        let quantity = |q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>| {
            q.map(|q| q.0.clone()).unwrap_or_default()
        };
        let request = quantity(
            pvc.spec
                .as_ref()
                .and_then(|s| s.resources.as_ref())
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get("storage")),
        );
        let capacity = quantity(
            pvc.status
                .as_ref()
                .and_then(|s| s.capacity.as_ref())
                .and_then(|c| c.get("storage")),
        );
        let path = self.claim_dir(claim).await?;
        let fs = pgop_backup::disk::usage(&path).ok_or("statvfs failed")?;
        Ok((
            request,
            capacity,
            fs.capacity_bytes / MIB,
            fs.used_bytes / MIB,
        ))
    }

    /// The directory on this machine that backs a bound claim's volume.
    pub async fn claim_dir(&self, claim: &str) -> Result<std::path::PathBuf> {
        use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
        let pvc = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), self.n())
            .get(claim)
            .await?;
        let pv_name = pvc
            .spec
            .and_then(|s| s.volume_name)
            .ok_or_else(|| format!("{claim} is not bound"))?;
        let pv = Api::<PersistentVolume>::all(self.client.clone())
            .get(&pv_name)
            .await?;
        Ok(pgop_testenv::node::provisioner_host_path(&pv).ok_or("no host path")?)
    }

    pub fn clusters(&self) -> Api<PostgresCluster> {
        Api::namespaced(self.client.clone(), self.n())
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), self.n())
    }

    /// Starts the operator (in this process, as `pgop operator` would run it).
    pub fn start_operator(&mut self) {
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let client = self.client.clone();
        let options = self.options.clone();
        let task = tokio::spawn(async move {
            let run = pgop_operator::run(client, options, async move {
                let _ = rx.await;
            });
            // Without a metrics address (the default), starting cannot fail.
            if let Err(e) = run.await {
                panic!(
                    "the operator did not start: {}",
                    pgop_operator::error_chain(&e)
                );
            }
        });
        self.operator = Some((stop, task));
    }

    /// The options [`Env::start_operator`] runs the operator with (this namespace, the
    /// local node's PostgreSQL user), for a test that adds its own.
    pub fn operator_options(&self) -> pgop_operator::Options {
        self.options.clone()
    }

    /// Starts the operator with `options` (see [`Env::operator_options`]), bound before it
    /// runs; the address of its metrics, when it serves them.
    pub async fn start_operator_with(
        &mut self,
        options: pgop_operator::Options,
    ) -> Result<Option<std::net::SocketAddr>> {
        let operator = pgop_operator::Operator::bind(self.client.clone(), options).await?;
        let metrics = operator.metrics_address();
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let run = operator.run(async move {
                let _ = rx.await;
            });
            if let Err(e) = run.await {
                panic!("the operator failed: {}", pgop_operator::error_chain(&e));
            }
        });
        self.operator = Some((stop, task));
        Ok(metrics)
    }

    /// Kills the operator where it stands: reconciles in flight are dropped mid-way.
    pub async fn kill_operator(&mut self) {
        if let Some((_, task)) = self.operator.take() {
            task.abort();
            let _ = task.await;
        }
    }

    /// Creates a cluster from the `spec` JSON.
    pub async fn create(&self, name: &str, spec: serde_json::Value) -> Result {
        let cluster: PostgresCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "database.example.com/v1alpha1", "kind": "PostgresCluster",
            "metadata": {"name": name},
            "spec": spec,
        }))?;
        self.clusters()
            .create(&PostParams::default(), &cluster)
            .await?;
        Ok(())
    }

    pub async fn patch(&self, name: &str, patch: serde_json::Value) -> Result {
        self.clusters()
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await?;
        Ok(())
    }

    /// The clusters in `v1beta1`, the stored version: read with no conversion, and served
    /// after `v1alpha1` is retired.
    pub fn clusters_v1beta1(&self) -> Api<pgop_api::v1beta1::PostgresCluster> {
        Api::namespaced(self.client.clone(), self.n())
    }

    /// Waits until the cluster satisfies `ok`; the error names `what` and the last status.
    /// Read in `v1beta1` (the status is the same in both versions), returned in `v1alpha1`.
    pub async fn wait_cluster(
        &self,
        name: &str,
        what: &str,
        timeout: Duration,
        ok: impl Fn(&pgop_api::PostgresClusterStatus) -> bool,
    ) -> Result<PostgresCluster> {
        let api = self.clusters_v1beta1();
        let ok = &ok;
        let api = &api;
        Ok(
            wait::until(&format!("{name}: {what}"), timeout, || async move {
                match api.get(name).await {
                    Ok(c) if c.status.as_ref().is_some_and(ok) => Ok(PostgresCluster::from(c)),
                    other => Err(format!("{:?}", other.map(|c| c.status))),
                }
            })
            .await?,
        )
    }

    /// Waits until the cluster is Ready with `replicas` ready instances, one primary (the
    /// current one, reporting so) and every other instance reporting replica.
    pub async fn wait_ready(&self, name: &str, replicas: i32) -> Result<PostgresCluster> {
        self.wait_cluster(
            name,
            &format!("Ready with {replicas} instances"),
            TIMEOUT,
            |s| {
                use pgop_api::cluster::InstanceRole;
                s.phase == Some(ClusterPhase::Ready)
                    && s.ready_replicas == replicas
                    && s.instances.len() == replicas as usize
                    && s.current_primary == s.target_primary
                    && s.instances.iter().all(|i| {
                        let want = if s.current_primary.as_deref() == Some(i.name.as_str()) {
                            InstanceRole::Primary
                        } else {
                            InstanceRole::Replica
                        };
                        i.role == Some(want)
                    })
            },
        )
        .await
        .inspect_err(|_| self.print_pod_logs(name))
    }

    /// The last lines of every instance Pod's logs of the cluster `name` on the local node,
    /// on stderr: what a failing wait shows of the instance managers.
    pub fn print_pod_logs(&self, name: &str) {
        let Ok(dirs) = std::fs::read_dir(self.node.pods_dir()) else {
            return;
        };
        for dir in dirs.flatten() {
            let Ok(logs) = std::fs::read_dir(dir.path()) else {
                continue;
            };
            for log in logs.flatten() {
                let path = log.path();
                if path.extension().is_none_or(|e| e != "log") {
                    continue;
                }
                let Ok(text) = std::fs::read_to_string(&path) else {
                    continue;
                };
                if !text.contains(&format!("\"{name}-")) && !text.contains(&format!("{name}-")) {
                    continue;
                }
                let lines: Vec<&str> = text.lines().collect();
                let tail = &lines[lines.len().saturating_sub(40)..];
                eprintln!("--- {} (last {} lines)", path.display(), tail.len());
                for line in tail {
                    eprintln!("{line}");
                }
            }
        }
    }

    pub async fn current_primary(&self, name: &str) -> Result<String> {
        let c = self.clusters_v1beta1().get(name).await?;
        Ok(c.status
            .and_then(|s| s.current_primary)
            .ok_or("no current primary")?)
    }

    pub async fn password(&self, name: &str) -> Result<String> {
        let secret: Secret = Api::namespaced(self.client.clone(), self.n())
            .get(&format!("{name}-app"))
            .await?;
        let bytes = secret
            .data
            .and_then(|d| d.get("password").cloned())
            .ok_or("no password")?;
        Ok(String::from_utf8(bytes.0)?)
    }

    pub async fn pod_ips(&self, name: &str) -> Result<Vec<(String, String)>> {
        let list = self
            .pods()
            .list(&ListParams::default().labels(&format!("database.example.com/cluster={name}")))
            .await?;
        Ok(list
            .items
            .into_iter()
            .filter_map(|p| Some((p.name_any(), p.status?.pod_ip?)))
            .collect())
    }

    pub async fn pod_ip(&self, pod: &str) -> Result<String> {
        let p = self.pods().get(pod).await?;
        Ok(p.status.and_then(|s| s.pod_ip).ok_or("no pod IP")?)
    }

    /// The address `<cluster>-rw` resolves to now, as the instances resolve it.
    pub fn rw(&self, name: &str) -> Option<String> {
        pgop_testenv::node::resolve_host(
            self.node.hosts_file(),
            &format!("{name}-rw.{}.svc", self.n()),
        )
    }

    /// kill -9 of an instance's postmaster (found as the parent of a backend).
    pub async fn kill_postmaster(&self, pod: &str, password: &str) -> Result<i32> {
        let ip = self.pod_ip(pod).await?;
        let c = connect(&ip, password).await?;
        let backend: i32 = c.query_one("select pg_backend_pid()", &[]).await?.get(0);
        let status = std::fs::read_to_string(format!("/proc/{backend}/status"))?;
        let ppid: i32 = status
            .lines()
            .find_map(|l| l.strip_prefix("PPid:"))
            .ok_or("no PPid")?
            .trim()
            .parse()?;
        // SAFETY: kill has no memory-safety preconditions.
        let rc = unsafe { libc::kill(ppid, libc::SIGKILL) };
        if rc != 0 {
            return Err(format!("kill -9 {ppid}: {}", std::io::Error::last_os_error()).into());
        }
        Ok(ppid)
    }

    /// Waits for an Event of `reason` in the test's namespace; its note.
    pub async fn wait_event(&self, reason: &str) -> Result<String> {
        self.wait_event_about(reason, None).await
    }

    /// Waits for an Event of `reason` in the test's namespace, about the object named
    /// `about` when given; its note.
    pub async fn wait_event_about(&self, reason: &str, about: Option<&str>) -> Result<String> {
        self.wait_event_saying(reason, about, "").await
    }

    /// [`Env::wait_event_about`] for an Event whose note contains `saying`.
    pub async fn wait_event_saying(
        &self,
        reason: &str,
        about: Option<&str>,
        saying: &str,
    ) -> Result<String> {
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(self.client.clone(), self.n());
        let events = &events;
        let what = match about {
            Some(name) => format!("the {reason} Event about {name} saying {saying:?}"),
            None => format!("the {reason} Event saying {saying:?}"),
        };
        Ok(wait::until(&what, TIMEOUT, || async move {
            let list = events
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?;
            list.items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some(reason)
                        && about.is_none_or(|name| {
                            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                        })
                        && e.note.as_deref().unwrap_or_default().contains(saying)
                })
                .and_then(|e| e.note)
                .ok_or_else(|| "none yet".to_string())
        })
        .await?)
    }

    pub async fn delete_pod(&self, pod: &str) -> Result {
        self.pods().delete(pod, &DeleteParams::default()).await?;
        Ok(())
    }

    pub async fn stop(mut self) -> Result {
        if let Some((stop, task)) = self.operator.take() {
            let _ = stop.send(());
            let _ = task.await;
        }
        self.node.stop().await;
        self.ns.delete().await?;
        drop(self.plane);
        Ok(())
    }
}

/// `kubectl pgop status NAME` through the pgop binary; its output.
pub async fn kubectl_pgop_status(env: &Env, name: &str) -> Result<String> {
    kubectl_pgop(env, &["status", name]).await
}

/// `kubectl pgop ARGS -n <the test's namespace>` through the pgop binary; its output.
pub async fn kubectl_pgop(env: &Env, args: &[&str]) -> Result<String> {
    let kubeconfig = env.plane.kubeconfig().to_path_buf();
    let args: Vec<String> = ["kubectl"]
        .iter()
        .chain(args)
        .chain(["-n", env.n()].iter())
        .map(|s| s.to_string())
        .collect();
    let shown = args[1..].join(" ");
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_pgop"))
            .args(args)
            .env("KUBECONFIG", kubeconfig)
            .env_remove("RUST_LOG")
            .output()
    })
    .await??;
    if !out.status.success() {
        return Err(format!(
            "kubectl pgop {shown} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Waits for a confirmed primary other than `old`; returns it.
pub async fn wait_new_primary(env: &Env, name: &str, old: &str) -> Result<String> {
    let c = env
        .wait_cluster(name, &format!("a primary other than {old}"), TIMEOUT, |s| {
            s.current_primary.as_deref().is_some_and(|p| p != old)
                && s.target_primary == s.current_primary
        })
        .await?;
    Ok(c.status
        .and_then(|s| s.current_primary)
        .ok_or("no primary")?)
}

/// kill -9 of the three-instance cluster `name`'s primary postmaster, with 100 rows in
/// table `t` everywhere: a standby takes over, `-rw` points at it and takes row 101, and
/// the old primary rejoins as a standby of the new one (pg_rewind) with all 101 rows.
/// Returns the old primary and the new one.
pub async fn fail_over_after_kill(
    env: &Env,
    name: &str,
    password: &str,
) -> Result<(String, String)> {
    let first = env.current_primary(name).await?;
    env.kill_postmaster(&first, password).await?;
    let second = wait_new_primary(env, name, &first).await?;
    write_through_rw(env, name, password, "insert into t values (101)").await?;
    assert_eq!(
        env.rw(name),
        Some(env.pod_ip(&second).await?),
        "-rw points at the new primary"
    );
    let ready = env.wait_ready(name, 3).await?;
    let old = ready
        .status
        .as_ref()
        .and_then(|s| s.instances.iter().find(|i| i.name == first))
        .ok_or("the old primary is gone from the status")?;
    assert_eq!(old.role, Some(pgop_api::cluster::InstanceRole::Replica));
    rows_everywhere(env, name, password, "t", 101).await?;
    Ok((first, second))
}

/// Every instance holds exactly `rows` rows of `table`.
pub async fn rows_everywhere(
    env: &Env,
    name: &str,
    password: &str,
    table: &str,
    rows: i64,
) -> Result {
    for (pod, ip) in env.pod_ips(name).await? {
        wait_rows(&pod, &ip, password, table, rows).await?;
    }
    Ok(())
}

/// Polls `check` every 200 ms until it yields a value; panics naming `what` after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = std::time::Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
