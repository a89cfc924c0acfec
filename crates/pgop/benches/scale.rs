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

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use pgop_api::PostgresCluster;
use pgop_testenv::{ControlPlane, Options, TestNamespace};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

type Result<T = (), E = Box<dyn std::error::Error + Send + Sync>> = std::result::Result<T, E>;

#[path = "support/measure.rs"]
mod measure;
use measure::{Operator, env_secs, pgop_command, print_table, requests_by_verb, sizes, usage};

fn cluster(name: &str) -> Result<PostgresCluster> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "database.example.com/v1alpha1",
        "kind": "PostgresCluster",
        "metadata": {"name": name},
        "spec": {"replicas": 3, "storage": {"size": "1Gi"}},
    }))?)
}

struct Row {
    n: usize,
    children: String,
    rss: String,
    ramp_cpu: String,
    steady_cpu: String,
    requests: String,
    one_more: String,
}

async fn one(plane: &ControlPlane, client: &kube::Client, n: usize) -> Result<Row> {
    let ns = TestNamespace::create(plane.config(), &format!("scale-{n}")).await?;
    let namespace = ns.name().to_string();
    // Kept after the run (the control plane's directory is not): for a post-mortem.
    let log_path = std::env::temp_dir().join(format!("pgop-scale-operator-{n}.log"));
    eprintln!("operator log: {}", log_path.display());
    let log = std::fs::File::create(&log_path)?;
    let operator = Operator(
        pgop_command()
            .args([
                "operator",
                "--namespace",
                &namespace,
                "--metrics-bind-address",
                "0",
            ])
            .env("KUBECONFIG", plane.kubeconfig())
            .env("RUST_LOG", "info")
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?,
    );
    let pid = operator.0.id();
    // Let it list and watch its (empty) namespace first.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cpu_before = usage(pid)?.cpu;

    let clusters: Api<PostgresCluster> = Api::namespaced(client.clone(), &namespace);
    let started = Instant::now();
    let created: Vec<Result<()>> = futures::stream::iter(0..n)
        .map(|i| {
            let clusters = clusters.clone();
            async move {
                clusters
                    .create(&PostParams::default(), &cluster(&format!("c{i}"))?)
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

    // Every cluster has its 3 Pods, or the cap passed.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let cap = env_secs("PGOP_SCALE_CAP_SECS", 600);
    let list = ListParams::default().labels("app.kubernetes.io/managed-by=pgop");
    let children = loop {
        let mut per_cluster: BTreeMap<String, usize> = BTreeMap::new();
        for pod in pods.list_metadata(&list).await?.items {
            if let Some(c) = pod
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("database.example.com/cluster"))
            {
                *per_cluster.entry(c.clone()).or_default() += 1;
            }
        }
        let complete = per_cluster.values().filter(|&&c| c >= 3).count();
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
        .create(&PostParams::default(), &cluster("late")?)
        .await?;
    let late = ListParams::default().labels("database.example.com/cluster=late");
    let one_more = loop {
        if pods.list_metadata(&late).await?.items.len() >= 3 {
            break format!("{:.2} s", started.elapsed().as_secs_f64());
        }
        if started.elapsed() > cap {
            break format!("never within {} s", cap.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    drop(operator);
    Ok(Row {
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
    let plane = ControlPlane::start(Options::default()).await?;
    let client = plane.client()?;
    pgop_testenv::crds::install(&client, pgop_api::crds()).await?;
    let mut rows = Vec::new();
    for n in sizes {
        eprintln!("N = {n} ...");
        let row = one(&plane, &client, n).await?;
        eprintln!("N = {n}: {} | {} | {}", row.children, row.rss, row.requests);
        rows.push(row);
    }
    let rows: Vec<Vec<String>> = rows
        .into_iter()
        .map(|r| {
            let n = r.n.to_string();
            vec![
                n,
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
