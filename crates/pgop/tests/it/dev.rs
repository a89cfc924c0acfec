//! `pgop dev`, the README's demo command, run as a user would: started, used with
//! kubectl, then stopped with Ctrl-C, or killed outright.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

type Result<T = (), E = Box<dyn std::error::Error>> = std::result::Result<T, E>;

struct Dev {
    child: Child,
    /// Everything `pgop dev` printed up to its directory line.
    printed: String,
    kubeconfig: PathBuf,
    dir: PathBuf,
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The tests of this module run one at a time: each runs a control plane and a cluster.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn spawn_dev() -> Result<Child> {
    spawn_dev_with(&[])
}

fn spawn_dev_with(args: &[&str]) -> Result<Child> {
    Ok(Command::new(env!("CARGO_BIN_EXE_pgop"))
        .args(["dev", "--ready-timeout", "120"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?)
}

fn start_dev() -> Result<Dev> {
    let mut child = spawn_dev()?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut kubeconfig = None;
    let mut dir = None;
    let mut printed = String::new();
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        printed.push_str(&line);
        printed.push('\n');
        if let Some(p) = line.strip_prefix("kubeconfig: ") {
            kubeconfig = Some(PathBuf::from(p));
        }
        if let Some(p) = line.strip_prefix("directory: ") {
            dir = Some(PathBuf::from(p));
            break;
        }
    }
    Ok(Dev {
        child,
        printed,
        kubeconfig: kubeconfig.ok_or("pgop dev printed no kubeconfig path")?,
        dir: dir.ok_or("pgop dev printed no directory")?,
    })
}

/// Children of `pid`, from /proc.
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|s| {
                    let after = s.rsplit_once(')')?.1.to_string();
                    after.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect()
}

/// The command name of a process.
fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Processes started for pods of the control plane in `dir` (they carry its marker).
fn tagged(dir: &std::path::Path) -> Vec<u32> {
    let needle = format!("PGOP_TESTENV_DIR={}", dir.display());
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                .filter(|p| {
                    std::fs::read(format!("/proc/{p}/environ"))
                        .map(|env| env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()))
                        .unwrap_or(false)
                })
                .collect()
        })
        .unwrap_or_default()
}

fn alive(pid: u32) -> bool {
    // Zombies count as gone: they hold no port, no memory and no files.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

fn wait_gone(pids: &[u32], timeout: Duration) -> Vec<u32> {
    let deadline = Instant::now() + timeout;
    loop {
        let left: Vec<u32> = pids.iter().copied().filter(|p| alive(*p)).collect();
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn kubectl(kubeconfig: &std::path::Path, args: &[&str]) -> Result<String> {
    let kubectl = pgop_testenv::binaries::locate(pgop_testenv::binaries::Binary::Kubectl)?;
    let out = Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned().into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `GET path` on `host`: the whole response, head and body.
fn http_get(host: &str, path: &str) -> Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(host)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    Ok(response)
}

/// SIGINT to `pgop dev`, as Ctrl-C in its terminal; its exit status within 60 s.
fn interrupt(child: &mut Child) -> Result<std::process::ExitStatus> {
    let pid = child.id();
    // SAFETY: plain kill(2) on our own child.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGINT) };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if Instant::now() > deadline {
            return Err("pgop dev did not exit within 60 s of Ctrl-C".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What a `pgop dev` with this pid left behind: its control planes' directories
/// (`$TMPDIR/pgop-testenv/<pid>-<n>`) and every live process started for them.
fn leftovers(pid: u32) -> (Vec<PathBuf>, Vec<u32>) {
    let base = std::env::temp_dir().join("pgop-testenv");
    let dirs: Vec<PathBuf> = std::fs::read_dir(&base)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with(&format!("{pid}-")))
                })
                .collect()
        })
        .unwrap_or_default();
    let marker = format!("PGOP_TESTENV_DIR={}/{pid}-", base.display());
    let procs: Vec<u32> = std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                .filter(|p| {
                    std::fs::read(format!("/proc/{p}/environ"))
                        .map(|env| {
                            env.split(|b| *b == 0)
                                .any(|kv| kv.starts_with(marker.as_bytes()))
                        })
                        .unwrap_or(false)
                })
                .filter(|p| alive(*p))
                .collect()
        })
        .unwrap_or_default();
    (dirs, procs)
}

