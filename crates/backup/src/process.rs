//! Starting programs (pg_basebackup, pg_dump, a restore's postgres, pg_checksums) so that
//! the instance manager, when it runs as a pod's PID 1 and reaps orphaned zombies, never
//! reaps one of them before tokio waits for it (tokio's wait would then fail). The manager
//! installs its reaper's registration as the process-wide [`Spawner`]; without one (the
//! CLI, tests) programs are spawned plainly.

use std::sync::OnceLock;
use tokio::process::{Child, Command};

/// How children are spawned and forgotten by a process that reaps orphans.
#[derive(Clone, Copy, Debug)]
pub struct Spawner {
    /// Spawns `cmd` and registers the child in one step (no reaping in between).
    pub spawn: fn(&mut Command) -> std::io::Result<Child>,
    /// Forgets a registered child once it has been waited for (or given up).
    pub forget: fn(u32),
}

static SPAWNER: OnceLock<Spawner> = OnceLock::new();

/// Installs the process-wide spawner; the first call wins (returns whether this one did).
pub fn set_spawner(spawner: Spawner) -> bool {
    SPAWNER.set(spawner).is_ok()
}

/// A child's registration with the [`Spawner`], forgotten when dropped: keep it until the
/// child has been waited for.
#[derive(Debug)]
pub struct Registration(Option<u32>);

impl Drop for Registration {
    fn drop(&mut self) {
        if let (Some(pid), Some(spawner)) = (self.0, SPAWNER.get()) {
            (spawner.forget)(pid);
        }
    }
}

/// Spawns `cmd` through the installed [`Spawner`], if any.
pub fn spawn(cmd: &mut Command) -> std::io::Result<(Child, Registration)> {
    let child = match SPAWNER.get() {
        Some(spawner) => (spawner.spawn)(cmd)?,
        None => cmd.spawn()?,
    };
    let pid = child.id();
    Ok((child, Registration(pid)))
}

/// [`Command::output`] through [`spawn`]: stdout and stderr are piped unless `cmd` says
/// otherwise.
pub async fn output(cmd: &mut Command) -> std::io::Result<std::process::Output> {
    let (child, _registration) = spawn(cmd)?;
    child.wait_with_output().await
}
