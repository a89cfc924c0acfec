//! One cgroup tree per real node, in every mounted hierarchy: `/<run>-<node>` holds the
//! node's daemons (in `system/`), the shims containerd starts (they inherit its cgroup)
//! and, through the kubelet's `cgroupRoot`, every Pod's containers (`kubepods/...`).
//! Stopping a node freezes the tree, kills what is in it and removes it, so no container
//! outlives its node, whoever started it.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const ROOT: &str = "/sys/fs/cgroup";

/// Names of the tree of every node of every harness run start with this.
pub const PREFIX: &str = "pgop-testenv-";

/// Every mounted hierarchy (cgroup v1 controllers, the named `systemd` one and the
/// unified one of a hybrid setup).
fn hierarchies() -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(ROOT) else {
        return Vec::new();
    };
    let mut all: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        // cpu,cpuacct style symlinks point at a hierarchy listed under its own name.
        .filter(|p| !p.is_symlink() && p.join("cgroup.procs").exists())
        .collect();
    all.sort();
    all
}

/// A node's cgroup tree, `/<name>` in every hierarchy.
#[derive(Debug)]
pub struct Tree {
    name: String,
}

impl Tree {
    /// Creates `/<name>` and `/<name>/system` everywhere (cpusets get the parent's CPUs
    /// and memory nodes, which a new v1 cpuset lacks).
    pub fn create(name: &str) -> io::Result<Self> {
        let tree = Tree {
            name: name.to_string(),
        };
        crate::process::register_cgroup(name);
        let hierarchies = hierarchies();
        if hierarchies.is_empty() {
            return Err(io::Error::other(format!(
                "no cgroup hierarchy is mounted under {ROOT}"
            )));
        }
        for h in hierarchies {
            for dir in [h.join(name), h.join(name).join("system")] {
                match std::fs::create_dir(&dir) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => {
                        return Err(io::Error::new(
                            e.kind(),
                            format!("creating cgroup {}: {e}", dir.display()),
                        ));
                    }
                }
                if h.ends_with("cpuset") {
                    for file in ["cpuset.cpus", "cpuset.mems"] {
                        let parent = dir.parent().unwrap_or(&h).join(file);
                        let value = std::fs::read_to_string(parent)?;
                        std::fs::write(dir.join(file), value.trim())?;
                    }
                }
            }
        }
        Ok(tree)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The shell words that move the current shell into `system/` of every hierarchy
    /// (run by each node process before it execs its program).
    pub fn join_script(&self) -> String {
        format!(
            "for f in {ROOT}/*/{name}/system/cgroup.procs; do echo $$ > \"$f\"; done",
            name = self.name
        )
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        destroy(&self.name);
        crate::process::forget_cgroup(&self.name);
    }
}

