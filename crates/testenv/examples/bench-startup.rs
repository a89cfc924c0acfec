//! Start-up time and memory of the testenv control plane.
//!
//!     cargo run --release -p pgop-testenv --example bench-startup [RUNS]
//!
//! Prints one table: for "etcd + kube-apiserver" and for the full control plane, the
//! time from spawn to ready (min / median / max over RUNS, default 5) and the resident
//! memory of each component right after start-up and after 10 s idle (median).

use pgop_testenv::{ControlPlane, Options};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

/// CPU seconds (user + system) the process has used so far.
fn cpu_seconds(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            // The fields after the command name (which may hold spaces), in parentheses.
            let rest = s.rsplit_once(") ")?.1;
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let utime: f64 = fields.get(11)?.parse().ok()?;
            let stime: f64 = fields.get(12)?.parse().ok()?;
            Some((utime + stime) / 100.0)
        })
        .unwrap_or(f64::NAN)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let runs: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(5);
    let setups = [
        ("etcd + kube-apiserver", Options::default()),
        (
            "full (+ controller-manager, scheduler)",
            Options::default()
                .with_controller_manager()
                .with_scheduler(),
        ),
    ];
    println!(
        "testenv start-up, {runs} runs each (Kubernetes v{}, etcd v{})",
        pgop_testenv::binaries::kubernetes_version(),
        pgop_testenv::binaries::etcd_version()
    );
    println!();
    println!(
        "| setup | ready in (min / median / max) | component | RSS at ready | RSS after 10 s idle | CPU to ready | CPU after 10 s idle |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (label, options) in setups {
        let mut times = Vec::new();
        let mut at_ready: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        let mut idle: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        let mut cpu_ready: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        let mut cpu_idle: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        for _ in 0..runs {
            let t = Instant::now();
            let plane = ControlPlane::start(options.clone()).await?;
            times.push(t.elapsed().as_secs_f64());
            for (name, pid) in plane.components() {
                at_ready
                    .entry(name.to_string())
                    .or_default()
                    .push(rss_mib(pid));
                cpu_ready
                    .entry(name.to_string())
                    .or_default()
                    .push(cpu_seconds(pid));
            }
            tokio::time::sleep(Duration::from_secs(10)).await;
            for (name, pid) in plane.components() {
                idle.entry(name.to_string()).or_default().push(rss_mib(pid));
                cpu_idle
                    .entry(name.to_string())
                    .or_default()
                    .push(cpu_seconds(pid));
            }
            plane.stop();
        }
        let min = times.iter().copied().fold(f64::INFINITY, f64::min);
        let max = times.iter().copied().fold(0.0, f64::max);
        let med = median(&mut times);
        let mut first = true;
        let mut total_ready = 0.0;
        let mut total_idle = 0.0;
        let (mut total_cpu_ready, mut total_cpu_idle) = (0.0, 0.0);
        for (name, mut v) in at_ready {
            let r = median(&mut v);
            let i = idle.get_mut(&name).map(|v| median(v)).unwrap_or(f64::NAN);
            let cr = cpu_ready
                .get_mut(&name)
                .map(|v| median(v))
                .unwrap_or(f64::NAN);
            let ci = cpu_idle
                .get_mut(&name)
                .map(|v| median(v))
                .unwrap_or(f64::NAN);
            total_ready += r;
            total_idle += i;
            total_cpu_ready += cr;
            total_cpu_idle += ci;
            let time_cell = if first {
                format!("{min:.2} s / {med:.2} s / {max:.2} s")
            } else {
                String::new()
            };
            let label_cell = if first { label } else { "" };
            println!(
                "| {label_cell} | {time_cell} | {name} | {r:.0} MiB | {i:.0} MiB | {cr:.2} s | {ci:.2} s |"
            );
            first = false;
        }
        println!(
            "| | | **total** | **{total_ready:.0} MiB** | **{total_idle:.0} MiB** | **{total_cpu_ready:.2} s** | **{total_cpu_idle:.2} s** |"
        );
    }
    Ok(())
}
