//! The real-node HA benchmark: `cargo bench -p pgop --bench real_ha` (root: it starts
//! real nodes; the images must be built, see docs/images.md) prints a table of the time
//! from each fault to the first write acknowledged through `-rw` by DNS name, median and
//! max over `PGOP_BENCH_RUNS` runs (default 5), and the acknowledged writes lost.
//!
//! Two figures per fault: the first write acknowledged after it (for a switchover or a
//! drain, writes may go on to the old primary until it steps down, so this can be ~0), and
//! the longest gap without an acknowledged write from the fault until the cluster is
//! Ready again (what a client felt).
//!
//! One 3-instance cluster (`synchronous: 1`, `dataDurability: required`) on three
//! workload nodes, the operator (installed by its chart), CoreDNS and the writer on a
//! fourth, infrastructure node. The writer opens a new connection for every insert (each
//! attempt bounded by 3 s, 50 ms apart). Every fault hits the current primary; after each
//! the cluster is back to Ready with three instances before the next.
//!
//! Faults: a switchover on request; the primary's container killed (SIGKILL); its Pod
//! deleted; deleted with `--grace-period=0 --force`; its node hung (every process frozen)
//! then thawed; its node cut off from the other nodes, then from everything (API server
//! included), then healed; its node drained (`kubectl drain`) then uncordoned.
//!
//! Run it on an otherwise idle machine; the figures are wall-clock times on it.

#[path = "../tests/it/real/mod.rs"]
mod real;

use kube::api::{DeleteParams, Patch, PatchParams};
use pgop_api::constants::ANNOTATION_SWITCHOVER_TO;
use pgop_testenv::real_nodes::Cut;
use real::{RealEnv, Result, Writer, start_writer};
use serde_json::json;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const NS: &str = "bench";

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    Switchover,
    ContainerKilled,
    PodDeleted,
    PodForceDeleted,
    NodeHung,
    PartitionFromNodes,
    PartitionIsolated,
    Drain,
}

impl Fault {
    const ALL: [Fault; 8] = [
        Fault::Switchover,
        Fault::ContainerKilled,
        Fault::PodDeleted,
        Fault::PodForceDeleted,
        Fault::NodeHung,
        Fault::PartitionFromNodes,
        Fault::PartitionIsolated,
        Fault::Drain,
    ];

    fn what(self) -> &'static str {
        match self {
            Fault::Switchover => "switchover on request",
            Fault::ContainerKilled => "primary container killed (SIGKILL)",
            Fault::PodDeleted => "primary Pod deleted",
            Fault::PodForceDeleted => "primary Pod force-deleted (grace 0)",
            Fault::NodeHung => "primary's node hung (frozen)",
            Fault::PartitionFromNodes => "primary's node cut off from the nodes (API reachable)",
            Fault::PartitionIsolated => "primary's node cut off from everything",
            Fault::Drain => "primary's node drained (kubectl drain)",
        }
    }

    /// The local-node figure of `cargo bench -p pgop --bench ha` for the same fault, when
    /// it has one (docs/ha.md, "Benchmark").
    fn local(self) -> &'static str {
        match self {
            Fault::Switchover => "switchover",
            Fault::ContainerKilled => "failover RTO, sync required (kill -9 of the postmaster)",
            Fault::PodDeleted => "pod deletion of the primary",
            _ => "—",
        }
    }
}

async fn primary(env: &RealEnv) -> Result<String> {
    Ok(env
        .clusters(NS)
        .get("db")
        .await?
        .status
        .and_then(|s| s.current_primary)
        .ok_or("no primary")?)
}

/// What undoes a fault once writes have resumed.
enum Undo {
    Nothing,
    Thaw(usize),
    Heal(usize),
    Uncordon(String),
}

