//! The orphan reaper (`pgop_instance::reaper`) against real processes.
//!
//! These tests change what belongs to the whole test process: becoming a child subreaper
//! is permanent, and the reaper `waitpid`s every zombie child of the process that pgop did
//! not register. Beside other tests they would reap those tests' children (whose waits
//! then fail) and leave zombies where those tests expect nothing. So they have this binary
//! to themselves, and run one at a time: each holds [`SERIAL`] and shuts its runtime down
//! (the reaper task and any reaping it handed to the blocking pool included) before
//! letting go of it.

#[path = "it/postgres/common.rs"]
#[allow(dead_code)]
mod common;

use common::{Node, TestResult, eventually};
use std::future::Future;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// Generous: PostgreSQL starts and restarts here, on machines as small and as loaded as
/// CI's (2 cores shared with other test binaries).
const WAIT: Duration = Duration::from_secs(60);

static SERIAL: Mutex<()> = Mutex::new(());

/// Runs `test` on its own runtime while holding [`SERIAL`]. The runtime is dropped before
/// the lock, also when the test panics (locals drop in reverse order); dropping it aborts
/// its tasks and waits for its blocking threads, so no reaping outlives the test.
fn serially<F>(test: impl FnOnce() -> F) -> TestResult
where
    F: Future<Output = TestResult>,
{
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let result = runtime.block_on(test());
    drop(runtime);
    result
}

/// Whether `pid` is a zombie (exited, not yet waited for).
fn zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            // "pid (comm) S ...": comm may hold spaces and parentheses.
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// As PID 1 (here: a child subreaper) the manager inherits the backends of a postmaster
/// killed with SIGKILL; they are reaped instead of staying zombies, and PostgreSQL restarts.
#[test]
fn orphaned_backends_of_a_killed_postmaster_are_reaped() -> TestResult {
    serially(|| async {
        pgop_instance::reaper::become_subreaper()?;
        let reaper = tokio::spawn(pgop_instance::reaper::run(Duration::from_millis(100)));
        let node = Node::new("reap-1");
        node.instance.bootstrap_primary().await?;
        let sessions = [node.app().await?, node.app().await?, node.app().await?];
        let backends: Vec<i32> = {
            let mut pids = Vec::new();
            for s in &sessions {
                pids.push(s.query_one("SELECT pg_backend_pid()", &[]).await?.get(0));
            }
            pids
        };
        let postmaster = node.instance.pid().expect("running") as i32;
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(postmaster, libc::SIGKILL) };
        eventually(
            "the orphaned backends gone, zombies included",
            WAIT,
            || async {
                // SAFETY: signal 0 only checks that the process exists (a zombie still does).
                backends
                    .iter()
                    .all(|pid| unsafe { libc::kill(*pid, 0) } != 0)
                    .then_some(())
            },
        )
        .await;
        eventually("PostgreSQL restarted", WAIT, || async {
            node.instance.endpoint().connect().await.ok().map(|_| ())
        })
        .await;
        reaper.abort();
        Ok(())
    })
}

/// The programs pgop-backup runs (pg_basebackup, pg_dump, ...) are registered with the
/// reaper like the manager's own: once exited and not yet waited for, such a child is a
/// zombie the reaper leaves alone, so tokio's wait still gets its status. An unregistered
/// child in the same state is reaped, and its wait fails: the race this closes.
#[test]
fn programs_run_by_pgop_backup_are_never_reaped_under_tokio() -> TestResult {
    serially(|| async {
        pgop_instance::reaper::register_backup_programs();
        let (mut child, registration) =
            pgop_backup::process::spawn(&mut tokio::process::Command::new("true"))?;
        let pid = child.id().ok_or("no pid")?;
        eventually("the registered child a zombie", WAIT, || async {
            zombie(pid).then_some(())
        })
        .await;
        pgop_instance::reaper::reap_orphans();
        assert!(zombie(pid), "the reaper took a registered child");
        assert!(child.wait().await?.success());
        drop(registration);

        let mut plain = tokio::process::Command::new("true").spawn()?;
        let pid = plain.id().ok_or("no pid")?;
        eventually("the unregistered child a zombie", WAIT, || async {
            zombie(pid).then_some(())
        })
        .await;
        pgop_instance::reaper::reap_orphans();
        assert!(!zombie(pid), "an unregistered zombie is reaped");
        assert!(plain.wait().await.is_err(), "and tokio's wait fails");
        Ok(())
    })
}
