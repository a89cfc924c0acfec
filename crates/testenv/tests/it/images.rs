//! The container images of hack/build-images.sh, run by a real container runtime.
//!
//! Takes the images `hack/build-images.sh` built last (hack/test.sh builds them before
//! the tests; a missing archive fails naming the script), starts a throwaway containerd
//! (own root, state and socket in a temporary directory), imports the OCI archives with
//! `ctr -n k8s.io images import`, as a node would, and checks:
//! - the archives carry the names the kubelet looks up (`docker.io/library/pgop:<version>`);
//! - the pgop image runs as uid/gid 26 with a read-only root filesystem: `pgop --version`,
//!   `postgres --version` (15) and `psql --version` work, the root is not writable, and
//!   PostgreSQL initialises, starts and answers `psql` over its socket when only the
//!   volumes of an instance Pod (PGDATA, /run/postgresql, /tmp) are writable;
//! - the pause image runs as PID 1, reaps an orphan re-parented to it, and exits 0 on
//!   SIGTERM.
//!
//! Needs root (containerd and runc). Everything it starts is stopped, and its directory
//! removed, also when it fails.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Reads the images.env of the last hack/build-images.sh run.
fn built_images() -> BTreeMap<String, String> {
    let file = pgop_testenv::images::dir().join("images.env");
    let text = std::fs::read_to_string(&file).unwrap_or_else(|err| {
        panic!(
            "no image list at {} ({err}): run hack/build-images.sh first",
            file.display()
        )
    });
    let env: BTreeMap<String, String> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    for key in ["PGOP_IMAGE_ARCHIVE", "PAUSE_IMAGE_ARCHIVE"] {
        let archive = env
            .get(key)
            .unwrap_or_else(|| panic!("{} names no {key}", file.display()));
        assert!(
            Path::new(archive).is_file(),
            "{archive} is missing: run hack/build-images.sh"
        );
    }
    env
}

/// A containerd of its own, stopped (with everything it ran) when dropped.
struct Containerd {
    dir: PathBuf,
    daemon: Child,
    containers: Vec<String>,
}

