//! The live fleet benchmark: `cargo bench -p pgop --bench live [-- N ...]` (default 1 50)
//! prints, for a fleet of N running clusters on the local node (real PostgreSQL, real
//! instance managers), each with a writer committing every 100 ms through `-rw`:
//! - the operator's resident memory and its CPU use (% of one core) over a steady window;
//! - PostgresCluster status writes per minute per cluster over that window, from the API
//!   server's `apiserver_request_total` (only the operator writes a cluster's status), and
//!   those of the busiest cluster, from a watch of the clusters' status;
//! - failover of one two-instance cluster of the fleet, its primary's postmaster killed
//!   (kill -9): the time until the operator decides (`status.targetPrimary` names the
//!   standby) and until a write is accepted through `-rw`, median and max over runs.
//!
//! The fleet is one two-instance cluster (the one failed over) and N - 1 single-instance
//! clusters, created five at a time. The operator is the `pgop operator` binary in its own process, so its CPU and
//! memory are its own; the local node, the writers and this program share the machine
//! with it. Run it on an otherwise idle machine; the figures are wall-clock times here.
//!
//! Environment: `PGOP_LIVE_STEADY_SECS` (default 60), the steady window;
//! `PGOP_LIVE_RUNS` (default 3), failovers per N.

#[path = "../tests/it/common/mod.rs"]
mod common;
#[path = "support/measure.rs"]
mod measure;

use common::*;
use futures::StreamExt;
use measure::{
    Operator, env_number, env_secs, pgop_command, print_table, requests_where, sizes, usage,
};
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The cluster failed over.
const WATCHED: &str = "watched";

/// How many clusters are created at once.
const WAVE: usize = 5;

fn stats(v: &[Duration]) -> String {
    let mut s = v.to_vec();
    s.sort();
    let median = s.get(s.len() / 2).copied().unwrap_or_default();
    let max = s.last().copied().unwrap_or_default();
    format!("{:.2} s ({:.2} s)", median.as_secs_f64(), max.as_secs_f64())
}

/// Copies the container logs of `cluster`'s Pods out of the node, which removes them when
/// it stops, into `<tmp>/pgop-live-logs/<pod>/`, and says where.
async fn keep_logs(env: &Env, cluster: &str) {
    use k8s_openapi::api::core::v1::Pod;
    let pods: kube::Api<Pod> = kube::Api::namespaced(env.client.clone(), env.n());
    let selector = format!("database.example.com/cluster={cluster}");
    let Ok(list) = pods
        .list(&kube::api::ListParams::default().labels(&selector))
        .await
    else {
        return;
    };
    for pod in list.items {
        let (Some(name), Some(uid)) = (pod.metadata.name, pod.metadata.uid) else {
            continue;
        };
        let to = std::env::temp_dir().join("pgop-live-logs").join(&name);
        let Ok(entries) = std::fs::read_dir(env.node.pod_dir(&uid)) else {
            continue;
        };
        let _ = std::fs::create_dir_all(&to);
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "log")
                && let Some(file) = path.file_name()
            {
                let _ = std::fs::copy(&path, to.join(file));
            }
        }
        eprintln!("{name}'s logs: {}", to.display());
    }
}

/// A writer that commits one row every 100 ms through `<cluster>-rw`, reconnecting to
/// wherever it resolves after a failure; counts its commits.
fn paced_writer(
    env: &Env,
    cluster: &str,
    password: &str,
    stop: Arc<AtomicBool>,
    commits: Arc<AtomicU64>,
) {
    let hosts = env.node.hosts_file().to_path_buf();
    let name = format!("{cluster}-rw.{}.svc", env.n());
    let password = password.to_string();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        'connect: while !stop.load(Ordering::Relaxed) {
            tick.tick().await;
            let Some(host) = pgop_testenv::node::resolve_host(&hosts, &name) else {
                continue;
            };
            let Ok(c) = connect_within(&host, &password, Duration::from_millis(500)).await else {
                continue;
            };
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                let sql = "insert into load(at) values (now())";
                match tokio::time::timeout(Duration::from_secs(5), c.execute(sql, &[])).await {
                    Ok(Ok(1)) => {
                        commits.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => continue 'connect,
                }
            }
        }
    });
}

