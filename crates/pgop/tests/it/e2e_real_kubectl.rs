//! `kubectl pgop logs` and `kubectl pgop psql` on real nodes, where kubelets serve Pods'
//! logs and port forwarding (the local node has neither): the plugin (this build, as a
//! `kubectl-pgop` symlink) with testenv's kubectl on the PATH and this machine's psql,
//! against a two-instance cluster installed by the chart. `logs` merges both Pods' lines
//! in time order, as text and as JSON; `psql` logs in as the application owner through
//! `kubectl port-forward` with TLS verified, on the primary, with `--replica` on the
//! standby and with `--pooler rw` through a pooler Pod (its manager relays the Pod's
//! loopback to PgBouncer), and no password is on any command line. Needs root.

use crate::real;

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use real::{RealEnv, Result, eventually};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Runs `kubectl-pgop args` with the environment's kubeconfig and `path` first on the
/// PATH; exit status, stdout, stderr.
fn plugin(env: &RealEnv, path: &Path, args: &[&str]) -> Result<(bool, String, String)> {
    let bin = path.join("kubectl-pgop");
    let search = format!(
        "{}:{}",
        path.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = std::process::Command::new(bin)
        .args(args)
        .env("KUBECONFIG", env.plane.kubeconfig())
        .env("PATH", search)
        .env_remove("RUST_LOG")
        .env_remove("PGPASSWORD")
        .output()?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubectl_pgop_logs_and_psql_on_real_nodes() -> Result {
    if !Path::new("/usr/bin/psql").exists() {
        return Err("psql is missing: run hack/install-packages.sh test".into());
    }
    let env = RealEnv::start(2, false).await?;
    env.install_operator(&[]).await?;
    let ns = "plugin";
    env.restricted_namespace(ns).await?;
    env.create_cluster(
        ns,
        "db",
        json!({"replicas": 2, "storage": {"size": "1Gi"}, "poolers": [{"name": "rw"}]}),
    )
    .await?;
    env.wait_ready(ns, "db", 2, Duration::from_secs(300)).await;

    // The plugin and testenv's kubectl, side by side on the PATH.
    let dir: PathBuf = env.plane.dir().join("kubectl-plugin");
    std::fs::create_dir_all(&dir)?;
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_pgop"), dir.join("kubectl-pgop"))?;
    let kubectl = pgop_testenv::binaries::locate(pgop_testenv::binaries::Binary::Kubectl)
        .map_err(|e| format!("{e}: run hack/install-testenv.sh"))?;
    std::os::unix::fs::symlink(&kubectl, dir.join("kubectl"))?;

    // logs: both Pods, in time order.
    let (ok, out, err) = plugin(&env, &dir, &["logs", "db", "-n", ns])?;
    assert!(ok, "logs failed: {err}");
    let rows: Vec<&str> = out.lines().collect();
    for pod in ["db-1", "db-2"] {
        assert!(
            rows.iter()
                .any(|r| r.split_whitespace().nth(1) == Some(pod)),
            "no line of {pod} in:\n{out}"
        );
    }
    assert!(
        rows.iter()
            .any(|r| r.contains(" INFO ") && r.contains("holding the primary Lease")),
        "the primary's manager line, unpacked:\n{out}"
    );
    let times: Vec<jiff::Timestamp> = rows
        .iter()
        .filter_map(|r| r.split_whitespace().next()?.parse().ok())
        .collect();
    assert_eq!(
        times.len(),
        rows.len(),
        "every row starts with its time:\n{out}"
    );
    assert!(
        times.windows(2).all(|w| w[0] <= w[1]),
        "in time order:\n{out}"
    );
    let (ok, out, err) = plugin(
        &env,
        &dir,
        &["logs", "db", "-n", ns, "-o", "json", "--tail", "5"],
    )?;
    assert!(ok, "logs -o json failed: {err}");
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(serde_json::from_str)
        .collect::<std::result::Result<_, _>>()?;
    assert_eq!(lines.len(), 10, "five lines of each Pod:\n{out}");
    assert!(
        lines
            .iter()
            .all(|l| l["record"].is_object() && l["time"].is_string())
    );

    // psql: the application owner, TLS, the primary; then a standby.
    let query = "select current_user, pg_is_in_recovery(), ssl from pg_stat_ssl where pid = pg_backend_pid()";
    let (ok, out, err) = plugin(&env, &dir, &["psql", "db", "-n", ns, "--", "-qAtc", query])?;
    assert!(ok, "psql failed: {err}");
    assert_eq!(out.trim(), "app|f|t", "{err}");
    let (ok, out, err) = plugin(
        &env,
        &dir,
        &["psql", "db", "-n", ns, "--replica", "--", "-qAtc", query],
    )?;
    assert!(ok, "psql --replica failed: {err}");
    assert_eq!(out.trim(), "app|t|t", "{err}");
    // psql through a ready Pod of the pooler: PostgreSQL sees the pooler Pod's address.
    let pods = env.pods(ns);
    let pooler_ips: Vec<String> =
        eventually("a ready pooler Pod", Duration::from_secs(180), || async {
            let list = pods
                .list(&ListParams::default().labels("database.example.com/pooler=db-pooler-rw"))
                .await
                .map_err(|e| e.to_string())?;
            let ips: Vec<String> = list
                .items
                .iter()
                .filter(|p: &&Pod| pgop_operator::cluster::pods::pod_ready(p))
                .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
                .collect();
            if ips.is_empty() {
                Err(format!("{} pooler Pods, none ready", list.items.len()))
            } else {
                Ok(ips)
            }
        })
        .await;
    let through_pooler = "select current_user, host(inet_client_addr())";
    let (ok, out, err) = plugin(
        &env,
        &dir,
        &[
            "psql",
            "db",
            "-n",
            ns,
            "--pooler",
            "rw",
            "--",
            "-qAtc",
            through_pooler,
        ],
    )?;
    assert!(ok, "psql --pooler rw failed: {err}");
    let (user, from) = out.trim().split_once('|').ok_or(format!("{out} {err}"))?;
    assert_eq!(user, "app");
    assert!(
        pooler_ips.iter().any(|ip| ip == from),
        "PostgreSQL saw {from}, not a pooler Pod ({pooler_ips:?})"
    );
    let (ok, _, err) = plugin(
        &env,
        &dir,
        &[
            "psql", "db", "-n", ns, "--pooler", "nope", "--", "-c", "select 1",
        ],
    )?;
    assert!(
        !ok && err.contains("--pooler \"nope\"") && err.contains("spec.poolers: rw"),
        "{err}"
    );
    // psql's failure is the plugin's exit status.
    let (ok, _, err) = plugin(
        &env,
        &dir,
        &["psql", "db", "-n", ns, "--", "-c", "select nonsense"],
    )?;
    assert!(!ok && err.contains("nonsense"), "{err}");
    Ok(())
}