/// Freezes (`true`) or thaws every process of the tree `name` (cgroup v1 freezer): a
/// frozen node's daemons and containers stop where they are, as when a machine hangs.
pub fn set_frozen(name: &str, frozen: bool) -> io::Result<()> {
    let state = Path::new(ROOT)
        .join("freezer")
        .join(name)
        .join("freezer.state");
    std::fs::write(&state, if frozen { "FROZEN" } else { "THAWED" })?;
    // Freezing completes asynchronously: wait until the state says so.
    let want = if frozen { "FROZEN" } else { "THAWED" };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if std::fs::read_to_string(&state)?.trim() == want {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(io::Error::other(format!("{name} did not become {want}")));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// How long [`destroy`] (and a node holder's clean-up) keeps killing and removing before
/// it gives up: on a loaded machine a node's few dozen processes take seconds to die and
/// be reaped, and rmdir answers EBUSY until the last one is. A cold `.ci/run` (builds
/// beside the tests, the disk busy) once kept a killed node's unified-hierarchy tree busy
/// past 60 s: it was removable minutes later, with nothing in it.
pub const DESTROY_LIMIT: Duration = Duration::from_secs(180);

/// Freezes the tree, SIGKILLs every process in it, thaws it and removes every directory,
/// deepest first, again and again until the tree is gone (at most [`DESTROY_LIMIT`]).
///
/// One loop does both, so that neither a process that was slow to die nor one that was
/// still exiting (rmdir answers EBUSY until the kernel has released the last exited
/// task, not when it left `cgroup.procs`) makes it give up early.
pub fn destroy(name: &str) {
    let freezer = Path::new(ROOT).join("freezer").join(name);
    let deadline = Instant::now() + DESTROY_LIMIT;
    loop {
        let pids = pids_in(name);
        if !pids.is_empty() {
            let frozen = std::fs::write(freezer.join("freezer.state"), "FROZEN").is_ok();
            for pid in &pids {
                // SAFETY: kill(2) on a process inside a cgroup tree this harness made.
                unsafe {
                    libc::kill(*pid, libc::SIGKILL);
                }
            }
            if frozen {
                let _ = std::fs::write(freezer.join("freezer.state"), "THAWED");
            }
        }
        for h in hierarchies() {
            remove_tree(&h.join(name));
        }
        if hierarchies().iter().all(|h| !h.join(name).exists()) {
            return;
        }
        if Instant::now() > deadline {
            tracing::warn!(
                cgroup = name,
                left = %describe(name),
                "cgroup tree left after {} s of killing and rmdir",
                DESTROY_LIMIT.as_secs()
            );
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What is left of the tree `name`: each directory that still exists, with the
/// processes it lists (pid, state and command), for a message that says why it stays.
pub fn describe(name: &str) -> String {
    let mut out = Vec::new();
    for h in hierarchies() {
        describe_dir(&h.join(name), &mut out);
    }
    if out.is_empty() {
        "nothing".to_string()
    } else {
        out.join("; ")
    }
}

fn describe_dir(dir: &Path, out: &mut Vec<String>) {
    if !dir.exists() {
        return;
    }
    let procs: Vec<String> = std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .map(|pid| {
            let stat =
                std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())).unwrap_or_default();
            // `pid (comm) state ...`: the command and the one-letter state.
            let comm = stat
                .split_once('(')
                .and_then(|(_, rest)| rest.rsplit_once(')'))
                .map(|(comm, rest)| format!("{comm} {}", rest.trim().chars().next().unwrap_or('?')))
                .unwrap_or_else(|| "gone".to_string());
            format!("{} {comm}", pid.trim())
        })
        .collect();
    let populated = std::fs::read_to_string(dir.join("cgroup.events"))
        .ok()
        .and_then(|e| {
            e.lines()
                .find(|l| l.starts_with("populated"))
                .map(str::to_string)
        });
    out.push(format!(
        "{} [{}]{}",
        dir.display(),
        procs.join(", "),
        populated.map(|p| format!(" {p}")).unwrap_or_default()
    ));
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                describe_dir(&e.path(), out);
            }
        }
    }
}

/// Every process in the tree `name`.
pub fn pids_in(name: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    for h in hierarchies() {
        collect(&h.join(name), &mut pids);
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

fn collect(dir: &Path, pids: &mut Vec<i32>) {
    if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                collect(&e.path(), pids);
            }
        }
    }
}

fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&e.path());
            }
        }
    }
    // A cgroup directory is removed with rmdir (its control files go with it).
    let _ = std::fs::remove_dir(dir);
}

/// Trees of runs whose process is gone (named `PREFIX<pid>-...`), found in every
/// hierarchy: a dead run's node holder, killed by the directory sweep while it was still
/// removing its tree (`rmdir` answered EBUSY in the first hierarchy, the later ones went),
/// once left `blkio/<tree>` alone, where a sweep that looked in `freezer/` only never saw it.
pub fn sweep_dead() {
    for name in existing(PREFIX) {
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !crate::process::pid_alive(pid) {
            destroy(&name);
        }
    }
}

/// Names of the trees that exist now (for tests that check nothing is left).
pub fn existing(prefix: &str) -> Vec<String> {
    let mut names = Vec::new();
    for h in hierarchies() {
        if let Ok(entries) = std::fs::read_dir(&h) {
            names.extend(
                entries
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().to_string())
                    .filter(|n| n.starts_with(prefix)),
            );
        }
    }
    names.sort();
    names.dedup();
    names
}
