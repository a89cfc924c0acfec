//! Reaping orphans. As PID 1 of a pod the manager inherits every orphaned process — the
//! backends of a postmaster killed with SIGKILL (the OOM killer), the children of a killed
//! pg_basebackup — and must collect their exit status, or they stay zombies. It must never
//! reap a child that tokio waits for: every child pgop spawns is registered here, and
//! registration and reaping exclude each other.

use std::collections::HashSet;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use tokio::process::{Child, Command};

/// Children pgop spawned and tokio will reap.
static KNOWN: Mutex<Option<HashSet<u32>>> = Mutex::new(None);

fn known() -> MutexGuard<'static, Option<HashSet<u32>>> {
    KNOWN.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Spawns `cmd` and registers the child before any reaping can look at it.
pub fn spawn(cmd: &mut Command) -> std::io::Result<Child> {
    let mut known = known();
    let child = cmd.spawn()?;
    if let Some(pid) = child.id() {
        known.get_or_insert_with(HashSet::new).insert(pid);
    }
    Ok(child)
}

/// Forgets a child tokio has reaped.
pub fn forget(pid: u32) {
    if let Some(set) = known().as_mut() {
        set.remove(&pid);
    }
}

/// Forgets a registered child when dropped.
#[derive(Debug)]
pub struct Registered(pub Option<u32>);

impl Drop for Registered {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            forget(pid);
        }
    }
}

/// Makes `pgop_backup` spawn its programs (pg_basebackup, pg_dump, a restore's postgres,
/// pg_checksums) through [`spawn`], so that they are registered here and never reaped
/// before tokio waits for them. Idempotent.
pub fn register_backup_programs() {
    pgop_backup::process::set_spawner(pgop_backup::process::Spawner { spawn, forget });
}

/// Whether this process is PID 1 (a container's init).
pub fn is_init() -> bool {
    std::process::id() == 1
}

/// Makes orphaned descendants this process's children, as if it were PID 1 (tests).
pub fn become_subreaper() -> std::io::Result<()> {
    // SAFETY: prctl(PR_SET_CHILD_SUBREAPER, 1) takes no pointers.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Zombie children of this process that pgop did not spawn, from /proc.
fn orphaned_zombies(known: &HashSet<u32>) -> Vec<u32> {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| !known.contains(pid))
        .filter(|pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            // "pid (comm) S ppid ...": comm may hold spaces and parentheses.
            let Some((_, rest)) = stat.rsplit_once(')') else {
                return false;
            };
            let mut fields = rest.split_whitespace();
            let state = fields.next();
            let ppid = fields.next().and_then(|p| p.parse::<u32>().ok());
            state == Some("Z") && ppid == Some(me)
        })
        .collect()
}

/// Reaps the orphaned zombies there are now; returns how many.
pub fn reap_orphans() -> usize {
    let known = known();
    let empty = HashSet::new();
    let zombies = orphaned_zombies(known.as_ref().unwrap_or(&empty));
    let mut reaped = 0;
    for pid in zombies {
        let Ok(pid) = i32::try_from(pid) else {
            continue;
        };
        let mut status = 0;
        // SAFETY: waitpid writes only to `status`; WNOHANG never blocks.
        if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
            reaped += 1;
        }
    }
    reaped
}

/// Reaps orphans every `every`, forever (spawn it as a task when PID 1).
pub async fn run(every: Duration) {
    loop {
        let reaped = tokio::task::spawn_blocking(reap_orphans).await.unwrap_or(0);
        if reaped > 0 {
            tracing::debug!(reaped, "reaped orphaned processes");
        }
        tokio::time::sleep(every).await;
    }
}
