//! The postmaster as a child process: started and stopped on request, its log lines
//! forwarded to stdout as JSON, restarted after a crash, stopped smart then fast (then
//! immediate) on shutdown. It must never decide *whether* PostgreSQL should run, and never
//! touch the data directory: that is the caller's business.

use crate::pg::{Binaries, RunAs, binaries};
use serde_json::json;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to stop PostgreSQL: the supervisor is gone")]
    StopPostgres,
    #[error("failed to start PostgreSQL: the supervisor is gone")]
    StartPostgres,
}

/// How the supervisor runs the postmaster.
#[derive(Debug, Clone)]
pub struct Options {
    pub binaries: Binaries,
    pub run_as: Option<RunAs>,
    pub pgdata: PathBuf,
    /// Names the instance in forwarded log lines.
    pub instance: String,
    /// How long a smart shutdown may take before a fast one; the fast one gets as long
    /// again before an immediate shutdown.
    pub stop_timeout: Duration,
    /// Forward PostgreSQL's log lines to stdout as JSON (off: discard them).
    pub forward_logs: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    Running,
    Stopped,
    Killed,
}

/// Whether the postmaster runs, and its pid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Stopped,
    Running { pid: u32 },
}

/// Handle of the supervising task. Call [`Supervisor::stop`] for a clean shutdown: dropping
/// a handle whose postmaster still runs kills it, so that no server outlives its manager.
#[derive(Debug)]
pub struct Supervisor {
    want: watch::Sender<Want>,
    state: watch::Receiver<State>,
    restarts: Arc<AtomicU32>,
}

impl Supervisor {
    /// Starts the supervising task with PostgreSQL stopped.
    pub fn new(options: Options) -> Self {
        let (want, want_rx) = watch::channel(Want::Stopped);
        let (state_tx, state) = watch::channel(State::Stopped);
        let restarts = Arc::new(AtomicU32::new(0));
        tokio::spawn(supervise(options, want_rx, state_tx, restarts.clone()));
        Self {
            want,
            state,
            restarts,
        }
    }

    /// Starts the postmaster (if not running) and returns once it is spawned; readiness is
    /// for the caller to check over SQL.
    pub async fn start(&self) -> Result<(), Error> {
        self.want.send_replace(Want::Running);
        let mut state = self.state.clone();
        state
            .wait_for(|s| matches!(s, State::Running { .. }))
            .await
            .map_err(|_| Error::StartPostgres)?;
        Ok(())
    }

    /// Stops the postmaster: smart, then fast, then immediate; returns once it has exited.
    pub async fn stop(&self) -> Result<(), Error> {
        self.want.send_replace(Want::Stopped);
        self.wait_stopped().await
    }

    /// Simulates losing the node: SIGKILL to the postmaster and all its backends, no
    /// restart. For tests and for fencing when a clean stop is not possible.
    pub async fn kill(&self) -> Result<(), Error> {
        self.want.send_replace(Want::Killed);
        self.wait_stopped().await
    }

    async fn wait_stopped(&self) -> Result<(), Error> {
        let mut state = self.state.clone();
        state
            .wait_for(|s| *s == State::Stopped)
            .await
            .map_err(|_| Error::StopPostgres)?;
        Ok(())
    }

    /// The postmaster's state now.
    pub fn state(&self) -> State {
        *self.state.borrow()
    }

    /// The postmaster's pid, when running.
    pub fn pid(&self) -> Option<u32> {
        match self.state() {
            State::Running { pid } => Some(pid),
            State::Stopped => None,
        }
    }

    /// Whether PostgreSQL is wanted running (a crashed one is about to be restarted).
    pub fn wanted_running(&self) -> bool {
        *self.want.borrow() == Want::Running
    }

    /// How many times the postmaster was restarted after exiting on its own.
    pub fn restarts(&self) -> u32 {
        self.restarts.load(Ordering::Relaxed)
    }
}

