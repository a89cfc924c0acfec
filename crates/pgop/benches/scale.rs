//! The scale benchmark: `cargo bench -p pgop --bench scale [-- N ...]` (default 10 100)
//! prints, for N three-instance clusters created at once in one namespace:
//! - the time until every cluster has its children (3 Pods each; no node, so the Pods stay
//!   Pending and only the control loop is measured), or how many had them at the cap;
//! - the operator's resident memory once settled, and its peak; and of the settled memory,
//!   how much is anonymous (what it holds) and how much file-backed (its code's pages);
//! - the operator's CPU seconds while the fleet was being created, and its CPU use (% of
//!   one core) over the steady minute after;
//! - API requests per second per cluster over that minute, by verb, from the API server's
//!   own `apiserver_request_total` (only the operator talks to it then);
//! - then, with the fleet in place, how long one more cluster takes to get its 3 Pods:
//!   whether a user's change waits behind the fleet's periodic passes.
//!
//! The operator is the `pgop operator` binary, run as its own process out of cluster (as it
//! would run in a Pod), against a testenv control plane (API server and etcd, no
//! controller manager). Every N gets a fresh namespace and a fresh operator. Run it on an
//! otherwise idle machine; the figures are wall-clock times on this machine.
//!
//! Environment: `PGOP_SCALE_CAP_SECS` (default 600), how long to wait for the children of
//! one N; `PGOP_SCALE_STEADY_SECS` (default 60), the steady window.
//!
//! Comparison: with `PGOP_SCALE_CNPG` (the path of CloudNativePG's `manager`, built from
//! its source) and `PGOP_SCALE_CNPG_CRDS` (the directory of its CRDs as YAML,
//! `config/crd/bases` in its source), each N is also measured with CloudNativePG first, on
//! a control plane of its own started the same way, with `instances: 3` clusters (each
//! operator gets its own plane: two fleets of 1,000 clusters' Services do not fit one
//! Service range). Out of cluster, as in issue 15's measurement: its webhook server gets
//! a self-signed certificate (`openssl`) and no webhook configuration is installed. With
//! no kubelet it stops at each cluster's first instance's initdb Job, so its clusters
//! count as complete once they have that Job.

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use pgop_testenv::{ControlPlane, Options, TestNamespace};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

type Result<T = (), E = Box<dyn std::error::Error + Send + Sync>> = std::result::Result<T, E>;

#[path = "support/measure.rs"]
mod measure;
use measure::{Operator, env_secs, pgop_command, print_table, requests_by_verb, sizes, usage};

/// The operator measured: pgop, or CloudNativePG's manager beside it for comparison.
enum Subject {
    Pgop,
    /// CloudNativePG's `manager` binary, built from its source (which nothing here
    /// contains); its CRDs are installed from `PGOP_SCALE_CNPG_CRDS`.
    CloudNativePg {
        manager: PathBuf,
    },
}

