//! The postmaster as a child process: started and stopped on request, its log lines
//! forwarded to stdout as JSON, restarted after a crash (unless told to hold a crashed
//! postmaster down: a crashed primary waits for its manager), stopped smart then fast (then
//! immediate) on shutdown, or fast or immediate at once when asked. It must never decide *whether* PostgreSQL should run, and never
//! touch the data directory: that is the caller's business.

use crate::pg::{Binaries, RunAs, binaries};
use serde_json::json;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
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
    Stopped(Stop),
    Killed,
}

/// How a stop begins: PostgreSQL's smart, fast or immediate shutdown. Each escalates to the
/// next one after the stop timeout (immediate: after 5 s, to SIGKILL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// SIGTERM: waits for the sessions to end.
    Smart,
    /// SIGINT: ends the sessions, checkpoints; walsenders ship all WAL before exiting.
    Fast,
    /// SIGQUIT: at once, no checkpoint (crash recovery at the next start).
    Immediate,
}

/// Whether the postmaster runs, and its pid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Stopped,
    Running {
        pid: u32,
    },
    /// The postmaster exited on its own and, as told ([`Supervisor::set_restart_on_crash`]),
    /// was not restarted; a start or stop request ends this state.
    Crashed {
        at: Instant,
    },
}

/// Handle of the supervising task. Call [`Supervisor::stop`] for a clean shutdown: dropping
/// a handle whose postmaster still runs kills it, so that no server outlives its manager.
#[derive(Debug)]
pub struct Supervisor {
    want: watch::Sender<Want>,
    state: watch::Receiver<State>,
    restarts: Arc<AtomicU32>,
    restart_on_crash: Arc<AtomicBool>,
    tail: Tail,
}

/// What the supervisor keeps of the most recently spawned postmaster's log.
type Tail = Arc<std::sync::Mutex<Logged>>;

#[derive(Debug, Default)]
struct Logged {
    /// Its last lines.
    lines: std::collections::VecDeque<String>,
    /// Its WAL receiver was told that the upstream no longer has a WAL segment it needs.
    upstream_wal_gone: bool,
}

/// What a standby's WAL receiver logs when its upstream has removed a segment it asks for
/// (`requested WAL segment ... has already been removed`).
fn says_upstream_wal_gone(line: &str) -> bool {
    line.contains("requested WAL segment") && line.contains("has already been removed")
}

/// How many of the last log lines are kept.
const TAIL_LINES: usize = 50;

impl Supervisor {
    /// Starts the supervising task with PostgreSQL stopped.
    pub fn new(options: Options) -> Self {
        let (want, want_rx) = watch::channel(Want::Stopped(Stop::Smart));
        let (state_tx, state) = watch::channel(State::Stopped);
        let restarts = Arc::new(AtomicU32::new(0));
        let restart_on_crash = Arc::new(AtomicBool::new(true));
        let tail = Tail::default();
        tokio::spawn(supervise(
            options,
            want_rx,
            state_tx,
            restarts.clone(),
            restart_on_crash.clone(),
            tail.clone(),
        ));
        Self {
            want,
            state,
            restarts,
            restart_on_crash,
            tail,
        }
    }

    /// PostgreSQL's last words: the last error lines (`FATAL`, `PANIC`, `ERROR`, with the
    /// `DETAIL`/`HINT` lines that follow them) of the most recently spawned postmaster, or
    /// its last lines when it wrote no error; `None` before any start.
    pub fn last_error_lines(&self) -> Option<String> {
        let tail = self
            .tail
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        last_error_lines(tail.lines.iter().map(String::as_str))
    }

    /// Whether the most recently spawned postmaster, a standby, was told by its upstream
    /// that a WAL segment it needs has been removed there: without it the standby can
    /// never become consistent (standbys fetch WAL by streaming only), so it waits forever.
    pub fn upstream_wal_gone(&self) -> bool {
        self.tail
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .upstream_wal_gone
    }

    /// Forgets what [`Supervisor::upstream_wal_gone`] saw: the standby streams from another
    /// upstream now, which may have that WAL.
    pub fn forget_upstream_wal_gone(&self) {
        self.tail
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .upstream_wal_gone = false;
    }

