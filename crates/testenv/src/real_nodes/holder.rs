//! Processes inside a node's namespaces: the holder that owns them (and cleans up when
//! the harness dies), the commands that enter them, and the host programs they need.

use super::{Error, NODE_PACKAGES, cgroup, io};
use crate::process::{ManagedProcess, OWNER_ENV};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

pub const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

pub fn run(cmd: &mut Command) -> Result<String, Error> {
    let shown = format!("{cmd:?}");
    let out = cmd.output().map_err(io(format!("running {shown}")))?;
    if !out.status.success() {
        return Err(Error::Command {
            command: shown,
            status: out.status.to_string(),
            output: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
            .trim()
            .to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `nft -f -` with `script` inside the network namespace of process `pid`.
pub fn nft_in(pid: u32, script: &str) -> Result<String, Error> {
    use std::io::Write;
    if which("nft").is_none() {
        return Err(Error::Missing {
            what: "nft".into(),
            path: PathBuf::from(PATH),
            install: "apt-get install nftables",
        });
    }
    let shown = format!("nsenter --target={pid} --net -- nft -f - <<< {script:?}");
    let mut child = Command::new("nsenter")
        .arg(format!("--target={pid}"))
        .args(["--net", "--", "nft", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(io(format!("running {shown}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(script.as_bytes())
            .map_err(io(format!("writing to {shown}")))?;
    }
    let out = child
        .wait_with_output()
        .map_err(io(format!("waiting for {shown}")))?;
    if !out.status.success() {
        return Err(Error::Command {
            command: shown,
            status: out.status.to_string(),
            output: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `ip ...` inside the network namespace of process `pid`.
pub fn ip_in(pid: u32, args: &str) -> Result<String, Error> {
    run(Command::new("nsenter")
        .arg(format!("--target={pid}"))
        .arg("--net")
        .arg("--")
        .arg("ip")
        .args(args.split_whitespace()))
}

fn which(program: &str) -> Option<PathBuf> {
    PATH.split(':')
        .map(|d| Path::new(d).join(program))
        .find(|p| p.is_file())
}

pub fn require_programs() -> Result<(), Error> {
    for program in [
        "containerd",
        "containerd-shim-runc-v2",
        "runc",
        "ctr",
        "iptables",
        "ip",
        "nsenter",
        "unshare",
    ] {
        if which(program).is_none() {
            return Err(Error::Missing {
                what: program.to_string(),
                path: PathBuf::from(PATH),
                install: NODE_PACKAGES,
            });
        }
    }
    for plugin in ["bridge", "host-local", "loopback", "portmap"] {
        let path = Path::new("/usr/lib/cni").join(plugin);
        if !path.is_file() {
            return Err(Error::Missing {
                what: format!("the CNI plugin {plugin}"),
                path,
                install: NODE_PACKAGES,
            });
        }
    }
    Ok(())
}

/// The kernel tunables a kubelet sets at start (its `setupKernelTunables`, unless
/// `protectKernelDefaults`), as paths under `/proc/sys` with the value it sets. They are
/// host-wide, not of the node's network namespace: set for real, they would stay changed on
/// the machine after the tests (`kernel/panic_on_oops` 1 turns any oops into a panic).
pub const KEPT_SYSCTLS: [(&str, &str); 6] = [
    ("vm/overcommit_memory", "1"),
    ("vm/panic_on_oom", "0"),
    ("kernel/panic", "10"),
    ("kernel/panic_on_oops", "1"),
    ("kernel/keys/root_maxkeys", "1000000"),
    ("kernel/keys/root_maxbytes", "25000000"),
];

/// The part of a node's holder script that keeps [`KEPT_SYSCTLS`] from the machine: in the
/// node's mount namespace each is a file of the node's directory holding the machine's
/// value, bind-mounted over its `/proc/sys` entry, so the kubelet reads and sets its own
/// copy and nothing outside the node sees a change, even when the run is killed.
fn kept_sysctls_script(dir: &Path) -> String {
    let d = dir.display();
    let mut s = format!("mkdir -p {d}/sysctl\n");
    for (key, _) in KEPT_SYSCTLS {
        let file = kept_sysctl_file(key);
        s.push_str(&format!(
            "cat /proc/sys/{key} > {d}/{file}\nmount --bind {d}/{file} /proc/sys/{key}\n"
        ));
    }
    s
}

/// The file of a node's directory that stands for `/proc/sys/<key>` in the node
/// ([`KEPT_SYSCTLS`]): `sysctl/vm.overcommit_memory`, ...
pub fn kept_sysctl_file(key: &str) -> String {
    format!("sysctl/{}", key.replace('/', "."))
}

/// The script a namespace holder runs: its namespaces' set-up, then it waits. Killed by
/// the harness (drop), it takes its namespaces with it. Sent SIGTERM, which is what the
/// kernel sends it when the harness's process dies (Ctrl-C, SIGKILL), it first kills
/// everything in its node's cgroup tree (containers, shims and daemons that are not its
/// children) and removes the tree and the node's directory, so that a dead run leaves
/// nothing behind even before a later run's sweep.
fn holder_script(tree: &cgroup::Tree, hostname: &str, dir: &Path, node: bool) -> String {
    let name = tree.name();
    let d = dir.display();
    let mut s = format!(
        "set -e
{join}
cleanup() {{
  set +e
  for f in /sys/fs/cgroup/*/cgroup.procs; do echo $$ > \"$f\"; done
  # Kill what is in the tree and remove it, deepest first, again and again until it is
  # gone: a process can be slow to die on a loaded machine, and rmdir answers EBUSY until
  # the kernel has released the last exited task. At most {limit} s.
  end=$(( $(date +%s) + {limit} ))
  while [ \"$(date +%s)\" -lt \"$end\" ]; do
    trees=$(ls -d /sys/fs/cgroup/*/{name} 2>/dev/null)
    [ -z \"$trees\" ] && break
    pids=$(cat $(find $trees -name cgroup.procs) 2>/dev/null)
    if [ -n \"$pids\" ]; then
      echo FROZEN > /sys/fs/cgroup/freezer/{name}/freezer.state
      kill -9 $pids 2>/dev/null
      echo THAWED > /sys/fs/cgroup/freezer/{name}/freezer.state
    fi
    find $trees -depth -type d -exec rmdir {{}} \\; 2>/dev/null
    sleep 0.1
  done
  # Given up: what is left, and why, beside the node's directory (which goes below).
  left=$(ls -d /sys/fs/cgroup/*/{name} 2>/dev/null)
  if [ -n \"$left\" ]; then
    for c in $(find $left -type d); do
      echo \"$c: procs [$(cat $c/cgroup.procs 2>/dev/null | tr '\\n' ' ')] $(grep populated $c/cgroup.events 2>/dev/null)\"
    done > {d}.cleanup-left 2>&1
  fi
  # Volumes and container root filesystems are mounted in this namespace, deepest first.
  awk '$2 ~ \"^{d}/\" {{print $2}}' /proc/self/mounts | sort -r | xargs -r -n1 umount -l
  rm -rf {d}
  exit 0
}}
trap cleanup TERM INT
ip link set lo up
",
        join = tree.join_script(),
        limit = cgroup::DESTROY_LIMIT.as_secs(),
    );
    if node {
        s.push_str(&kept_sysctls_script(dir));
        s.push_str(&format!(
            "hostname {hostname}
echo 1 > /proc/sys/net/ipv4/ip_forward
echo 1 > /proc/sys/net/bridge/bridge-nf-call-iptables
mkdir -p /run/netns /run/containerd /var/lib/cni {d}/var-lib-cni
mount -t tmpfs -o mode=0755 pgop-netns /run/netns
mount -t tmpfs -o mode=0711 pgop-containerd /run/containerd
mount --bind {d}/var-lib-cni /var/lib/cni
# The kubelet's device-plugin socket is always /var/lib/kubelet/device-plugins/kubelet.sock,
# whatever its --root-dir: kubelets of nodes started at the same time took it from each
# other (\"bind: address already in use\") and one exited. Each node has its own.
mkdir -p {d}/var-lib-kubelet /var/lib/kubelet
mount --bind {d}/var-lib-kubelet /var/lib/kubelet
# The kubelet makes its root directory a shared mount (a bind mount onto itself) when it
# is not one, while its other goroutines already create sockets there: a rename that
# straddles that mount fails with EXDEV and stops the kubelet. Made shared here first.
mkdir -p {d}/kubelet
mount --bind {d}/kubelet {d}/kubelet
mount --make-rshared {d}/kubelet
"
        ));
    }
    s.push_str("echo ready\nsleep infinity &\nwait\n");
    s
}

/// A command that runs `program` inside a node's namespaces and cgroup tree, tagged as
/// the harness's own.
pub fn in_node(
    holder: u32,
    tree_join: &str,
    owner: &str,
    program: &str,
    args: impl FnOnce(&mut Command),
) -> Command {
    let mut c = Command::new("nsenter");
    c.arg(format!("--target={holder}"))
        .args(["--net", "--mount", "--uts", "--"])
        .arg("sh")
        .arg("-c")
        .arg(format!("{tree_join}\nexec \"$0\" \"$@\""))
        .arg(program);
    args(&mut c);
    c.env("PATH", PATH).env(OWNER_ENV, owner);
    c
}

/// Starts a namespace holder and waits until its set-up is done.
pub async fn spawn_holder(
    tree: &cgroup::Tree,
    hostname: &str,
    dir: &Path,
    node: bool,
    owner: &str,
) -> Result<ManagedProcess, Error> {
    let mut c = Command::new("unshare");
    c.args([
        "--net",
        "--mount",
        "--uts",
        "--propagation",
        "private",
        "--",
    ])
    .arg("sh")
    .arg("-c")
    .arg(holder_script(tree, hostname, dir, node))
    .env("PATH", PATH)
    .env(OWNER_ENV, owner);
    let log = dir.join("holder.log");
    let mut holder = ManagedProcess::spawn_with_death_signal(
        &format!("{hostname} namespaces"),
        c,
        &log,
        libc::SIGTERM,
    )
    .map_err(io("starting a namespace holder"))?;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if holder.log_tail(5).lines().any(|l| l == "ready") {
            return Ok(holder);
        }
        if let Some(status) = holder.try_exited() {
            return Err(Error::Exited {
                name: holder.name().to_string(),
                status: status.to_string(),
                log: log.display().to_string(),
                tail: holder.log_tail(20),
            });
        }
        if Instant::now() > deadline {
            return Err(Error::Timeout {
                what: format!("{hostname}'s namespaces were not set up"),
                timeout: Duration::from_secs(20),
                detail: String::new(),
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
