//! What the benchmarks measure of a process and of the API server, and how they print a
//! duration: shared by the benches (`#[path]`-included, so not a bench of its own).
#![allow(dead_code)] // each bench uses its own subset

use std::collections::BTreeMap;
use std::time::Duration;

type Result<T = (), E = Box<dyn std::error::Error + Send + Sync>> = std::result::Result<T, E>;

/// A duration in seconds with two decimals, as the benches' tables print it.
pub fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// The whole number in environment variable `name`, or `default`.
pub fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The fleet sizes given on the command line (`cargo bench` adds `--bench`, which is not a
/// number), or `default`.
pub fn sizes(default: &[usize]) -> Vec<usize> {
    let given: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .filter(|&n| n > 0)
        .collect();
    if given.is_empty() {
        default.to_vec()
    } else {
        given
    }
}

/// [`env_number`] seconds.
pub fn env_secs(name: &str, default: u64) -> Duration {
    Duration::from_secs(env_number(name, default))
}

/// Clock ticks per second of /proc/<pid>/stat (USER_HZ, 100 on Linux).
pub const TICKS: f64 = 100.0;

/// What `/proc/<pid>` says of a process's memory (MiB) and CPU.
#[derive(Clone, Copy, Debug)]
pub struct Usage {
    /// Resident memory (`VmRSS`).
    pub rss: f64,
    /// Peak resident memory (`VmHWM`).
    pub peak: f64,
    /// Of the resident memory, the anonymous part (`RssAnon`: heap, stacks, relocated
    /// data): what the process itself holds.
    pub anon: f64,
    /// Of the resident memory, the file-backed part (`RssFile`: mostly the pages of the
    /// binary's code that have run, shared with the page cache).
    pub file: f64,
    /// CPU seconds, user and system.
    pub cpu: f64,
}

impl Usage {
    /// "52 MiB (53); 31 + 21": settled (peak); anonymous + file-backed.
    pub fn memory(&self) -> String {
        format!(
            "{:.0} MiB ({:.0}); {:.0} + {:.0}",
            self.rss, self.peak, self.anon, self.file
        )
    }
}

/// The memory and CPU of `pid`.
pub fn usage(pid: u32) -> Result<Usage> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let mib = |key: &str| -> f64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1024.0
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command (which may hold spaces) start after the last ')'.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of stat; 12 and 13 after the command.
    Ok(Usage {
        rss: mib("VmRSS:"),
        peak: mib("VmHWM:"),
        anon: mib("RssAnon:"),
        file: mib("RssFile:"),
        cpu: (ticks(11) + ticks(12)) / TICKS,
    })
}

/// `apiserver_request_total`, summed by verb, for resource requests (not /metrics).
pub async fn requests_by_verb(client: &kube::Client) -> Result<BTreeMap<String, f64>> {
    requests_where(client, |_| true).await
}

/// `apiserver_request_total`, summed by verb, for the resource requests whose labels
/// (`resource`, `subresource`, `verb`, ...) `wanted` accepts.
pub async fn requests_where(
    client: &kube::Client,
    wanted: impl Fn(&dyn Fn(&str) -> String) -> bool,
) -> Result<BTreeMap<String, f64>> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(request).await?;
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |key: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{key}=\"")))
                .map(|v| v.trim_end_matches('"').to_string())
                .unwrap_or_default()
        };
        if label("resource").is_empty() || !wanted(&label) {
            continue;
        }
        let value: f64 = value.trim().parse().unwrap_or(0.0);
        *out.entry(label("verb")).or_insert(0.0) += value;
    }
    Ok(out)
}

/// A command that runs `pgop` (this build's binary), under the wrapper in
/// `PGOP_BENCH_WRAP` when it is set (split at whitespace; a profiler, say:
/// `PGOP_BENCH_WRAP="heaptrack -o /tmp/operator"`). The memory and CPU figures are then
/// the wrapper's own, unless it replaces itself with `pgop` (exec).
pub fn pgop_command() -> std::process::Command {
    use std::os::unix::process::CommandExt;
    let pgop = env!("CARGO_BIN_EXE_pgop");
    let wrap = std::env::var("PGOP_BENCH_WRAP").unwrap_or_default();
    let mut words = wrap.split_whitespace();
    let mut command = match words.next() {
        Some(wrapper) => {
            let mut command = std::process::Command::new(wrapper);
            command.args(words).arg(pgop);
            command
        }
        None => std::process::Command::new(pgop),
    };
    // Its own process group, which `Operator` kills whole.
    command.process_group(0);
    command
}

/// Prints a Markdown table: `header`'s columns, then one line per row.
pub fn print_table(header: &[&str], rows: &[Vec<String>]) {
    println!();
    println!("| {} |", header.join(" | "));
    println!("|{}", "---|".repeat(header.len()));
    for row in rows {
        println!("| {} |", row.join(" | "));
    }
}

/// Kills the operator when dropped.
/// The operator's process, started by [`pgop_command`] as the leader of its own process
/// group: dropping it kills the group, so an operator under a wrapper (a profiler) does
/// not outlive the benchmark.
pub struct Operator(pub std::process::Child);

impl Drop for Operator {
    fn drop(&mut self) {
        if let Ok(pid) = libc::pid_t::try_from(self.0.id()) {
            // SAFETY: kill(2) on the process group this benchmark started.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