async fn supervise(
    options: Options,
    mut want: watch::Receiver<Want>,
    state: watch::Sender<State>,
    restarts: Arc<AtomicU32>,
) {
    loop {
        // Wait until someone wants PostgreSQL running; the owner dropping means exit.
        loop {
            if *want.borrow_and_update() == Want::Running {
                break;
            }
            if want.changed().await.is_err() {
                return;
            }
        }
        let mut child = match spawn(&options) {
            Ok(child) => child,
            Err(err) => {
                tracing::error!(error = %err, "failed to spawn the postmaster");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let Some(pid) = child.id() else {
            continue;
        };
        state.send_replace(State::Running { pid });
        let crashed = loop {
            tokio::select! {
                status = child.wait() => {
                    tracing::warn!(pid, status = ?status.ok(), "the postmaster exited");
                    break true;
                }
                changed = want.changed() => {
                    let wanted = if changed.is_err() { Want::Stopped } else { *want.borrow_and_update() };
                    match wanted {
                        Want::Running => continue,
                        Want::Stopped => {
                            shut_down(&mut child, pid, options.stop_timeout).await;
                            break false;
                        }
                        Want::Killed => {
                            signal_group(pid, libc::SIGKILL);
                            let _ = child.wait().await;
                            break false;
                        }
                    }
                }
            }
        };
        crate::reaper::forget(pid);
        state.send_replace(State::Stopped);
        if crashed && *want.borrow() == Want::Running {
            restarts.fetch_add(1, Ordering::Relaxed);
            // Backends of the dead postmaster may still hold its shared memory for a moment.
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        if want.has_changed().is_err() {
            return;
        }
    }
}

fn spawn(options: &Options) -> std::io::Result<Child> {
    let mut cmd: Command = binaries::command(&options.binaries, "postgres", options.run_as);
    cmd.arg("-D")
        .arg(&options.pgdata)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        // Its own process group: a kill reaches every backend, and a terminal's Ctrl-C
        // reaches only the manager, which then shuts PostgreSQL down in order.
        .process_group(0)
        .kill_on_drop(false);
    let mut child = crate::reaper::spawn(&mut cmd)?;
    if let Some(stderr) = child.stderr.take() {
        let instance = options.instance.clone();
        let forward = options.forward_logs;
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if forward {
                    println!("{}", log_line(&instance, &line));
                }
            }
        });
    }
    Ok(child)
}

/// One PostgreSQL log line as a JSON object.
fn log_line(instance: &str, line: &str) -> String {
    let ts = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default();
    json!({"ts": ts, "logger": "postgres", "instance": instance, "msg": line}).to_string()
}

/// Smart shutdown; fast after `timeout`; immediate after as long again; SIGKILL last.
async fn shut_down(child: &mut Child, pid: u32, timeout: Duration) {
    for (signal, wait) in [
        (libc::SIGTERM, timeout),
        (libc::SIGINT, timeout),
        (libc::SIGQUIT, Duration::from_secs(5)),
    ] {
        signal_pid(pid, signal);
        if tokio::time::timeout(wait, child.wait()).await.is_ok() {
            return;
        }
        tracing::warn!(pid, signal, "PostgreSQL did not stop in time, escalating");
    }
    signal_group(pid, libc::SIGKILL);
    let _ = child.wait().await;
}

fn signal_pid(pid: u32, signal: i32) {
    if let Ok(pid) = i32::try_from(pid) {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(pid, signal) };
    }
}

fn signal_group(pid: u32, signal: i32) {
    if let Ok(pid) = i32::try_from(pid) {
        // SAFETY: as above; a negative pid names the process group the postmaster leads.
        unsafe { libc::kill(-pid, signal) };
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.want.send_replace(Want::Killed);
        // The task may not get to run again (a runtime shutting down): kill synchronously.
        if let State::Running { pid } = self.state() {
            signal_group(pid, libc::SIGKILL);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn log_lines_are_json() {
        let line = super::log_line("demo-1", "LOG:  database system is \"ready\"");
        let value: serde_json::Value = serde_json::from_str(&line).expect("json");
        assert_eq!(value["instance"], "demo-1");
        assert_eq!(value["msg"], "LOG:  database system is \"ready\"");
    }
}