/// Nothing of `pid` is left within a few seconds of its exit.
fn nothing_left(pid: u32, when: &str) -> Result {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (dirs, procs) = leftovers(pid);
        if dirs.is_empty() && procs.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            let names: Vec<String> = procs.iter().map(|p| format!("{p} {}", comm(*p))).collect();
            return Err(format!("Ctrl-C {when} left {dirs:?} and processes {names:?}").into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn ctrl_c_while_the_control_plane_starts_leaves_nothing_behind() -> Result {
    let _serial = serial();
    let mut child = spawn_dev()?;
    let pid = child.id();
    // The control plane takes a few seconds to start: interrupt it halfway.
    std::thread::sleep(Duration::from_millis(1500));
    let status = interrupt(&mut child)?;
    assert!(status.success(), "pgop dev exited with {status}");
    nothing_left(pid, "while starting")
}

/// A cluster in the API version tutorials and older manifests still use: the API server
/// converts it to `v1beta1` (the stored version) through the operator's webhook.
const V1ALPHA1_CLUSTER: &str = "apiVersion: database.example.com/v1alpha1
kind: PostgresCluster
metadata:
  name: tutorial
spec:
  replicas: 2
  storage:
    size: 1Gi
";

#[test]
fn ctrl_c_while_waiting_for_ready_leaves_nothing_behind() -> Result {
    let _serial = serial();
    // `--cluster` with a v1alpha1 manifest: the conversion webhook is wired before the
    // demo applies it (it once failed at once: the CRD still called the in-cluster
    // Service).
    let dir = tempfile_dir("pgop-dev-v1alpha1")?;
    let manifest = dir.join("cluster.yaml");
    std::fs::write(&manifest, V1ALPHA1_CLUSTER)?;
    let path = manifest.to_str().ok_or("a UTF-8 temporary path")?;
    let mut child = spawn_dev_with(&["--cluster", path])?;
    let pid = child.id();
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let mut printed = String::new();
    loop {
        let line = lines.next().ok_or_else(|| {
            format!("pgop dev ended before applying its cluster; it printed:\n{printed}")
        })??;
        printed.push_str(&line);
        printed.push('\n');
        if line.contains("waiting until it is Ready") {
            break;
        }
    }
    assert!(
        printed.contains("applied PostgresCluster default/tutorial;"),
        "{printed}"
    );
    // Pods are being created and PostgreSQL initialised now.
    std::thread::sleep(Duration::from_millis(1500));
    let status = interrupt(&mut child)?;
    assert!(status.success(), "pgop dev exited with {status}");
    std::fs::remove_dir_all(&dir)?;
    nothing_left(pid, "while waiting for Ready")
}

/// A new directory of this process for the test's files.
fn tempfile_dir(prefix: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("{prefix}-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

#[test]
fn dev_serves_kubectl_and_ctrl_c_stops_everything() -> Result {
    let _serial = serial();
    let mut dev = start_dev()?;
    let namespaces = kubectl(&dev.kubeconfig, &["get", "namespaces", "-o", "name"])?;
    assert!(namespaces.contains("namespace/default"), "{namespaces}");
    // The example cluster was applied and the in-process operator created its instances.
    assert!(
        dev.printed.contains("NAME") && dev.printed.contains("example"),
        "{}",
        dev.printed
    );
    // Three instances and the example's pooler, whose address the demo printed.
    let pods = kubectl(&dev.kubeconfig, &["get", "pods", "-o", "name"])?;
    let (poolers, instances): (Vec<&str>, Vec<&str>) = pods
        .lines()
        .partition(|p| p.starts_with("pod/example-pooler-rw-"));
    assert_eq!((instances.len(), poolers.len()), (3, 1), "{pods}");
    assert!(
        dev.printed
            .contains("Or through the PgBouncer pooler example-pooler-rw (transaction pooling, to the primary)"),
        "{}",
        dev.printed
    );
    assert!(
        !dev.printed.contains("<the example-pooler-rw endpoint>"),
        "the pooler's address is printed: {}",
        dev.printed
    );
    let pgc = kubectl(
        &dev.kubeconfig,
        &[
            "get",
            "pgc",
            "example",
            "-o",
            "jsonpath={.status.currentPrimary}",
        ],
    )?;
    assert_eq!(pgc, "example-1");
    // The example is v1beta1, the stored version; v1alpha1 reads through the operator's
    // conversion webhook, on a loopback port the operator pointed the CRD at. (The plural:
    // kubectl drops the version of a short name such as `pgc.v1alpha1...`.)
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let replicas = loop {
        let read = kubectl(
            &dev.kubeconfig,
            &[
                "get",
                "postgresclusters.v1alpha1.database.example.com",
                "example",
                "-o",
                "jsonpath={.spec.replicas}",
            ],
        );
        match read {
            Ok(replicas) => break replicas,
            Err(e) if std::time::Instant::now() > deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    };
    assert_eq!(replicas, "3");
    // The in-process operator serves its metrics on a free loopback port, and says where.
    let url = dev
        .printed
        .lines()
        .find_map(|l| l.strip_prefix("operator metrics: http://"))
        .ok_or_else(|| format!("no metrics address in\n{}", dev.printed))?;
    let host = url.split('/').next().ok_or("no host")?;
    assert!(host.starts_with("127.0.0.1:"), "{host}");
    let metrics = http_get(host, "/metrics")?;
    assert!(
        metrics.contains(r#"pgop_cluster_instances{namespace="default",cluster="example"} 3"#),
        "{metrics}"
    );
    assert!(http_get(host, "/readyz")?.starts_with("HTTP/1.1 200"));
    let pid = dev.child.id();
    let mut children = children_of(pid);
    let names: Vec<String> = children.iter().map(|p| comm(*p)).collect();
    for component in [
        "etcd",
        "kube-apiserver",
        "kube-controller",
        "kube-scheduler",
    ] {
        assert!(
            names.iter().any(|n| n == component),
            "{component} in {names:?}"
        );
    }
    // The three instance managers and their PostgreSQL processes.
    let pods = tagged(&dev.dir);
    assert!(
        pods.iter().filter(|p| comm(**p) == "pgop").count() >= 3,
        "{:?}",
        pods.iter().map(|p| comm(*p)).collect::<Vec<_>>()
    );
    assert!(pods.iter().any(|p| comm(*p) == "postgres"));
    children.extend(pods);

    // SAFETY: plain kill(2) on our own child.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGINT) };
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = dev.child.try_wait()? {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "pgop dev did not exit after Ctrl-C"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "pgop dev exited with {status}");
    assert_eq!(
        wait_gone(&children, Duration::from_secs(5)),
        Vec::<u32>::new()
    );
    assert!(!dev.dir.exists(), "{} was left behind", dev.dir.display());
    nothing_left(pid, "once Ready")
}

#[tokio::test]
// The lock only orders this module's tests; each runs on its own runtime.
#[allow(clippy::await_holding_lock)]
async fn killing_dev_outright_leaves_no_process_and_the_next_start_sweeps_its_directory() -> Result
{
    let _serial = serial();
    let mut dev = start_dev()?;
    let children = children_of(dev.child.id());
    assert!(children.len() >= 4, "{children:?}");
    let pods = tagged(&dev.dir);
    assert!(!pods.is_empty());
    dev.child.kill()?; // SIGKILL: no cleanup code runs in pgop dev
    dev.child.wait()?;
    assert_eq!(
        wait_gone(&children, Duration::from_secs(10)),
        Vec::<u32>::new(),
        "direct children outlived their parent"
    );
    assert!(dev.dir.exists(), "nothing could have removed it yet");
    // An orphaned postmaster may survive its manager (as it would not in a container,
    // whose processes all die together); the next start finds and stops it.
    let next = pgop_testenv::ControlPlane::start(pgop_testenv::Options::default()).await?;
    assert!(
        !dev.dir.exists(),
        "the next start should sweep {}",
        dev.dir.display()
    );
    assert_eq!(
        wait_gone(&pods, Duration::from_secs(5)),
        Vec::<u32>::new(),
        "pod processes left behind"
    );
    next.stop();
    Ok(())
}
