//! Child processes that cannot outlive the process that started them.
//!
//! Three layers make sure no etcd or kube-apiserver is left behind:
//! - [`ManagedProcess`] terminates its child when dropped (also while a test panics);
//! - every child gets `PR_SET_PDEATHSIG = SIGKILL`, so the kernel kills it if the test
//!   process dies without running any cleanup (SIGKILL, abort). The signal fires when the
//!   *thread* that forked exits, so all children are forked from one long-lived spawner
//!   thread rather than from short-lived test threads;
//! - an `atexit` hook kills what is still registered and removes registered directories,
//!   which covers harnesses held in statics (statics are never dropped).
//!
//! Each child leads its own process group, so a signal reaches its helpers too.

use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::mpsc;
use std::sync::{Mutex, Once, OnceLock};
use std::time::{Duration, Instant};

type SpawnReply = mpsc::Sender<io::Result<Child>>;

fn spawner() -> &'static Mutex<mpsc::Sender<(Command, SpawnReply)>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<(Command, SpawnReply)>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<(Command, SpawnReply)>();
        std::thread::Builder::new()
            .name("testenv-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("the OS refused to start the testenv spawner thread");
        Mutex::new(tx)
    })
}

struct Registry {
    pids: Vec<u32>,
    dirs: Vec<PathBuf>,
    cgroups: Vec<String>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    pids: Vec::new(),
    dirs: Vec::new(),
    cgroups: Vec::new(),
});

extern "C" fn cleanup_at_exit() {
    let Ok(mut reg) = REGISTRY.lock() else { return };
    let pids: Vec<u32> = reg.pids.drain(..).collect();
    for pid in &pids {
        signal_group(*pid, libc::SIGKILL);
    }
    // Reap them, so no zombie outlives the exit either.
    for pid in pids {
        if let Ok(pid) = libc::pid_t::try_from(pid) {
            // SAFETY: waitpid on our own child; blocking is bounded since it was SIGKILLed.
            unsafe {
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        }
    }
    // Real nodes' containers, which no process of ours is a parent of.
    for name in reg.cgroups.drain(..) {
        crate::real_nodes::cgroup::destroy(&name);
    }
    for dir in reg.dirs.drain(..) {
        kill_tagged(OWNER_ENV, &dir.display().to_string());
        let _ = std::fs::remove_dir_all(dir);
    }
}

fn with_registry(f: impl FnOnce(&mut Registry)) {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        // SAFETY: registering a plain `extern "C" fn` with atexit has no preconditions.
        unsafe {
            libc::atexit(cleanup_at_exit);
        }
    });
    if let Ok(mut reg) = REGISTRY.lock() {
        f(&mut reg);
    }
}

/// Removes `dir` at process exit unless [`forget_dir`] was called first.
pub(crate) fn register_dir(dir: &Path) {
    with_registry(|r| r.dirs.push(dir.to_path_buf()));
}

pub(crate) fn forget_dir(dir: &Path) {
    with_registry(|r| r.dirs.retain(|d| d != dir));
}

/// Destroys the cgroup tree `name` at process exit unless [`forget_cgroup`] was called.
pub(crate) fn register_cgroup(name: &str) {
    with_registry(|r| r.cgroups.push(name.to_string()));
}

pub(crate) fn forget_cgroup(name: &str) {
    with_registry(|r| r.cgroups.retain(|c| c != name));
}

fn signal_group(pid: u32, signal: libc::c_int) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill(2) with a negative pid signals the process group led by the child.
    unsafe {
        libc::kill(-pid, signal);
    }
}

/// Whether a process with this pid exists (used to find directories of dead runs).
pub(crate) fn pid_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks for existence and permission.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// A running child process, killed with its process group when dropped.
#[derive(Debug)]
pub struct ManagedProcess {
    name: String,
    child: Child,
    log: PathBuf,
    exited: Option<ExitStatus>,
}

impl ManagedProcess {
    /// Starts `cmd` with stdout and stderr appended to `log`.
    pub fn spawn(name: &str, cmd: Command, log: &Path) -> io::Result<Self> {
        Self::spawn_with_death_signal(name, cmd, log, libc::SIGKILL)
    }