    /// Whether a postmaster that exits on its own is restarted (the default) or left
    /// stopped in [`State::Crashed`] until the next start or stop request.
    pub fn set_restart_on_crash(&self, restart: bool) {
        self.restart_on_crash.store(restart, Ordering::SeqCst);
    }

    /// Follows the postmaster's state (every change wakes the receiver).
    pub fn subscribe(&self) -> watch::Receiver<State> {
        self.state.clone()
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
        self.stop_with(Stop::Smart).await
    }

    /// Stops the postmaster beginning with `how`; returns once it has exited. A stop already
    /// under way goes on as it began.
    pub async fn stop_with(&self, how: Stop) -> Result<(), Error> {
        self.want.send_replace(Want::Stopped(how));
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
            .wait_for(|s| !matches!(s, State::Running { .. }))
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
            State::Stopped | State::Crashed { .. } => None,
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
    restart_on_crash: Arc<AtomicBool>,
    tail: Tail,
) {
    loop {
        // Wait until someone wants PostgreSQL running; the owner dropping means exit.
        loop {
            if *want.borrow_and_update() == Want::Running {
                break;
            }
            // A stop request acknowledges a crash.
            state.send_if_modified(|s| {
                let crashed = matches!(s, State::Crashed { .. });
                if crashed {
                    *s = State::Stopped;
                }
                crashed
            });
            if want.changed().await.is_err() {
                return;
            }
        }
        let mut child = match spawn(&options, &tail) {
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
                    let wanted = if changed.is_err() { Want::Stopped(Stop::Smart) } else { *want.borrow_and_update() };
                    match wanted {
                        Want::Running => continue,
                        Want::Stopped(how) => {
                            shut_down(&mut child, pid, how, options.stop_timeout, &mut want).await;
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
        if crashed && *want.borrow() == Want::Running {
            if !restart_on_crash.load(Ordering::SeqCst) {
                // Left down until the owner decides: a start request restarts it, a stop
                // request acknowledges the crash.
                state.send_replace(State::Crashed { at: Instant::now() });
                if want.changed().await.is_err() {
                    return;
                }
                continue;
            }
            state.send_replace(State::Stopped);
            restarts.fetch_add(1, Ordering::Relaxed);
            // Backends of the dead postmaster may still hold its shared memory for a moment.
            tokio::time::sleep(Duration::from_millis(500)).await;
        } else {
            state.send_replace(State::Stopped);
        }
        if want.has_changed().is_err() {
            return;
        }
    }
}

fn spawn(options: &Options, tail: &Tail) -> std::io::Result<Child> {
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
    {
        let mut logged = tail
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        logged.lines.clear();
        logged.upstream_wal_gone = false;
    }
    if let Some(stderr) = child.stderr.take() {
        let instance = options.instance.clone();
        let forward = options.forward_logs;
        let tail = tail.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                {
                    let mut logged = tail
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    if logged.lines.len() == TAIL_LINES {
                        logged.lines.pop_front();
                    }
                    logged.lines.push_back(line.clone());
                    if says_upstream_wal_gone(&line) {
                        logged.upstream_wal_gone = true;
                    }
                }
                if forward {
                    println!("{}", log_line(&instance, &line));
                }
            }
        });
    }
    Ok(child)
}

/// The error lines among `lines` (with their `DETAIL`/`HINT`/`CONTEXT` lines), the last 6;
/// else the last 3 lines.
fn last_error_lines<'a>(lines: impl Iterator<Item = &'a str>) -> Option<String> {
    let all: Vec<&str> = lines.collect();
    if all.is_empty() {
        return None;
    }
    // Clients turned away while the server starts or stops are no reason it stopped.
    let noise = [
        "the database system is starting up",
        "the database system is shutting down",
        "the database system is not yet accepting connections",
        "terminating connection due to administrator command",
    ];
    let is_error = |l: &str| {
        ["FATAL:", "PANIC:", "ERROR:"].iter().any(|k| l.contains(k))
            && !noise.iter().any(|n| l.contains(n))
    };
    let is_detail = |l: &str| {
        ["DETAIL:", "HINT:", "CONTEXT:"]
            .iter()
            .any(|k| l.contains(k))
    };
    let mut picked = Vec::new();
    let mut in_error = false;
    for line in &all {
        if is_error(line) {
            in_error = true;
            picked.push(*line);
        } else if in_error && is_detail(line) {
            picked.push(*line);
        } else {
            in_error = false;
        }
    }
    let chosen: Vec<&str> = if picked.is_empty() {
        all.iter().rev().take(3).rev().copied().collect()
    } else {
        picked.iter().rev().take(6).rev().copied().collect()
    };
    Some(chosen.join("\n"))
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
/// `how` skips the first steps, and a stronger stop requested meanwhile (a fence during a
/// smart shutdown) escalates at once.
async fn shut_down(
    child: &mut Child,
    pid: u32,
    how: Stop,
    timeout: Duration,
    want: &mut watch::Receiver<Want>,
) {
    let steps = [
        (libc::SIGTERM, timeout),
        (libc::SIGINT, timeout),
        (libc::SIGQUIT, Duration::from_secs(5)),
    ];
    let level = |how: Stop| match how {
        Stop::Smart => 0,
        Stop::Fast => 1,
        Stop::Immediate => 2,
    };
    let mut step = level(how);
    let mut listening = true;
    while let Some(&(signal, wait)) = steps.get(step) {
        signal_pid(pid, signal);
        let deadline = tokio::time::sleep(wait);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                _ = child.wait() => return,
                () = &mut deadline => {
                    tracing::warn!(pid, signal, "PostgreSQL did not stop in time, escalating");
                    step += 1;
                    break;
                }
                changed = want.changed(), if listening => {
                    if changed.is_err() {
                        listening = false;
                        continue;
                    }
                    let stronger = match *want.borrow_and_update() {
                        Want::Stopped(how) => level(how),
                        Want::Killed => steps.len(),
                        Want::Running => 0,
                    };
                    if stronger > step {
                        step = stronger;
                        break;
                    }
                }
            }
        }
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
    fn the_wal_receivers_word_for_a_removed_segment_is_recognised() {
        assert!(super::says_upstream_wal_gone(
            "2026-12-05 00:34:00.393 GMT [19657] FATAL:  could not receive data from WAL stream: \
             ERROR:  requested WAL segment 000000010000000000000003 has already been removed"
        ));
        assert!(!super::says_upstream_wal_gone(
            "2026-12-05 00:34:00.396 GMT [4669] LOG:  waiting for WAL to become available at 0/3000040"
        ));
        assert!(!super::says_upstream_wal_gone(
            "FATAL:  the database system is starting up"
        ));
    }

    #[test]
    fn the_last_error_lines_are_postgresqls_last_words() {
        let log = [
            "LOG:  starting PostgreSQL 15",
            "FATAL:  could not access file \"nolib\": No such file or directory",
            "LOG:  database system is shut down",
        ];
        assert_eq!(
            super::last_error_lines(log.into_iter()).as_deref(),
            Some("FATAL:  could not access file \"nolib\": No such file or directory")
        );
        let log = ["LOG:  a", "LOG:  b", "LOG:  c", "LOG:  d"];
        assert_eq!(
            super::last_error_lines(log.into_iter()).as_deref(),
            Some("LOG:  b\nLOG:  c\nLOG:  d")
        );
        let log = [
            "FATAL:  x",
            "DETAIL:  y",
            "LOG:  z",
            "FATAL:  the database system is starting up",
        ];
        assert_eq!(
            super::last_error_lines(log.into_iter()).as_deref(),
            Some("FATAL:  x\nDETAIL:  y")
        );
        assert_eq!(super::last_error_lines(std::iter::empty()), None);
    }

    #[test]
    fn log_lines_are_json() {
        let line = super::log_line("demo-1", "LOG:  database system is \"ready\"");
        let value: serde_json::Value = serde_json::from_str(&line).expect("json");
        assert_eq!(value["instance"], "demo-1");
        assert_eq!(value["msg"], "LOG:  database system is \"ready\"");
    }
}
