//! PgBouncer as a child process: started once its configuration is written, restarted with
//! a back-off when it exits, told to reload (SIGHUP) when its files change, stopped with
//! SIGINT (PgBouncer's safe shutdown: PAUSE, so that the transactions under way finish,
//! then SHUTDOWN), SIGTERM (an immediate shutdown) when that takes longer than the drain
//! timeout, and SIGKILL after a bound. Its log lines (stderr) go to the manager's log. It
//! never writes PgBouncer's files.

use crate::pg::RunAs;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::{Notify, watch};

/// The first delay before PgBouncer is started again after it exited; it doubles with
/// each exit in a row, up to [`RESTART_MAX`].
pub const RESTART_FIRST: Duration = Duration::from_secs(1);
/// The longest delay before a restart.
pub const RESTART_MAX: Duration = Duration::from_secs(30);
/// A PgBouncer that ran this long before exiting is restarted after [`RESTART_FIRST`]
/// again.
const STABLE_AFTER: Duration = Duration::from_secs(60);
/// How often a starting PgBouncer is looked at for its socket.
const UP_POLL: Duration = Duration::from_millis(50);

/// How PgBouncer is run.
#[derive(Debug, Clone)]
pub struct Options {
    /// The `pgbouncer` binary.
    pub program: PathBuf,
    /// Its configuration file.
    pub ini: PathBuf,
    /// Its Unix socket: removed before each start, and there again once PgBouncer has
    /// set up its signal handlers (it listens after), so a reload never reaches a
    /// PgBouncer that would die of SIGHUP.
    pub socket: PathBuf,
    /// The OS user it runs as when the manager is root (PgBouncer refuses root).
    pub run_as: Option<RunAs>,
    /// How long a stop lets the transactions under way finish (SIGINT) before SIGTERM
    /// (in session mode: the clients' sessions).
    pub drain_timeout: Duration,
    /// How long after SIGTERM it is killed.
    pub stop_timeout: Duration,
}

/// The delay before restart number `exits` in a row (at least one).
pub fn restart_delay(exits: u32) -> Duration {
    let doublings = exits.saturating_sub(1).min(16);
    RESTART_FIRST
        .saturating_mul(1 << doublings)
        .min(RESTART_MAX)
}

/// The running PgBouncer as its supervisor sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Not running (not started yet, waiting to restart, or stopped).
    Stopped,
    /// Spawned, its socket not there yet.
    Starting { pid: u32 },
    /// Listening: signals reach its handlers.
    Up { pid: u32 },
}

impl State {
    pub fn pid(self) -> Option<u32> {
        match self {
            State::Stopped => None,
            State::Starting { pid } | State::Up { pid } => Some(pid),
        }
    }
}

#[derive(Debug, Default)]
struct Counters {
    restarts: AtomicU64,
    reloads: AtomicU64,
}