    /// [`Self::spawn`], with `signal` sent to the child when this process dies (SIGKILL
    /// for most; a child that cleans up after itself asks for SIGTERM).
    pub fn spawn_with_death_signal(
        name: &str,
        mut cmd: Command,
        log: &Path,
        death_signal: libc::c_int,
    ) -> io::Result<Self> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        cmd.stdout(out.try_clone()?).stderr(out);
        cmd.stdin(std::process::Stdio::null());
        let parent = std::process::id();
        // SAFETY: the closure runs between fork and exec and calls only async-signal-safe
        // functions (setpgid, prctl, getppid).
        unsafe {
            cmd.pre_exec(move || {
                if libc::setpgid(0, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
                if libc::prctl(libc::PR_SET_PDEATHSIG, death_signal) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // The parent may have died before prctl took effect.
                if u32::try_from(libc::getppid()).ok() != Some(parent) {
                    return Err(io::Error::other("parent exited during spawn"));
                }
                Ok(())
            });
        }
        let (reply_tx, reply_rx) = mpsc::channel();
        spawner()
            .lock()
            .map_err(|_| io::Error::other("testenv spawner lock poisoned"))?
            .send((cmd, reply_tx))
            .map_err(|_| io::Error::other("testenv spawner thread is gone"))?;
        let child = reply_rx
            .recv()
            .map_err(|_| io::Error::other("testenv spawner thread is gone"))??;
        with_registry(|r| r.pids.push(child.id()));
        Ok(Self {
            name: name.to_string(),
            child,
            log: log.to_path_buf(),
            exited: None,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// `Some(status)` once the process has exited.
    pub fn try_exited(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().ok().flatten();
        }
        self.exited
    }

    /// The last `n` lines of the process's log, for error messages.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Sends `signal` to the process group without waiting.
    pub fn signal(&self, signal: libc::c_int) {
        if self.exited.is_none() {
            signal_group(self.child.id(), signal);
        }
    }

    /// SIGTERM, then SIGKILL once `grace` has passed; reaps the child.
    pub fn terminate(&mut self, grace: Duration) {
        self.signal(libc::SIGTERM);
        self.wait_or_kill(grace);
    }

    /// Waits up to `grace` for an exit already requested, then SIGKILLs the group.
    pub fn wait_or_kill(&mut self, grace: Duration) {
        let deadline = Instant::now() + grace;
        while self.try_exited().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        // Kill the group even after the leader exited: helpers may linger.
        signal_group(self.child.id(), libc::SIGKILL);
        if self.exited.is_none() {
            self.exited = self.child.wait().ok();
        }
        let pid = self.child.id();
        with_registry(|r| r.pids.retain(|p| *p != pid));
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        self.terminate(Duration::from_secs(5));
    }
}

/// The environment variable that marks every process started for a control plane's
/// pods (value: the control plane's directory). Descendants inherit it, so processes
/// that outlive their parent (an orphaned postmaster) can still be found and stopped,
/// as a container runtime would stop everything in a container.
pub const OWNER_ENV: &str = "PGOP_TESTENV_DIR";

/// SIGKILLs every process whose environment holds `key=value`, and waits (up to 5 s)
/// until they are gone. Returns how many were signalled.
pub fn kill_tagged(key: &str, value: &str) -> usize {
    let needle = format!("{key}={value}");
    let me = std::process::id();
    let find = || -> Vec<i32> {
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| u32::try_from(*pid).ok() != Some(me))
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/environ"))
                    .map(|env| env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()))
                    .unwrap_or(false)
            })
            .filter(|pid| {
                // Zombies are already dead; their parent reaps them.
                std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .map(|s| {
                        !s.rsplit_once(')')
                            .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
                    })
                    .unwrap_or(false)
            })
            .collect()
    };
    let pids = find();
    for pid in &pids {
        // SAFETY: kill(2) on a process carrying our own marker.
        unsafe {
            libc::kill(*pid, libc::SIGKILL);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while !find().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    pids.len()
}