impl Subject {
    fn name(&self) -> &'static str {
        match self {
            Subject::Pgop => "pgop",
            Subject::CloudNativePg { .. } => "CloudNativePG",
        }
    }

    /// The cluster kind.
    fn clusters(&self) -> ApiResource {
        match self {
            Subject::Pgop => ApiResource::erase::<pgop_api::v1beta1::PostgresCluster>(&()),
            Subject::CloudNativePg { .. } => ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("postgresql.cnpg.io", "v1", "Cluster"),
                "clusters",
            ),
        }
    }

    /// A three-instance cluster of 1 GiB volumes.
    fn cluster(&self, name: &str) -> Result<DynamicObject> {
        let resource = self.clusters();
        let spec = match self {
            Subject::Pgop => serde_json::json!({"instances": 3, "storage": {"size": "1Gi"}}),
            Subject::CloudNativePg { .. } => {
                serde_json::json!({"instances": 3, "storage": {"size": "1Gi"}})
            }
        };
        Ok(serde_json::from_value(serde_json::json!({
            "apiVersion": resource.api_version,
            "kind": resource.kind,
            "metadata": {"name": name},
            "spec": spec,
        }))?)
    }

    /// The last child it creates without a node, its label selector, the label that names
    /// its cluster, and how many a cluster has when complete: pgop creates its three
    /// Pods; CloudNativePG, with no kubelet to run a Pod, stops at its first instance's
    /// initdb Job.
    fn last_child(&self) -> (ApiResource, &'static str, &'static str, usize) {
        match self {
            Subject::Pgop => (
                ApiResource::erase::<Pod>(&()),
                "app.kubernetes.io/managed-by=pgop",
                "database.example.com/cluster",
                3,
            ),
            Subject::CloudNativePg { .. } => (
                ApiResource::erase::<Job>(&()),
                "cnpg.io/jobRole=initdb",
                "cnpg.io/cluster",
                1,
            ),
        }
    }

    /// Starts the operator on `namespace`, its output to `log`.
    fn start(&self, plane: &ControlPlane, namespace: &str, log: &Path) -> Result<Operator> {
        let log = std::fs::File::create(log)?;
        let mut command = match self {
            Subject::Pgop => {
                let mut command = pgop_command();
                command
                    .args(["operator", "--namespace", namespace])
                    .args(["--metrics-bind-address", "0"])
                    .env("RUST_LOG", "info");
                command
            }
            Subject::CloudNativePg { manager } => {
                use std::os::unix::process::CommandExt;
                // Its webhook server needs a certificate to start; nothing calls it (no
                // webhook configuration is installed), as in issue 15's measurement.
                let certs = std::env::temp_dir().join(format!("pgop-scale-cnpg-{namespace}"));
                self_signed(&certs)?;
                let port = std::net::TcpListener::bind("127.0.0.1:0")?
                    .local_addr()?
                    .port();
                // It looks for its own binary, per architecture, at
                // `operator/manager_<GOARCH>` from its working directory (the hash of that
                // file goes into every cluster's status).
                let arch = match std::env::consts::ARCH {
                    "x86_64" => "amd64",
                    "aarch64" => "arm64",
                    other => other,
                };
                std::fs::create_dir_all(certs.join("operator"))?;
                let own = certs.join("operator").join(format!("manager_{arch}"));
                let _ = std::fs::remove_file(&own);
                std::os::unix::fs::symlink(manager, &own)?;
                let mut command = std::process::Command::new(manager);
                command
                    .current_dir(&certs)
                    .args(["controller", "--metrics-bind-address=0"])
                    .arg(format!("--webhook-port={port}"))
                    .env("WATCH_NAMESPACE", namespace)
                    .env("OPERATOR_NAMESPACE", namespace)
                    .env("WEBHOOK_CERT_DIR", &certs)
                    .process_group(0);
                command
            }
        };
        Ok(Operator(
            command
                .env("KUBECONFIG", plane.kubeconfig())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()?,
        ))
    }
}

/// A self-signed certificate and key in `dir` (`tls.crt` and `tls.key`, and the same as
/// `apiserver.crt` and `apiserver.key`), by `openssl`.
fn self_signed(dir: &Path) -> Result {
    std::fs::create_dir_all(dir)?;
    let status = std::process::Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        ])
        .args(["-subj", "/CN=localhost", "-keyout"])
        .arg(dir.join("tls.key"))
        .arg("-out")
        .arg(dir.join("tls.crt"))
        .stderr(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("openssl (apt-get install openssl): {e}"))?;
    if !status.success() {
        return Err(format!("openssl req failed: {status}").into());
    }
    // The names CloudNativePG's webhook server reads when it was given the directory.
    std::fs::copy(dir.join("tls.crt"), dir.join("apiserver.crt"))?;
    std::fs::copy(dir.join("tls.key"), dir.join("apiserver.key"))?;
    Ok(())
}

/// CloudNativePG's CRDs, from the YAML files in `dir`.
fn crds_in(dir: &Path) -> Result<Vec<CustomResourceDefinition>> {
    let mut crds = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let text = std::fs::read_to_string(&path)?;
            crds.push(serde_yaml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?);
        }
    }
    Ok(crds)
}

struct Row {
    subject: &'static str,
    n: usize,
    children: String,
    rss: String,
    ramp_cpu: String,
    steady_cpu: String,
    requests: String,
    one_more: String,
}