/// Handle of the supervising task. [`PgBouncer::stop`] stops PgBouncer; dropping the
/// handle kills it, so that no PgBouncer outlives its manager.
#[derive(Debug)]
pub struct PgBouncer {
    stop: watch::Sender<bool>,
    reload: Arc<Notify>,
    state: watch::Receiver<State>,
    counters: Arc<Counters>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl PgBouncer {
    /// Starts PgBouncer (its files must be written) and supervises it from now on.
    pub fn start(options: Options) -> Self {
        let (stop, stop_rx) = watch::channel(false);
        let (state_tx, state) = watch::channel(State::Stopped);
        let reload = Arc::new(Notify::new());
        let counters = Arc::new(Counters::default());
        let task = tokio::spawn(supervise(
            options,
            stop_rx,
            state_tx,
            reload.clone(),
            counters.clone(),
        ));
        Self {
            stop,
            reload,
            state,
            counters,
            task: Some(task),
        }
    }

    pub fn state(&self) -> State {
        *self.state.borrow()
    }

    /// Every change of [`PgBouncer::state`].
    pub fn state_changes(&self) -> watch::Receiver<State> {
        self.state.clone()
    }

    /// Asks PgBouncer to read its files again (SIGHUP): at once when it is up, else as
    /// soon as it is (a PgBouncer being started or restarted reads the files anyway, and
    /// is told again in case it read them before they were written).
    pub fn reload(&self) {
        self.reload.notify_one();
    }

    /// How many times PgBouncer was started again after it exited.
    pub fn restarts(&self) -> u64 {
        self.counters.restarts.load(Ordering::Relaxed)
    }

    /// How many reloads were sent.
    pub fn reloads(&self) -> u64 {
        self.counters.reloads.load(Ordering::Relaxed)
    }

    /// Stops PgBouncer (SIGINT, SIGTERM after the drain timeout, SIGKILL after the stop
    /// timeout) and waits for it.
    pub async fn stop(mut self) {
        self.stop.send_replace(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        self.stop.send_replace(true);
        // The task may not get to run again (a runtime shutting down): kill synchronously.
        if self.task.is_some()
            && let Some(pid) = self.state().pid()
        {
            signal(pid, libc::SIGKILL);
        }
    }
}

async fn supervise(
    options: Options,
    mut stop: watch::Receiver<bool>,
    state: watch::Sender<State>,
    reload: Arc<Notify>,
    counters: Arc<Counters>,
) {
    // Exits in a row (reset once PgBouncer ran for STABLE_AFTER).
    let mut exits: u32 = 0;
    loop {
        if *stop.borrow() {
            return;
        }
        // A stale socket file (a killed PgBouncer's) would look like one that is up.
        let _ = std::fs::remove_file(&options.socket);
        // A reload asked before this start is moot: the new PgBouncer reads the files as
        // they are now.
        let _ = futures::FutureExt::now_or_never(reload.notified());
        let mut child = match spawn(&options) {
            Ok(child) => child,
            Err(error) => {
                exits = exits.saturating_add(1);
                let delay = restart_delay(exits);
                tracing::error!(program = %options.program.display(), %error, retry_in = ?delay, "failed to start PgBouncer");
                if wait_or_stop(&mut stop, delay).await {
                    return;
                }
                continue;
            }
        };
        let Some(pid) = child.id() else {
            continue;
        };
        tracing::info!(pid, "PgBouncer started");
        state.send_replace(State::Starting { pid });
        let started = Instant::now();
        let mut up = false;
        // A reload asked while PgBouncer was starting: sent once it is up.
        let mut pending = false;
        let stopped = loop {
            tokio::select! {
                status = child.wait() => {
                    tracing::warn!(pid, status = ?status.ok(), "PgBouncer exited");
                    break false;
                }
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        shut_down(&mut child, pid, up, &options).await;
                        break true;
                    }
                }
                () = reload.notified() => {
                    if up {
                        signal(pid, libc::SIGHUP);
                        counters.reloads.fetch_add(1, Ordering::Relaxed);
                        tracing::info!(pid, "PgBouncer told to reload its configuration");
                    } else {
                        pending = true;
                    }
                }
                () = tokio::time::sleep(UP_POLL), if !up => {
                    if options.socket.exists() {
                        up = true;
                        state.send_replace(State::Up { pid });
                        if pending {
                            pending = false;
                            signal(pid, libc::SIGHUP);
                            counters.reloads.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
        };
        crate::reaper::forget(pid);
        state.send_replace(State::Stopped);
        if stopped {
            return;
        }
        if started.elapsed() >= STABLE_AFTER {
            exits = 0;
        }
        exits = exits.saturating_add(1);
        let delay = restart_delay(exits);
        tracing::info!(retry_in = ?delay, "restarting PgBouncer");
        if wait_or_stop(&mut stop, delay).await {
            return;
        }
        counters.restarts.fetch_add(1, Ordering::Relaxed);
    }
}

/// Waits `delay`; `true` when a stop was asked meanwhile.
async fn wait_or_stop(stop: &mut watch::Receiver<bool>, delay: Duration) -> bool {
    let stopped = tokio::select! {
        () = tokio::time::sleep(delay) => false,
        _ = stop.wait_for(|s| *s) => true,
    };
    stopped || *stop.borrow()
}

fn spawn(options: &Options) -> std::io::Result<Child> {
    let mut cmd = Command::new(&options.program);
    if let Some(user) = options.run_as {
        cmd.uid(user.uid).gid(user.gid);
    }
    cmd.arg(&options.ini)
        .env("LC_ALL", "C")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        // Its own process group: a terminal's Ctrl-C reaches only the manager, which
        // then stops PgBouncer itself.
        .process_group(0)
        .kill_on_drop(false);
    let mut child = crate::reaper::spawn(&mut cmd)?;
    if let Some(stderr) = child.stderr.take() {
        let pid = child.id();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                log_line(pid, &line);
            }
        });
    }
    Ok(child)
}

/// One line of PgBouncer's log (`<date> <time> <zone> [pid] LEVEL message`) at the level
/// it names.
fn log_line(pid: Option<u32>, line: &str) {
    let level = line
        .split_once("] ")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .unwrap_or("LOG");
    match level {
        "FATAL" | "ERROR" => tracing::error!(target: "pgbouncer", pid, "{line}"),
        "WARNING" => tracing::warn!(target: "pgbouncer", pid, "{line}"),
        "DEBUG" | "NOISE" => tracing::debug!(target: "pgbouncer", pid, "{line}"),
        _ => tracing::info!(target: "pgbouncer", pid, "{line}"),
    }
}

/// A PgBouncer that is up gets SIGINT (a safe shutdown: it pauses, so that no new
/// transaction starts, waits until every server connection is released, then exits), and
/// SIGTERM (it closes every connection and exits at once) after `drain_timeout`; one still
/// starting gets SIGTERM at once. SIGKILL after `stop_timeout` more.
async fn shut_down(child: &mut Child, pid: u32, up: bool, options: &Options) {
    if up {
        tracing::info!(pid, drain_timeout = ?options.drain_timeout, "stopping PgBouncer once the transactions under way end");
        signal(pid, libc::SIGINT);
        if tokio::time::timeout(options.drain_timeout, child.wait())
            .await
            .is_ok()
        {
            return;
        }
        tracing::warn!(pid, drain_timeout = ?options.drain_timeout, "transactions still under way after the drain timeout; closing every connection");
    } else {
        tracing::info!(pid, "stopping PgBouncer");
    }
    signal(pid, libc::SIGTERM);
    if tokio::time::timeout(options.stop_timeout, child.wait())
        .await
        .is_err()
    {
        tracing::warn!(pid, timeout = ?options.stop_timeout, "PgBouncer did not stop in time; killing it");
        signal(pid, libc::SIGKILL);
        let _ = child.wait().await;
    }
}

fn signal(pid: u32, signal: i32) {
    if let Ok(pid) = i32::try_from(pid) {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(pid, signal) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_restart_delay_doubles_up_to_a_cap() {
        assert_eq!(restart_delay(0), RESTART_FIRST);
        assert_eq!(restart_delay(1), RESTART_FIRST);
        assert_eq!(restart_delay(2), Duration::from_secs(2));
        assert_eq!(restart_delay(5), Duration::from_secs(16));
        assert_eq!(restart_delay(6), RESTART_MAX);
        assert_eq!(restart_delay(u32::MAX), RESTART_MAX);
    }
}
