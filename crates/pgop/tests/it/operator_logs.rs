//! `pgop operator --log-format json` against a real API server (testenv, no node): every
//! line on stderr is one JSON object, and the lines of a cluster's reconcile (here the
//! `Created` Event's) carry its cluster, namespace and trace id in the `reconcile` span.

use crate::common;

use kube::Api;
use kube::api::PostParams;
use pgop_api::PostgresCluster;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

type Result<T = (), E = Box<dyn std::error::Error>> = std::result::Result<T, E>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_name_the_cluster_and_namespace_on_every_reconcile_line() -> Result {
    let plane = pgop_testenv::shared().await?;
    let client = plane.client()?;
    common::install_crds(&client).await?;
    let ns = pgop_testenv::TestNamespace::create(plane.config(), "logs").await?;
    let mut child = Command::new(env!("CARGO_BIN_EXE_pgop"))
        .args([
            "operator",
            "--log-format",
            "json",
            "--leader-elect=false",
            "--metrics-bind-address",
            "0",
            "--namespace",
            ns.name(),
        ])
        .env("KUBECONFIG", plane.kubeconfig())
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let stderr = child.stderr.take().ok_or("no stderr")?;
    let (lines, seen) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr)
            .lines()
            .map_while(std::io::Result::ok)
        {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let clusters: Api<PostgresCluster> = Api::namespaced(client.clone(), ns.name());
    let cluster: PostgresCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "database.example.com/v1alpha1", "kind": "PostgresCluster",
        "metadata": {"name": "logged"},
        "spec": {"replicas": 1, "storage": {"size": "1Gi"}},
    }))?;
    clusters.create(&PostParams::default(), &cluster).await?;

    let deadline = Instant::now() + Duration::from_secs(60);
    let mut all = Vec::new();
    let mut created = None;
    while created.is_none() && Instant::now() < deadline {
        let Ok(line) = seen.recv_timeout(Duration::from_millis(200)) else {
            continue;
        };
        let value: serde_json::Value =
            serde_json::from_str(&line).map_err(|e| format!("not a JSON line ({e}): {line}"))?;
        if value["fields"]["reason"] == "Created" {
            created = Some(value.clone());
        }
        all.push(value);
    }
    let _ = child.kill();
    let _ = child.wait();
    let created = created.ok_or_else(|| format!("no Created line in {all:#?}"))?;
    assert_eq!(created["level"], "INFO", "{created}");
    assert_eq!(created["span"]["name"], "reconcile", "{created}");
    assert_eq!(created["span"]["cluster"], "logged", "{created}");
    assert_eq!(created["span"]["namespace"], ns.name(), "{created}");
    // The pass's trace (pgop_telemetry): 32 hex digits, whether or not traces are exported.
    let trace = created["span"]["trace_id"].as_str().unwrap_or_default();
    assert!(
        trace.len() == 32
            && trace.bytes().all(|b| b.is_ascii_hexdigit())
            && trace != "0".repeat(32),
        "{created}"
    );
    assert!(
        created["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("logged-1")),
        "{created}"
    );
    // The operator's own start-up lines are JSON too.
    assert!(
        all.iter()
            .any(|v| v["fields"]["message"] == "starting pgop operator"),
        "{all:#?}"
    );
    ns.delete().await?;
    Ok(())
}