async fn one(
    plane: &ControlPlane,
    client: &kube::Client,
    subject: &Subject,
    n: usize,
) -> Result<Row> {
    let ns = TestNamespace::create(plane.config(), &format!("scale-{n}")).await?;
    let namespace = ns.name().to_string();
    // Kept after the run (the control plane's directory is not): for a post-mortem.
    let log_path = std::env::temp_dir().join(format!(
        "{}-scale-operator-{n}.log",
        subject.name().to_lowercase()
    ));
    eprintln!("operator log: {}", log_path.display());
    let operator = subject.start(plane, &namespace, &log_path)?;
    let pid = operator.0.id();
    // Let it list and watch its (empty) namespace first.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cpu_before = usage(pid)?.cpu;

    let clusters: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &namespace, &subject.clusters());
    let started = Instant::now();
    let created: Vec<Result<()>> = futures::stream::iter(0..n)
        .map(|i| {
            let clusters = clusters.clone();
            async move {
                clusters
                    .create(&PostParams::default(), &subject.cluster(&format!("c{i}"))?)
                    .await?;
                Ok(())
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    for result in created {
        result?;
    }

    // Every cluster has its last child, or the cap passed.
    let (kind, selector, cluster_label, complete_at) = subject.last_child();
    let last: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &kind);
    let cap = env_secs("PGOP_SCALE_CAP_SECS", 600);
    let list = ListParams::default().labels(selector);
    let children = loop {
        let mut per_cluster: BTreeMap<String, usize> = BTreeMap::new();
        for child in last.list_metadata(&list).await?.items {
            if let Some(c) = child
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(cluster_label))
            {
                *per_cluster.entry(c.clone()).or_default() += 1;
            }
        }
        let complete = per_cluster.values().filter(|&&c| c >= complete_at).count();
        if complete == n {
            break format!("{:.1} s", started.elapsed().as_secs_f64());
        }
        if started.elapsed() > cap {
            break format!("never: {complete}/{n} at {} s", cap.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let cpu_ramp = usage(pid)?.cpu;

    // The steady minute: nobody but the operator talks to the API server.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let steady = env_secs("PGOP_SCALE_STEADY_SECS", 60);
    let before = requests_by_verb(client).await?;
    let cpu_a = usage(pid)?.cpu;
    tokio::time::sleep(steady).await;
    let settled = usage(pid)?;
    let cpu_b = settled.cpu;
    let after = requests_by_verb(client).await?;
    let per_second_per_cluster = |count: f64| count / steady.as_secs_f64() / n as f64;
    let mut total = 0.0;
    let mut by_verb = Vec::new();
    for (verb, count) in &after {
        let delta = count - before.get(verb).copied().unwrap_or(0.0);
        if delta > 0.0 {
            total += delta;
            by_verb.push(format!("{verb} {:.2}", per_second_per_cluster(delta)));
        }
    }
    // One more cluster, created into the running fleet.
    let started = Instant::now();
    clusters
        .create(&PostParams::default(), &subject.cluster("late")?)
        .await?;
    let late = ListParams::default().labels(&format!("{selector},{cluster_label}=late"));
    let one_more = loop {
        if last.list_metadata(&late).await?.items.len() >= complete_at {
            break format!("{:.2} s", started.elapsed().as_secs_f64());
        }
        if started.elapsed() > cap {
            break format!("never within {} s", cap.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    drop(operator);
    Ok(Row {
        subject: subject.name(),
        one_more,
        n,
        children,
        rss: settled.memory(),
        ramp_cpu: format!("{:.1} s", cpu_ramp - cpu_before),
        steady_cpu: format!("{:.1} %", 100.0 * (cpu_b - cpu_a) / steady.as_secs_f64()),
        requests: format!(
            "{:.2} ({})",
            per_second_per_cluster(total),
            by_verb.join(", ")
        ),
    })
}

#[tokio::main]
async fn main() -> Result {
    let sizes = sizes(&[10, 100]);
    let mut subjects = Vec::new();
    let mut cnpg_crds = Vec::new();
    if let Some(manager) = std::env::var_os("PGOP_SCALE_CNPG") {
        let crds = std::env::var_os("PGOP_SCALE_CNPG_CRDS")
            .ok_or("PGOP_SCALE_CNPG_CRDS: the directory of CloudNativePG's CRDs (YAML)")?;
        cnpg_crds = crds_in(Path::new(&crds))?;
        subjects.push(Subject::CloudNativePg {
            manager: manager.into(),
        });
    }
    subjects.push(Subject::Pgop);
    let mut rows = Vec::new();
    for subject in &subjects {
        // A control plane of its own: the objects of a run stay in the API server (no
        // namespace controller deletes them), and two operators' 1,000 clusters of three
        // Services each would not fit one Service range.
        let plane = ControlPlane::start(Options::default()).await?;
        let client = plane.client()?;
        match subject {
            Subject::Pgop => {
                pgop_testenv::crds::install_converting(
                    &client,
                    pgop_api::crds(),
                    pgop_api::v1beta1::review_json,
                    pgop_api::CONVERT_PATH,
                )
                .await?
            }
            Subject::CloudNativePg { .. } => {
                pgop_testenv::crds::install(&client, cnpg_crds.clone()).await?
            }
        }
        for &n in &sizes {
            eprintln!("{} N = {n} ...", subject.name());
            let row = one(&plane, &client, subject, n).await?;
            eprintln!("N = {n}: {} | {} | {}", row.children, row.rss, row.requests);
            rows.push(row);
        }
    }
    let rows: Vec<Vec<String>> = rows
        .into_iter()
        .map(|r| {
            vec![
                r.subject.to_string(),
                r.n.to_string(),
                r.children,
                r.rss,
                r.ramp_cpu,
                r.steady_cpu,
                r.requests,
                r.one_more,
            ]
        })
        .collect();
    print_table(
        &[
            "operator",
            "N clusters × 3",
            "until every cluster has its children",
            "operator RSS settled (peak); anonymous + file-backed",
            "CPU while creating",
            "CPU steady",
            "steady API requests / s / cluster (by verb)",
            "one more cluster's children",
        ],
        &rows,
    );
    Ok(())
}