/// Inflicts `fault` on the current primary; returns when (seconds since the epoch) and
/// what undoes it.
async fn inflict(env: &RealEnv, fault: Fault) -> Result<(f64, Undo)> {
    let old = primary(env).await?;
    let node = env.node_of(NS, &old).await?;
    let index = env.nodes.index_of(&node).ok_or("the primary's node")?;
    let pods = env.pods(NS);
    match fault {
        Fault::Switchover => {
            let standby = env
                .clusters(NS)
                .get("db")
                .await?
                .status
                .unwrap_or_default()
                .instances
                .into_iter()
                .map(|i| i.name)
                .find(|n| *n != old)
                .ok_or("no standby")?;
            let at = now();
            env.clusters(NS)
                .patch(
                    "db",
                    &PatchParams::default(),
                    &Patch::Merge(
                        json!({"metadata": {"annotations": {ANNOTATION_SWITCHOVER_TO: standby}}}),
                    ),
                )
                .await?;
            Ok((at, Undo::Nothing))
        }
        Fault::ContainerKilled => {
            let label = format!("io.kubernetes.pod.name={old}");
            // A container the kubelet is still restarting (back-off after an earlier
            // kill of the same Pod) is not listed yet: wait for it.
            let mut id = String::new();
            for _ in 0..120 {
                id = env.nodes.crictl(
                    index,
                    &["ps", "-q", "--name", "postgres", "--label", &label],
                )?;
                if !id.trim().is_empty() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            if id.trim().is_empty() {
                return Err(format!("no running container for {old} on {node}").into());
            }
            let at = now();
            env.nodes
                .crictl(index, &["stop", "--timeout", "0", id.trim()])?;
            Ok((at, Undo::Nothing))
        }
        Fault::PodDeleted | Fault::PodForceDeleted => {
            let grace = (fault == Fault::PodForceDeleted).then_some(0);
            let at = now();
            pods.delete(
                &old,
                &DeleteParams {
                    grace_period_seconds: grace,
                    ..DeleteParams::default()
                },
            )
            .await?;
            Ok((at, Undo::Nothing))
        }
        Fault::NodeHung => {
            let at = now();
            env.nodes.freeze(index)?;
            Ok((at, Undo::Thaw(index)))
        }
        Fault::PartitionFromNodes | Fault::PartitionIsolated => {
            let cut = if fault == Fault::PartitionIsolated {
                Cut::Isolated
            } else {
                Cut::FromNodes
            };
            let at = now();
            env.nodes.partition(index, cut)?;
            Ok((at, Undo::Heal(index)))
        }
        Fault::Drain => {
            let at = now();
            env.kubectl(&[
                "drain",
                &node,
                "--ignore-daemonsets",
                "--delete-emptydir-data",
                "--timeout=180s",
            ])?;
            Ok((at, Undo::Uncordon(node)))
        }
    }
}

fn undo(env: &RealEnv, undo: Undo) -> Result {
    match undo {
        Undo::Nothing => {}
        Undo::Thaw(index) => env.nodes.thaw(index)?,
        Undo::Heal(index) => env.nodes.heal(index)?,
        Undo::Uncordon(node) => {
            env.kubectl(&["uncordon", &node])?;
        }
    }
    Ok(())
}

/// The longest time without an acknowledged write from the last one before `from` until
/// `to` (seconds): what a client felt, whether or not writes went on to the old primary
/// for a while (a switchover or a drain lets them).
fn longest_gap(attempts: &[real::Attempt], from: f64, to: f64) -> f64 {
    let mut ends: Vec<f64> = attempts.iter().filter(|a| a.ok).map(|a| a.end).collect();
    ends.sort_by(f64::total_cmp);
    let before = ends.iter().copied().rfind(|e| *e <= from).unwrap_or(from);
    let mut last = before;
    let mut longest = 0.0_f64;
    for end in ends.iter().copied().filter(|e| *e > from && *e <= to) {
        longest = longest.max(end - last);
        last = end;
    }
    longest.max(to - last)
}

fn stats(v: &[f64]) -> (f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    (
        s.get(s.len() / 2).copied().unwrap_or(f64::NAN),
        s.last().copied().unwrap_or(f64::NAN),
    )
}

async fn lost(env: &RealEnv, writer: &Writer) -> Result<(usize, usize)> {
    let (acknowledged, lost) = real::acknowledged_and_lost(env, NS, writer).await?;
    Ok((acknowledged.len(), lost.len()))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> Result {
    let runs: usize = std::env::var("PGOP_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let (env, _) = real::synchronous_cluster_on_three_nodes(NS).await?;
    let writer = start_writer(&env, NS, "db", "bench").await?;

    let mut rows = Vec::new();
    for fault in Fault::ALL {
        let (mut times, mut gaps) = (Vec::new(), Vec::new());
        for run in 0..runs {
            tokio::time::sleep(Duration::from_secs(2)).await;
            let (at, then) = inflict(&env, fault).await?;
            let first = writer.first_write_after(&env.nodes, at).await;
            undo(&env, then)?;
            env.wait_ready(NS, "db", 3, Duration::from_secs(300)).await;
            let gap = longest_gap(&writer.read(&env.nodes), at, now());
            eprintln!(
                "{} run {}: first write {:.2} s after, longest gap {gap:.2} s",
                fault.what(),
                run + 1,
                first.end - at
            );
            times.push(first.end - at);
            gaps.push(gap);
        }
        rows.push((fault, times, gaps));
    }
    let (acknowledged, missing) = lost(&env, &writer).await?;

    println!();
    println!(
        "| fault (real nodes) | runs | first write after: median | max | longest write gap: median | max | local-node row of `--bench ha` |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (fault, times, gaps) in &rows {
        let (median, max) = stats(times);
        let (gap_median, gap_max) = stats(gaps);
        println!(
            "| {} | {} | {median:.2} s | {max:.2} s | {gap_median:.2} s | {gap_max:.2} s | {} |",
            fault.what(),
            times.len(),
            fault.local()
        );
    }
    println!("\nacknowledged writes lost over every fault above: {missing} of {acknowledged}");
    Ok(())
}