/// PostgresCluster status writes so far, all verbs.
async fn status_writes(client: &kube::Client) -> Result<f64> {
    let by_verb = requests_where(client, |label| {
        label("resource") == "postgresclusters"
            && label("subresource") == "status"
            && matches!(label("verb").as_str(), "PATCH" | "PUT" | "APPLY")
    })
    .await?;
    Ok(by_verb.values().sum())
}

/// Counts, per cluster of `namespace`, the changes of its status that a watch sees until
/// `window` has passed (the first LIST is the baseline, not a change; so is a re-list).
fn count_status_changes(
    client: kube::Client,
    namespace: String,
    window: Duration,
) -> tokio::task::JoinHandle<BTreeMap<String, u32>> {
    use kube::ResourceExt;
    use kube::runtime::watcher;
    tokio::spawn(async move {
        let api: kube::Api<pgop_api::PostgresCluster> = kube::Api::namespaced(client, &namespace);
        let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()));
        let deadline = tokio::time::sleep(window);
        let mut deadline = std::pin::pin!(deadline);
        let mut seen: HashMap<String, Option<serde_json::Value>> = HashMap::new();
        let mut changes: BTreeMap<String, u32> = BTreeMap::new();
        loop {
            tokio::select! {
                () = &mut deadline => break,
                event = stream.next() => match event {
                    Some(Ok(watcher::Event::Apply(c) | watcher::Event::InitApply(c))) => {
                        let status = serde_json::to_value(&c.status).ok();
                        if let Some(before) = seen.insert(c.name_any(), status.clone())
                            && before != status
                        {
                            *changes.entry(c.name_any()).or_default() += 1;
                        }
                    }
                    Some(_) => {}
                    None => break,
                },
            }
        }
        changes
    })
}