impl Containerd {
    fn start() -> Self {
        let dir = std::env::temp_dir().join(format!("pgop-images-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the containerd directory");
        let config = format!(
            "version = 2\nroot = \"{d}/root\"\nstate = \"{d}/state\"\n\
             disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n\
             [grpc]\n  address = \"{d}/containerd.sock\"\n\
             [ttrpc]\n  address = \"{d}/containerd.sock.ttrpc\"\n",
            d = dir.display()
        );
        std::fs::write(dir.join("config.toml"), config).expect("write containerd's config");
        let log = std::fs::File::create(dir.join("containerd.log")).expect("create the log");
        let daemon = Command::new("containerd")
            .arg("--config")
            .arg(dir.join("config.toml"))
            .stdout(log.try_clone().expect("clone the log"))
            .stderr(log)
            .spawn()
            .expect("start containerd (Debian: apt-get install containerd runc)");
        let containerd = Self {
            dir,
            daemon,
            containers: Vec::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !containerd.ctr(&["version"]).status.success() {
            assert!(Instant::now() < deadline, "containerd did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        containerd
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("ctr");
        cmd.arg("--address")
            .arg(self.dir.join("containerd.sock"))
            .args(["--namespace", "k8s.io"])
            .args(args);
        cmd
    }

    fn ctr(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run ctr")
    }

    /// `ctr ARGS`, which must succeed; its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.ctr(args);
        assert!(
            out.status.success(),
            "ctr {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs IMAGE's command with ARGS in a fresh container (read-only root, the image's
    /// user); its output.
    fn run(&mut self, id: &str, image: &str, extra: &[&str], args: &[&str]) -> Output {
        self.containers.push(id.to_string());
        let mut all = vec!["run", "--rm", "--read-only"];
        all.extend_from_slice(extra);
        all.extend_from_slice(&[image, id]);
        all.extend_from_slice(args);
        self.ctr(&all)
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        for id in &self.containers {
            let _ = self.ctr(&["tasks", "kill", "--signal", "SIGKILL", id]);
            let _ = self.ctr(&["tasks", "delete", "--force", id]);
            let _ = self.ctr(&["containers", "delete", id]);
        }
        // SAFETY: kill has no memory preconditions; the pid is our own child's.
        unsafe { libc::kill(self.daemon.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while matches!(self.daemon.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
        // Anything still mounted below the directory (a snapshot of a task that outlived
        // the daemon) is unmounted before the directory goes.
        if let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") {
            let prefix = self.dir.to_string_lossy().into_owned();
            let mut points: Vec<&str> = mounts
                .lines()
                .filter_map(|l| l.split(' ').nth(4))
                .filter(|p| p.starts_with(&prefix))
                .collect();
            points.sort_by_key(|p| std::cmp::Reverse(p.len()));
            for point in points {
                let _ = Command::new("umount").args(["-l", point]).status();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The instance Pod's writable volumes, as tmpfs mounts: PGDATA's volume owned by 26
/// (a PVC with fsGroup 26), the socket directory and /tmp (emptyDirs).
const POD_VOLUMES: &[&str] = &[
    "--mount",
    "type=tmpfs,src=tmpfs,dst=/var/lib/postgresql/data,options=rw:nosuid:nodev:uid=26:gid=26:mode=0770",
    "--mount",
    "type=tmpfs,src=tmpfs,dst=/run/postgresql,options=rw:nosuid:nodev:mode=1777",
    "--mount",
    "type=tmpfs,src=tmpfs,dst=/tmp,options=rw:nosuid:nodev:mode=1777",
];

/// initdb, start, query and stop PostgreSQL as the instance manager does, by hand.
const POSTGRES_SCRIPT: &str = r#"set -eu
id -u; id -g
pgop --version
postgres --version
psql --version
if touch /usr/local/bin/x 2>/dev/null; then echo "root filesystem is writable"; exit 1; fi
export PGDATA=/var/lib/postgresql/data/pgdata
initdb --encoding=UTF8 --locale=C --auth=trust --username=postgres >/tmp/initdb.log 2>&1 \
  || { cat /tmp/initdb.log; exit 1; }
pg_ctl start --wait --log=/tmp/pg.log \
  -o "-c listen_addresses='' -c unix_socket_directories=/run/postgresql" \
  || { cat /tmp/pg.log; exit 1; }
psql -h /run/postgresql -U postgres -Atc "select 'answer ' || 6 * 7" postgres
pg_ctl stop --wait --mode=fast >/dev/null
"#;

#[test]
fn images_run_in_a_real_runtime() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        panic!(
            "this test needs root: it runs containerd and runc (sudo -E cargo test -p pgop-testenv --test it -- images::)"
        );
    }
    let images = built_images();
    let pgop = &images["PGOP_IMAGE"];
    let pause = &images["PAUSE_IMAGE"];
    let mut containerd = Containerd::start();

    // The archives import as they are, under the names the kubelet asks for.
    let started = Instant::now();
    for key in [
        "PGOP_IMAGE_ARCHIVE",
        "PAUSE_IMAGE_ARCHIVE",
        "COREDNS_IMAGE_ARCHIVE",
    ] {
        if let Some(archive) = images.get(key) {
            containerd.ok(&["images", "import", archive]);
        }
    }
    eprintln!("imported in {:.1?}", started.elapsed());
    let names = containerd.ok(&["images", "ls", "--quiet"]);
    for key in [
        "PGOP_IMAGE",
        "PGOP_IMAGE_COMMIT",
        "PAUSE_IMAGE",
        "COREDNS_IMAGE",
    ] {
        if let Some(name) = images.get(key) {
            assert!(
                name.starts_with("docker.io/library/"),
                "{key}={name} is not a full reference"
            );
            assert!(
                names.lines().any(|l| l == name),
                "{name} not among the imported images:\n{names}"
            );
        }
    }

    // pgop: non-root, read-only root, PostgreSQL 15 with only the Pod's volumes writable.
    let out = containerd.run(
        "pgop-image-check",
        pgop,
        POD_VOLUMES,
        &["/bin/sh", "-c", POSTGRES_SCRIPT],
    );
    let output = text(&out);
    eprintln!("{output}");
    assert!(
        out.status.success(),
        "the pgop image check failed:\n{output}"
    );
    let lines: Vec<&str> = output.lines().collect();
    assert_eq!(lines.first(), Some(&"26"), "uid:\n{output}");
    assert_eq!(lines.get(1), Some(&"26"), "gid:\n{output}");
    assert!(
        output.contains(&format!("pgop {}", env!("CARGO_PKG_VERSION"))),
        "pgop --version:\n{output}"
    );
    assert!(
        output.contains("postgres (PostgreSQL) 15."),
        "postgres --version:\n{output}"
    );
    assert!(
        output.contains("psql (PostgreSQL) 15."),
        "psql --version:\n{output}"
    );
    assert!(output.contains("answer 42"), "the query:\n{output}");

    // The next version (`hack/build-images.sh --next-version`, for upgrade tests): the
    // same sources, a binary that reports that version.
    match (
        images.get("PGOP_NEXT_IMAGE_ARCHIVE"),
        images.get("PGOP_NEXT_IMAGE"),
    ) {
        (Some(archive), Some(next)) => {
            containerd.ok(&["images", "import", archive]);
            let out = containerd.run("pgop-next-version", next, &[], &["pgop", "--version"]);
            let want = format!("pgop {}", images["PGOP_NEXT_VERSION"]);
            assert_eq!(text(&out).trim(), want, "{next} --version");
            assert_ne!(
                images["PGOP_NEXT_VERSION"],
                env!("CARGO_PKG_VERSION"),
                "the next version differs"
            );
        }
        _ => eprintln!(
            "no next pgop image in images.env (hack/build-images.sh --next-version): not checked"
        ),
    }

    // The entrypoint is pgop.
    let out = containerd.run("pgop-image-entrypoint", pgop, &[], &[]);
    assert!(out.status.success(), "pgop --help: {}", text(&out));
    assert!(text(&out).contains("Usage: pgop"), "{}", text(&out));

    // pause: PID 1 until SIGTERM, reaping orphans, then exit 0.
    let id = "pgop-pause-check";
    containerd.containers.push(id.to_string());
    let pid_file = containerd.dir.join("pause.pid");
    let mut run = containerd
        .command(&[
            "run",
            "--rm",
            "--read-only",
            "--pid-file",
            &pid_file.to_string_lossy(),
            pause,
            id,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the pause container");
    let deadline = Instant::now() + Duration::from_secs(30);
    let pid = loop {
        if let Ok(pid) = std::fs::read_to_string(&pid_file)
            && let Ok(pid) = pid.trim().parse::<u32>()
        {
            break pid;
        }
        if let Ok(Some(status)) = run.try_wait() {
            panic!("pause exited at once: {status}");
        }
        assert!(Instant::now() < deadline, "pause did not start");
        std::thread::sleep(Duration::from_millis(50));
    };
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("pause's status");
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("NSpid:") && l.trim_end().ends_with("\t1")),
        "pause is not PID 1 of its namespace:\n{status}"
    );
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("65534")),
        "pause does not run as 65534:\n{status}"
    );
    // An orphan in the pause container's PID namespace: the shell exits at once, its
    // `sleep` is re-parented to pause and, once it exits, must not stay a zombie.
    let orphan = Command::new("nsenter")
        .args(["--target", &pid.to_string(), "--pid", "--"])
        .args(["sh", "-c", "sleep 1 >/dev/null 2>&1 & echo $!"])
        .output()
        .expect("nsenter into the pause container");
    assert!(orphan.status.success(), "nsenter: {}", text(&orphan));
    // `$!` is the PID inside the namespace; find its host PID among pause's children.
    std::thread::sleep(Duration::from_millis(200));
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .expect("pause's children");
    assert!(
        !children.trim().is_empty(),
        "the orphan was not re-parented to pause"
    );
    let child: u32 = children
        .split_whitespace()
        .next()
        .and_then(|c| c.parse().ok())
        .expect("a child pid");
    let deadline = Instant::now() + Duration::from_secs(10);
    while Path::new(&format!("/proc/{child}")).exists() {
        assert!(
            Instant::now() < deadline,
            "the orphan {child} was not reaped (zombie under pause)"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    containerd.ok(&["tasks", "kill", "--signal", "SIGTERM", id]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = run.try_wait().expect("wait for ctr run") {
            break status;
        }
        assert!(Instant::now() < deadline, "pause ignored SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = run.wait_with_output().expect("ctr run's output");
    assert!(
        status.success(),
        "pause exited with {status} on SIGTERM: {}",
        text(&out)
    );
}