/// Kills the watched cluster's primary; (until the operator names another, until a write
/// through `-rw` is accepted).
async fn failover_once(env: &Env, password: &str) -> Result<(Duration, Duration)> {
    // The primary named in the status may not take connections yet (it may have restarted
    // under the load): try until it does.
    let started = Instant::now();
    let primary = loop {
        let primary = env.current_primary(WATCHED).await?;
        match env.kill_postmaster(&primary, password).await {
            Ok(_) => break primary,
            Err(e) if started.elapsed() > TIMEOUT => {
                return Err(format!("could not kill {primary}'s postmaster: {e}").into());
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    let killed = Instant::now();
    let clusters = env.clusters();
    let decided = loop {
        let c = clusters.get(WATCHED).await?;
        let target = c.status.and_then(|s| s.target_primary);
        if target.is_some_and(|t| t != primary) {
            break killed.elapsed();
        }
        if killed.elapsed() > TIMEOUT {
            return Err(format!("no failover decided within {TIMEOUT:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    write_through_rw(
        env,
        WATCHED,
        password,
        "insert into load(at) values (now())",
    )
    .await?;
    let written = killed.elapsed();
    env.wait_ready(WATCHED, 2).await?;
    Ok((decided, written))
}

struct Row {
    n: usize,
    rss: String,
    cpu: String,
    status_writes: String,
    commits: String,
    decided: String,
    written: String,
}

async fn one(n: usize) -> Result<Row> {
    let env = start_without_operator(&format!("live-{n}")).await?;
    let (uid, gid) = pgop_testenv::node::local_user("postgres")
        .ok_or("no postgres user: apt-get install postgresql-15")?;
    let log_path = std::env::temp_dir().join(format!("pgop-live-operator-{n}.log"));
    eprintln!("operator log: {}", log_path.display());
    let log = std::fs::File::create(&log_path)?;
    let operator = Operator(
        pgop_command()
            .args([
                "operator",
                "--namespace",
                env.n(),
                "--metrics-bind-address",
                "0",
            ])
            .args([
                "--instance-uid",
                &uid.to_string(),
                "--instance-gid",
                &gid.to_string(),
            ])
            .env("KUBECONFIG", env.plane.kubeconfig())
            .env("RUST_LOG", "info")
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?,
    );
    let pid = operator.0.id();

    let mut names = vec![WATCHED.to_string()];
    names.extend((1..n).map(|i| format!("c{i}")));
    let stop = Arc::new(AtomicBool::new(false));
    let commits = Arc::new(AtomicU64::new(0));
    let mut passwords = Vec::new();
    // In waves: fifty initdbs at once on two cores would measure the machine, not the
    // operator, and the steady state is what is measured here.
    for wave in names.chunks(WAVE) {
        for name in wave {
            let replicas = if name == WATCHED { 2 } else { 1 };
            env.create(
                name,
                json!({"replicas": replicas, "storage": {"size": "1Gi"}}),
            )
            .await?;
        }
        for name in wave {
            let replicas = if name == WATCHED { 2 } else { 1 };
            if let Err(e) = env.wait_ready(name, replicas).await {
                keep_logs(&env, name).await;
                return Err(e);
            }
            let password = env.password(name).await?;
            write_through_rw(
                &env,
                name,
                &password,
                "create table load(id bigserial primary key, at timestamptz)",
            )
            .await?;
            paced_writer(&env, name, &password, stop.clone(), commits.clone());
            passwords.push(password);
        }
    }
    eprintln!("N = {n}: every cluster ready and written to");

    // The steady window, under write load.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let steady = env_secs("PGOP_LIVE_STEADY_SECS", 60);
    let changes = count_status_changes(env.client.clone(), env.n().to_string(), steady);
    let writes_a = status_writes(&env.client).await?;
    let commits_a = commits.load(Ordering::Relaxed);
    let cpu_a = usage(pid)?.cpu;
    tokio::time::sleep(steady).await;
    let settled = usage(pid)?;
    let cpu_b = settled.cpu;
    let writes_b = status_writes(&env.client).await?;
    let commits_b = commits.load(Ordering::Relaxed);
    let minutes = steady.as_secs_f64() / 60.0;
    let busiest = changes
        .await?
        .into_iter()
        .max_by_key(|(_, count)| *count)
        .map(|(name, count)| format!("{:.1} ({name})", f64::from(count) / minutes))
        .unwrap_or_else(|| "0.0".to_string());

    // Failovers of the watched cluster, the fleet still writing.
    let runs = env_number("PGOP_LIVE_RUNS", 3).max(1);
    let password = passwords.first().ok_or("no cluster")?;
    let (mut decided, mut written) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let (d, w) = failover_once(&env, password).await?;
        decided.push(d);
        written.push(w);
    }
    stop.store(true, Ordering::Relaxed);
    drop(operator);
    env.stop().await?;
    Ok(Row {
        n,
        rss: settled.memory(),
        cpu: format!("{:.1} %", 100.0 * (cpu_b - cpu_a) / steady.as_secs_f64()),
        status_writes: format!(
            "{:.2}; busiest {busiest}",
            (writes_b - writes_a) / minutes / n as f64
        ),
        commits: format!(
            "{:.0}",
            (commits_b - commits_a) as f64 / steady.as_secs_f64()
        ),
        decided: stats(&decided),
        written: stats(&written),
    })
}

#[tokio::main]
async fn main() -> Result {
    let mut rows = Vec::new();
    for n in sizes(&[1, 50]) {
        eprintln!("N = {n} ...");
        rows.push(one(n).await?);
    }
    let rows: Vec<Vec<String>> = rows
        .into_iter()
        .map(|r| {
            let n = r.n.to_string();
            vec![
                n,
                r.rss,
                r.cpu,
                r.status_writes,
                r.commits,
                r.decided,
                r.written,
            ]
        })
        .collect();
    print_table(
        &[
            "N live clusters",
            "operator RSS (peak); anonymous + file-backed",
            "operator CPU, steady",
            "status writes / min / cluster: mean; the busiest cluster",
            "commits / s, fleet",
            "failover: kill -> decided, median (max)",
            "kill -> write via -rw, median (max)",
        ],
        &rows,
    );
    Ok(())
}
