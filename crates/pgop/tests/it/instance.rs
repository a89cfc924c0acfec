//! `pgop instance run` as a pod runs it, against a real API server (testenv) and a real
//! PostgreSQL: it reads its role from the PostgresCluster status and its credentials from
//! the cluster's Secrets, follows spec changes, and stops cleanly on SIGTERM.
//!
//! Why this file stays whole: it is the scenarios of one subject, `pgop instance run`
//! against a real API server and PostgreSQL, all on the same fixtures: the cluster `demo`
//! (`cluster`), whose status each test writes as the operator would (`set_status`), and
//! managers run against it (`Manager`, `pair`, `InProcess`).

use crate::common;

use common::{eventually, secret};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use pgop_api::PostgresCluster;
use std::io::{Read, Write};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

type Result<T = (), E = Box<dyn std::error::Error>> = std::result::Result<T, E>;

const PASSWORD: &str = "app-password";

/// The manager process, its PostgreSQL and its directory, all gone on drop.
struct Manager {
    child: Child,
    dir: PathBuf,
    name: String,
    ip: String,
    pg_port: u16,
    http_port: u16,
    /// More environment for the next (re)start (the major to run, an upgrade).
    env: Vec<(&'static str, String)>,
}

impl Manager {
    /// Starts `pgop instance run` as the pod `name` with the pod IP `ip` would.
    fn spawn(
        plane: &pgop_testenv::ControlPlane,
        namespace: &str,
        name: &str,
        ip: &str,
        pg_port: u16,
    ) -> Result<Self> {
        Self::spawn_with(plane, namespace, name, ip, pg_port, Vec::new())
    }

    /// [`Manager::spawn`] with more environment (`env`, kept for restarts).
    fn spawn_with(
        plane: &pgop_testenv::ControlPlane,
        namespace: &str,
        name: &str,
        ip: &str,
        pg_port: u16,
        env: Vec<(&'static str, String)>,
    ) -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("pgop-{namespace}-{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        postgres_dir(&dir)?;
        postgres_dir(&dir.join("data"))?;
        postgres_dir(&dir.join("run"))?;
        let mut manager = Self {
            child: Command::new("true").spawn()?,
            dir,
            name: name.to_string(),
            ip: ip.to_string(),
            pg_port,
            http_port: free_port()?,
            env,
        };
        manager.child.wait()?;
        manager.restart(plane, namespace)?;
        Ok(manager)
    }

    /// Starts the manager process again on the same directories.
    fn restart(&mut self, plane: &pgop_testenv::ControlPlane, namespace: &str) -> Result {
        self.child = Command::new(env!("CARGO_BIN_EXE_pgop"))
            .args(["instance", "run", "--resync", "1"])
            .env("KUBECONFIG", plane.kubeconfig())
            .env("POD_NAME", &self.name)
            .env("POD_NAMESPACE", namespace)
            .env("POD_IP", &self.ip)
            .env("PGOP_CLUSTER", "demo")
            .env("PGDATA", self.pgdata())
            .env("PGOP_SOCKET_DIR", self.dir.join("run"))
            .env("PGOP_PG_PORT", self.pg_port.to_string())
            .env("PGOP_LISTEN", format!("127.0.0.1:{}", self.http_port))
            .env("PGOP_STOP_TIMEOUT", "3")
            .envs(self.env.iter().map(|(k, v)| (*k, v)))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()?;
        Ok(())
    }

    fn pgdata(&self) -> PathBuf {
        self.dir.join("data/pgdata")
    }

    fn postmaster_pid(&self) -> Option<i32> {
        std::fs::read_to_string(self.pgdata().join("postmaster.pid"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
    }

    fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.http_port, path)
    }

    fn pg_status(&self) -> Option<serde_json::Value> {
        let (code, body) = self.get("/pg/status")?;
        (code == 200).then(|| serde_json::from_str(&body).ok())?
    }

    /// The node is lost: the manager and every PostgreSQL process get SIGKILL.
    fn kill_hard(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(pid) = self.postmaster_pid() {
            // SAFETY: kill has no memory-safety preconditions; -pid is the server's group.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
            // A restarted pod has a fresh PID namespace; here the dead postmaster must be
            // reaped first, or its pid in postmaster.pid would still look alive.
            let deadline = Instant::now() + Duration::from_secs(10);
            // SAFETY: signal 0 only checks whether the process exists.
            while unsafe { libc::kill(pid, 0) } == 0 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// SIGTERM, as the kubelet stops a pod; waits for the exit (at most 15 s).
    async fn terminate(&mut self) -> Result<std::process::ExitStatus> {
        let postmaster = self.postmaster_pid();
        let sigterm = Instant::now();
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let exit = loop {
            if let Some(exit) = self.child.try_wait()? {
                break exit;
            }
            assert!(
                sigterm.elapsed() < Duration::from_secs(15),
                "pgop instance run ignored SIGTERM"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        if let Some(pid) = postmaster {
            // SAFETY: signal 0 only checks that the process group exists.
            assert!(
                unsafe { libc::kill(-pid, 0) } != 0,
                "PostgreSQL outlived its manager"
            );
        }
        assert!(
            !self.pgdata().join("postmaster.pid").exists(),
            "not a clean shutdown"
        );
        Ok(exit)
    }
}

impl Drop for Manager {
    fn drop(&mut self) {
        self.kill_hard();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn postgres_dir(path: &Path) -> Result {
    std::fs::DirBuilder::new()
        .mode(0o700)
        .recursive(true)
        .create(path)?;
    if let Some(user) = pgop_instance::RunAs::when_root("postgres")? {
        user.chown(path)?;
    }
    Ok(())
}

fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(15)))
        .ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let code = response.split(' ').nth(1)?.parse().ok()?;
    Some((code, response.split_once("\r\n\r\n")?.1.to_string()))
}

async fn app(host: &str, pg_port: u16) -> Option<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::Config::new()
        .host(host)
        .port(pg_port)
        .user("app")
        .password(PASSWORD)
        .dbname("app")
        .ssl_mode(tokio_postgres::config::SslMode::Require)
        .connect(pgop_tls::postgres::PostgresTls::without_verification().ok()?)
        .await
        .ok()?;
    tokio::spawn(connection);
    Some(client)
}

async fn show_work_mem(pg_port: u16) -> Option<String> {
    let client = app("127.0.0.1", pg_port).await?;
    client
        .query_one("SHOW work_mem", &[])
        .await
        .ok()?
        .try_get(0)
        .ok()
}

/// The Secrets and the PostgresCluster `demo` the operator would have created.
async fn cluster(
    client: &kube::Client,
    namespace: &str,
    spec: serde_json::Value,
) -> Result<Api<PostgresCluster>> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let pp = PostParams::default();
    let app = [
        ("username", "app"),
        ("password", PASSWORD),
        ("dbname", "app"),
    ];
    secrets.create(&pp, &secret("demo-app", &app)).await?;
    let replication = [("username", "streaming_replica"), ("password", "r")];
    secrets
        .create(&pp, &secret("demo-replication", &replication))
        .await?;
    for tls in common::postgres_tls_secrets("demo").1 {
        secrets.create(&pp, &tls).await?;
    }
    let clusters: Api<PostgresCluster> = Api::namespaced(client.clone(), namespace);
    let cluster: PostgresCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "database.example.com/v1alpha1",
        "kind": "PostgresCluster",
        "metadata": {"name": "demo"},
        "spec": spec,
    }))?;
    clusters.create(&pp, &cluster).await?;
    Ok(clusters)
}

async fn set_status(clusters: &Api<PostgresCluster>, status: serde_json::Value) -> Result {
    let patch = serde_json::json!({ "status": status });
    clusters
        .patch_status("demo", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instance_run_becomes_the_primary_the_cluster_status_names_and_stops_on_sigterm() -> Result
{
    let plane = pgop_testenv::shared().await?;
    let client = plane.client()?;
    common::install_crds(&client).await?;
    let ns = pgop_testenv::TestNamespace::create(plane.config(), "instance-run").await?;
    let clusters = cluster(
        &client,
        ns.name(),
        serde_json::json!({"replicas": 1, "storage": {"size": "1Gi"},
                           "postgresql": {"parameters": {"work_mem": "8MB"}}}),
    )
    .await?;
    let mut manager = Manager::spawn(plane, ns.name(), "demo-1", "127.0.0.1", free_port()?)?;
    let (http_port, pg_port) = (manager.http_port, manager.pg_port);

    // No role in the status yet: the manager waits and serves "not ready".
    let (code, _) = eventually("the HTTP endpoints", Duration::from_secs(30), || async {
        http_get(http_port, "/readyz")
    })
    .await;
    assert_eq!(code, 503);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !manager.pgdata().join("PG_VERSION").exists(),
        "no initdb without a role"
    );

    set_status(
        &clusters,
        serde_json::json!({"targetPrimary": "demo-1", "currentPrimary": "demo-1"}),
    )
    .await?;
    eventually("/readyz", Duration::from_secs(60), || async {
        (http_get(http_port, "/readyz")?.0 == 200).then_some(())
    })
    .await;
    let (_, body) = http_get(http_port, "/pg/status").ok_or("no /pg/status")?;
    let status: serde_json::Value = serde_json::from_str(&body)?;
    assert_eq!(status["role"], "primary", "{status}");
    assert_eq!(status["timeline"], 1, "{status}");
    let work_mem = eventually("the spec's work_mem", Duration::from_secs(30), || async {
        show_work_mem(pg_port).await.filter(|w| w == "8MB")
    })
    .await;
    assert_eq!(work_mem, "8MB");

    let change = serde_json::json!({"spec": {"postgresql": {"parameters": {"work_mem": "16MB"}}}});
    clusters
        .patch("demo", &PatchParams::default(), &Patch::Merge(&change))
        .await?;
    eventually("the changed work_mem", Duration::from_secs(30), || async {
        show_work_mem(pg_port).await.filter(|w| w == "16MB")
    })
    .await;

    // A parameter that needs a restart waits until the operator's rolling restart names
    // the instance (the restart annotation alone restarts nothing: it goes through the
    // operator, one instance at a time).
    let change = serde_json::json!({"spec": {"postgresql": {"parameters": {"work_mem": "16MB", "max_connections": "42"}}}});
    clusters
        .patch("demo", &PatchParams::default(), &Patch::Merge(&change))
        .await?;
    eventually(
        "pendingRestart on /pg/status",
        Duration::from_secs(30),
        || async { (manager.pg_status()?["pendingRestart"] == true).then_some(()) },
    )
    .await;
    let started = manager.pg_status().ok_or("no status")?["postmasterStartTime"].clone();
    assert!(started.is_string(), "{started}");
    let restart = serde_json::json!({"metadata": {"annotations": {pgop_api::constants::ANNOTATION_RESTART: "1"}}});
    clusters
        .patch("demo", &PatchParams::default(), &Patch::Merge(&restart))
        .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let now = manager.pg_status().ok_or("no status")?;
    assert_eq!(now["postmasterStartTime"], started, "no restart yet");
    set_status(&clusters, serde_json::json!({"restartInstance": "demo-1"})).await?;
    eventually("the restart applied", Duration::from_secs(60), || async {
        let status = manager.pg_status()?;
        (status["pendingRestart"] == false && status["running"] == true).then_some(())
    })
    .await;
    let now = manager.pg_status().ok_or("no status")?;
    assert_ne!(now["postmasterStartTime"], started);

    // The restart annotation as the operator records it: a postmaster started before the
    // request restarts when named, once.
    let restarted = now["postmasterStartTime"].clone();
    let now = k8s_openapi::jiff::Timestamp::now();
    set_status(
        &clusters,
        serde_json::json!({"restartInstance": null,
                           "restartRequested": {"value": "2", "requestedAt": now.to_string()}}),
    )
    .await?;
    set_status(&clusters, serde_json::json!({"restartInstance": "demo-1"})).await?;
    let again = eventually(
        "a restart for the request",
        Duration::from_secs(60),
        || async {
            let t = manager.pg_status()?["postmasterStartTime"].clone();
            (t.is_string() && t != restarted).then_some(t)
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let now = manager.pg_status().ok_or("no status")?;
    assert_eq!(now["postmasterStartTime"], again, "restarted once");

    let exit = manager.terminate().await?;
    assert!(exit.success(), "{exit:?}");
    ns.delete().await?;
    Ok(())
}

/// A Pod object with an IP, as the kubelet would report it (no kubelet runs here): the
/// managers find their primary through it.
async fn pod(client: &kube::Client, namespace: &str, name: &str, ip: &str) -> Result {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "postgres", "image": "pgop"}]},
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    let status = serde_json::json!({"status": {"podIP": ip, "podIPs": [{"ip": ip}]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}

async fn count(host: &str, pg_port: u16) -> Option<i64> {
    let client = app(host, pg_port).await?;
    client
        .query_one("SELECT count(*) FROM t", &[])
        .await
        .ok()?
        .try_get(0)
        .ok()
}

async fn role_of(manager: &Manager) -> Option<String> {
    let status = manager.pg_status()?;
    Some(status["role"].as_str()?.to_string())
}

/// A primary that is ready: bootstrapped to the end (roles and database created), not only
/// answering as a primary, which it already does in the middle of its bootstrap.
async fn ready_primary(manager: &Manager) -> Option<()> {
    (role_of(manager).await? == "primary" && manager.get("/readyz")?.0 == 200).then_some(())
}

/// Two `pgop instance run` processes (pod IPs 127.0.0.2 and .3): the second clones the
/// first; when the first's node is lost and the status names the second, it promotes; the
/// first, started again, rejoins through pg_rewind as a standby of the second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instance_run_follows_a_failover_in_the_cluster_status() -> Result {
    let plane = pgop_testenv::shared().await?;
    let client = plane.client()?;
    common::install_crds(&client).await?;
    let ns = pgop_testenv::TestNamespace::create(plane.config(), "instance-failover").await?;
    let clusters = cluster(
        &client,
        ns.name(),
        serde_json::json!({"replicas": 2, "storage": {"size": "1Gi"}}),
    )
    .await?;
    let (ip1, ip2) = ("127.0.0.2", "127.0.0.3");
    pod(&client, ns.name(), "demo-1", ip1).await?;
    pod(&client, ns.name(), "demo-2", ip2).await?;
    set_status(
        &clusters,
        serde_json::json!({"targetPrimary": "demo-1", "currentPrimary": "demo-1",
                           "instances": [{"name": "demo-1", "serial": 1}, {"name": "demo-2", "serial": 2}]}),
    )
    .await?;
    // Every instance listens on the same port, each on its own pod IP.
    let pg_port = free_port()?;
    let mut first = Manager::spawn(plane, ns.name(), "demo-1", ip1, pg_port)?;
    let second = Manager::spawn(plane, ns.name(), "demo-2", ip2, pg_port)?;

    let wait = Duration::from_secs(60);
    let writer = eventually("demo-1 primary and ready", wait, || async {
        let ready = first.get("/readyz")?.0 == 200;
        (ready && role_of(&first).await? == "primary").then_some(())?;
        app(ip1, pg_port).await
    })
    .await;
    writer
        .batch_execute("CREATE TABLE t (id int); INSERT INTO t VALUES (1)")
        .await?;
    eventually("demo-2 streaming and ready", wait, || async {
        let ready = second.get("/readyz")?.0 == 200;
        (ready && role_of(&second).await? == "replica" && count(ip2, pg_port).await? == 1)
            .then_some(())
    })
    .await;

    first.kill_hard();
    let lost = Instant::now();
    set_status(&clusters, serde_json::json!({"targetPrimary": "demo-2"})).await?;
    let new_primary = app(ip2, pg_port).await.ok_or("no connection to demo-2")?;
    eventually("writes on demo-2", wait, || async {
        new_primary
            .batch_execute("INSERT INTO t VALUES (2)")
            .await
            .ok()
    })
    .await;
    eprintln!("status change to writable: {:?}", lost.elapsed());
    set_status(&clusters, serde_json::json!({"currentPrimary": "demo-2"})).await?;

    first.restart(plane, ns.name())?;
    eventually("demo-1 back as a standby of demo-2", wait, || async {
        (role_of(&first).await? == "replica" && count(ip1, pg_port).await? == 2).then_some(())
    })
    .await;
    let status = first.pg_status().ok_or("no status")?;
    assert_eq!(status["timeline"], 2, "{status}");
    assert!(first.get("/readyz").is_some_and(|(code, _)| code == 200));

    let mut second = second;
    for manager in [&mut first, &mut second] {
        let exit = manager.terminate().await?;
        assert!(exit.success(), "{exit:?}");
    }
    ns.delete().await?;
    Ok(())
}

/// The primary Lease's holder (`None`: absent or released).
async fn lease_holder(client: &kube::Client, namespace: &str) -> Option<String> {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), namespace);
    leases
        .get_opt(&pgop_api::constants::primary_lease_name("demo"))
        .await
        .ok()??
        .spec?
        .holder_identity
        .filter(|h| !h.is_empty())
}

/// Two managers, demo-1 the primary and demo-2 its streaming standby, `rows` rows in `t`.
struct Pair {
    clusters: Api<PostgresCluster>,
    first: Manager,
    second: Manager,
    pg_port: u16,
}

const IP1: &str = "127.0.0.2";
const IP2: &str = "127.0.0.3";

async fn pair(
    plane: &pgop_testenv::ControlPlane,
    client: &kube::Client,
    namespace: &str,
    rows: i64,
) -> Result<Pair> {
    let clusters = cluster(
        client,
        namespace,
        serde_json::json!({"replicas": 2, "storage": {"size": "1Gi"}, "failoverDelay": 0}),
    )
    .await?;
    pod(client, namespace, "demo-1", IP1).await?;
    pod(client, namespace, "demo-2", IP2).await?;
    set_status(
        &clusters,
        serde_json::json!({"targetPrimary": "demo-1", "currentPrimary": "demo-1",
                           "instances": [{"name": "demo-1", "serial": 1}, {"name": "demo-2", "serial": 2}]}),
    )
    .await?;
    let pg_port = free_port()?;
    let first = Manager::spawn(plane, namespace, "demo-1", IP1, pg_port)?;
    let second = Manager::spawn(plane, namespace, "demo-2", IP2, pg_port)?;
    let wait = Duration::from_secs(60);
    let writer = eventually("demo-1 primary and ready", wait, || async {
        let ready = first.get("/readyz")?.0 == 200;
        (ready && role_of(&first).await? == "primary").then_some(())?;
        app(IP1, pg_port).await
    })
    .await;
    writer
        .batch_execute(&format!(
            "CREATE TABLE t (id int); INSERT INTO t SELECT generate_series(1, {rows})"
        ))
        .await?;
    eventually("demo-2 streaming and ready", wait, || async {
        let ready = second.get("/readyz")?.0 == 200;
        (ready && role_of(&second).await? == "replica" && count(IP2, pg_port).await? == rows)
            .then_some(())
    })
    .await;
    Ok(Pair {
        clusters,
        first,
        second,
        pg_port,
    })
}

/// A switchover through the status: the old primary steps down (checkpoint, clean
/// shutdown, Lease released) before the new one promotes — never two primaries — and every
/// row committed before is on the new primary; the old one waits, stopped, until the new
/// primary is confirmed in `currentPrimary`, then rejoins as its standby.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instance_run_switches_over_cleanly_through_the_primary_lease() -> Result {
    let plane = pgop_testenv::shared().await?;
    let client = plane.client()?;
    common::install_crds(&client).await?;
    let ns = pgop_testenv::TestNamespace::create(plane.config(), "instance-switchover").await?;
    let Pair {
        clusters,
        mut first,
        mut second,
        pg_port,
    } = pair(plane, &client, ns.name(), 1000).await?;
    assert_eq!(
        lease_holder(&client, ns.name()).await.as_deref(),
        Some("demo-1")
    );
    // Committed up to the last moment (asynchronous replication: the clean shutdown is
    // what ships the tail of the WAL).
    let writer = app(IP1, pg_port).await.ok_or("no connection to demo-1")?;
    writer
        .batch_execute("INSERT INTO t SELECT generate_series(1001, 2000)")
        .await?;

    set_status(&clusters, serde_json::json!({"targetPrimary": "demo-2"})).await?;
    let asked = Instant::now();
    let wait = Duration::from_secs(60);
    eventually("demo-2 primary", wait, || async {
        let (one, two) = (role_of(&first).await, role_of(&second).await);
        assert!(
            !(one.as_deref() == Some("primary") && two.as_deref() == Some("primary")),
            "two primaries"
        );
        (two? == "primary").then_some(())
    })
    .await;
    eprintln!(
        "switchover: status change to demo-2 primary in {:?}",
        asked.elapsed()
    );
    assert!(
        asked.elapsed() < Duration::from_secs(8),
        "the standby waited for the Lease to expire: {:?}",
        asked.elapsed()
    );
    assert_eq!(role_of(&first).await.as_deref(), Some("stopped"));
    assert_eq!(
        lease_holder(&client, ns.name()).await.as_deref(),
        Some("demo-2")
    );
    assert_eq!(count(IP2, pg_port).await, Some(2000), "rows lost");

    // Not confirmed yet: the old primary stays stopped.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(role_of(&first).await.as_deref(), Some("stopped"));
    set_status(&clusters, serde_json::json!({"currentPrimary": "demo-2"})).await?;
    let new_primary = app(IP2, pg_port).await.ok_or("no connection to demo-2")?;
    new_primary
        .batch_execute("INSERT INTO t VALUES (2001)")
        .await?;
    eventually("demo-1 back as a standby of demo-2", wait, || async {
        (role_of(&first).await? == "replica" && count(IP1, pg_port).await? == 2001).then_some(())
    })
    .await;
    let status = first.pg_status().ok_or("no status")?;
    assert_eq!(status["timeline"], 2, "{status}");

    for manager in [&mut first, &mut second] {
        let exit = manager.terminate().await?;
        assert!(exit.success(), "{exit:?}");
    }
    assert_eq!(
        lease_holder(&client, ns.name()).await,
        None,
        "released on SIGTERM"
    );
    ns.delete().await?;
    Ok(())
}

/// kill -9 of the primary's postmaster: the manager does not restart it, releases the
/// Lease at once, and holds off; the standby the status then names takes the Lease without
/// waiting for it to expire and promotes; once confirmed, the old primary rejoins through
/// pg_rewind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_primary_releases_the_lease_and_is_not_restarted_before_the_hold_off() -> Result {
    let plane = pgop_testenv::shared().await?;
    let client = plane.client()?;
    common::install_crds(&client).await?;
    let ns = pgop_testenv::TestNamespace::create(plane.config(), "instance-crash").await?;
    let Pair {
        clusters,
        mut first,
        mut second,
        pg_port,
    } = pair(plane, &client, ns.name(), 100).await?;
    assert_eq!(
        lease_holder(&client, ns.name()).await.as_deref(),
        Some("demo-1")
    );

    let postmaster = first.postmaster_pid().ok_or("no postmaster.pid")?;
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(postmaster, libc::SIGKILL) };
    let crashed = Instant::now();
    eventually("the Lease released", Duration::from_secs(5), || async {
        lease_holder(&client, ns.name())
            .await
            .is_none()
            .then_some(())
    })
    .await;
    let released = crashed.elapsed();
    eprintln!("crash: Lease released after {released:?}");
    assert!(
        released < Duration::from_secs(2),
        "released after {released:?}"
    );

    // Held off (failoverDelay 0 + 10 s): not restarted meanwhile.
    while crashed.elapsed() < Duration::from_secs(6) {
        assert_eq!(role_of(&first).await.as_deref(), Some("stopped"));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The operator fails over: the standby takes the released Lease at once.
    set_status(&clusters, serde_json::json!({"targetPrimary": "demo-2"})).await?;
    let asked = Instant::now();
    let new_primary = app(IP2, pg_port).await.ok_or("no connection to demo-2")?;
    let wait = Duration::from_secs(60);
    eventually("writes on demo-2", wait, || async {
        new_primary
            .batch_execute("INSERT INTO t VALUES (101)")
            .await
            .ok()
    })
    .await;
    eprintln!("crash: status change to writable in {:?}", asked.elapsed());
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(
        lease_holder(&client, ns.name()).await.as_deref(),
        Some("demo-2")
    );
    // Past the hold-off, no longer named: still stopped until confirmed.
    while crashed.elapsed() < Duration::from_secs(12) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(role_of(&first).await.as_deref(), Some("stopped"));

    set_status(&clusters, serde_json::json!({"currentPrimary": "demo-2"})).await?;
    eventually("demo-1 back as a standby of demo-2", wait, || async {
        (role_of(&first).await? == "replica" && count(IP1, pg_port).await? == 101).then_some(())
    })
    .await;
    let status = first.pg_status().ok_or("no status")?;
    assert_eq!(status["timeline"], 2, "{status}");

    for manager in [&mut first, &mut second] {
        let exit = manager.terminate().await?;
        assert!(exit.success(), "{exit:?}");
    }
    ns.delete().await?;
    Ok(())
}

/// A single primary: its Lease overwritten by someone else, it stops PostgreSQL at once
/// (self-fencing) and does not start again until it may take the Lease over (the intruder
/// never renews: after the Lease duration); a crash of its postmaster is held off for
/// `failoverDelay` + 10 s, then, still named, it restarts as the primary with the Lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_fences_itself_when_its_lease_is_taken_and_restarts_a_crash_after_the_hold_off()
-> Result {
    let plane = pgop_testenv::shared().await?;
    let client = plane.client()?;
    common::install_crds(&client).await?;
    let ns = pgop_testenv::TestNamespace::create(plane.config(), "instance-fence").await?;
    let clusters = cluster(
        &client,
        ns.name(),
        serde_json::json!({"replicas": 1, "storage": {"size": "1Gi"}, "failoverDelay": 1}),
    )
    .await?;
    set_status(
        &clusters,
        serde_json::json!({"targetPrimary": "demo-1", "currentPrimary": "demo-1"}),
    )
    .await?;
    let mut manager = Manager::spawn(plane, ns.name(), "demo-1", "127.0.0.1", free_port()?)?;
    let wait = Duration::from_secs(60);
    // Ready, not only answering: a Lease taken in the middle of the bootstrap makes the
    // manager bootstrap again once it has it back.
    eventually("demo-1 primary and ready", wait, || async {
        ready_primary(&manager).await
    })
    .await;
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), ns.name());
    // The holder renews every 2 s: a write that meets its renewal is read and written again.
    loop {
        let mut lease = leases.get("demo").await?;
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = Some("intruder".into());
        }
        match leases.replace("demo", &PostParams::default(), &lease).await {
            Ok(_) => break,
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(other) => return Err(other.into()),
        }
    }
    let stolen = Instant::now();
    eventually("PostgreSQL stopped", Duration::from_secs(5), || async {
        (role_of(&manager).await? == "stopped").then_some(())
    })
    .await;
    let fenced = stolen.elapsed();
    eprintln!("fence: stopped {fenced:?} after the Lease was taken");
    assert!(fenced < Duration::from_secs(4), "{fenced:?}");
    let back = eventually("demo-1 primary again", Duration::from_secs(30), || async {
        ready_primary(&manager).await.map(|()| stolen.elapsed())
    })
    .await;
    eprintln!("fence: primary again after {back:?}");
    assert!(
        back >= Duration::from_secs(10),
        "restarted without the Lease: {back:?}"
    );
    assert_eq!(
        lease_holder(&client, ns.name()).await.as_deref(),
        Some("demo-1")
    );

    let postmaster = manager.postmaster_pid().ok_or("no postmaster.pid")?;
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(postmaster, libc::SIGKILL) };
    let crashed = Instant::now();
    eventually("the Lease released", Duration::from_secs(5), || async {
        lease_holder(&client, ns.name())
            .await
            .is_none()
            .then_some(())
    })
    .await;
    let back = eventually(
        "demo-1 primary after the crash",
        Duration::from_secs(40),
        || async { (role_of(&manager).await? == "primary").then_some(crashed.elapsed()) },
    )
    .await;
    eprintln!("crash: primary again after {back:?}");
    assert!(
        back >= Duration::from_secs(11),
        "restarted during the hold-off: {back:?}"
    );
    assert_eq!(
        lease_holder(&client, ns.name()).await.as_deref(),
        Some("demo-1")
    );
    let acquired = |lease: k8s_openapi::api::coordination::v1::Lease| {
        lease.spec.and_then(|s| s.acquire_time).map(|t| t.0)
    };
    let before = acquired(leases.get("demo").await?).ok_or("no acquireTime")?;

    // The container killed (manager and PostgreSQL at once) while primary: the next
    // manager finds the primary's data not shut down and the Lease naming its Pod. It
    // releases the Lease and holds off as after a crash (the operator may be failing over
    // on what the standbys received), then, still named, takes the Lease anew.
    manager.kill_hard();
    let killed = Instant::now();
    manager.restart(plane, ns.name())?;
    eventually("the inherited Lease released", wait, || async {
        lease_holder(&client, ns.name())
            .await
            .is_none()
            .then_some(())
    })
    .await;
    eventually("the restarted manager answers", wait, || async {
        (role_of(&manager).await? == "stopped").then_some(())
    })
    .await;
    let back = eventually(
        "demo-1 primary after the killed container",
        Duration::from_secs(40),
        || async { (role_of(&manager).await? == "primary").then_some(killed.elapsed()) },
    )
    .await;
    eprintln!("killed container: primary again after {back:?}");
    assert!(
        back >= Duration::from_secs(11),
        "restarted as the primary during the hold-off: {back:?}"
    );
    let after = acquired(leases.get("demo").await?).ok_or("no acquireTime")?;
    assert!(
        after > before,
        "the Lease taken anew: {before} then {after}"
    );
    let exit = manager.terminate().await?;
    assert!(exit.success(), "{exit:?}");
    ns.delete().await?;
    Ok(())
}

/// `pgop instance run`'s loop in this process (the same [`pgop_instance::run::run`] the
/// binary calls), with a kube client the test chooses: here one that counts requests.
struct InProcess {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), pgop_instance::run::Error>>,
    dir: PathBuf,
    http_port: u16,
}

impl InProcess {
    fn start(
        client: kube::Client,
        namespace: &str,
        name: &str,
        ip: &str,
        pg_port: u16,
    ) -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("pgop-{namespace}-{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        postgres_dir(&dir)?;
        postgres_dir(&dir.join("data"))?;
        postgres_dir(&dir.join("run"))?;
        let http_port = free_port()?;
        let settings = pgop_instance::run::Settings {
            pod_name: name.to_string(),
            namespace: namespace.to_string(),
            cluster: "demo".to_string(),
            listen_addresses: ip.to_string(),
            pg_port,
            pgdata: dir.join("data/pgdata"),
            socket_dir: dir.join("run"),
            wal_dir: None,
            http_listen: format!("127.0.0.1:{http_port}").parse()?,
            tls_listen: "127.0.0.1:0".parse()?,
            binaries: pgop_instance::Binaries::locate(None)?,
            run_as: pgop_instance::RunAs::when_root("postgres")?,
            stop_timeout: Duration::from_secs(3),
            // The default of `pgop instance run`: any reaction faster than this came from
            // a watch.
            resync: Duration::from_secs(60),
            pgop_binary: PathBuf::from(env!("CARGO_BIN_EXE_pgop")),
            backup_volume_path: dir.join("backup"),
            version: "test".to_string(),
            upgrade: None,
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(pgop_instance::run::run(client, settings, async move {
            let _ = stopped.await;
        }));
        Ok(Self {
            stop: Some(stop),
            task,
            dir,
            http_port,
        })
    }

    async fn role(&self) -> Option<String> {
        let (code, body) = http_get(self.http_port, "/pg/status")?;
        let status: serde_json::Value =
            (code == 200).then(|| serde_json::from_str(&body).ok())??;
        Some(status["role"].as_str()?.to_string())
    }

    fn ready(&self) -> bool {
        http_get(self.http_port, "/readyz").is_some_and(|(code, _)| code == 200)
    }

    /// Stops the manager as SIGTERM would: PostgreSQL shut down cleanly.
    async fn stop(mut self) -> Result {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(30), &mut self.task).await???;
        Ok(())
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        self.task.abort();
        let pid = std::fs::read_to_string(self.dir.join("data/pgdata/postmaster.pid"))
            .ok()
            .and_then(|s| s.lines().next()?.trim().parse::<i32>().ok());
        if let Some(pid) = pid {
            // SAFETY: kill has no memory-safety preconditions; -pid is the server's group.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A primary and its streaming standby in their steady state send no read (GET or LIST) to
/// the API server, while the operator's side keeps writing status that does not concern
/// them (LSNs, readiness, conditions): the managers keep their cluster, Secrets and the
/// primary's Pod from watches, and such writes do not wake them. A status change that
/// concerns them (a switchover's `targetPrimary`) still takes effect within seconds, well
/// before the 60 s resync.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn managers_in_their_steady_state_send_no_reads_and_still_follow_the_status() -> Result {
    let plane = pgop_testenv::shared().await?;
    let client = plane.client()?;
    common::install_crds(&client).await?;
    let ns = pgop_testenv::TestNamespace::create(plane.config(), "instance-steady").await?;
    let n = ns.name();
    let clusters = cluster(
        &client,
        n,
        serde_json::json!({"replicas": 2, "storage": {"size": "1Gi"}, "failoverDelay": 0}),
    )
    .await?;
    pod(&client, n, "demo-1", IP1).await?;
    pod(&client, n, "demo-2", IP2).await?;
    let instances = |lsn: &str, ready: bool| {
        serde_json::json!([
            {"name": "demo-1", "serial": 1, "ready": true, "receivedLsn": lsn},
            {"name": "demo-2", "serial": 2, "ready": ready, "receivedLsn": lsn},
        ])
    };
    set_status(
        &clusters,
        serde_json::json!({"targetPrimary": "demo-1", "currentPrimary": "demo-1",
                           "phase": "Ready", "instances": instances("0/1000000", true)}),
    )
    .await?;
    let (primary_requests, standby_requests) =
        (common::Requests::default(), common::Requests::default());
    let pg_port = free_port()?;
    let primary = InProcess::start(
        common::counting_client(plane.config(), &primary_requests)?,
        n,
        "demo-1",
        IP1,
        pg_port,
    )?;
    let standby = InProcess::start(
        common::counting_client(plane.config(), &standby_requests)?,
        n,
        "demo-2",
        IP2,
        pg_port,
    )?;
    let wait = Duration::from_secs(90);
    eventually("demo-1 primary and ready", wait, || async {
        (primary.ready() && primary.role().await? == "primary").then_some(())
    })
    .await;
    eventually("demo-2 streaming and ready", wait, || async {
        (standby.ready() && standby.role().await? == "replica").then_some(())
    })
    .await;
    // Whatever was under way at start (the first passes, the standby's first
    // confirmations) is over within a few seconds.
    tokio::time::sleep(Duration::from_secs(5)).await;

    let (primary_mark, standby_mark) = (primary_requests.len(), standby_requests.len());
    let steady = Instant::now();
    // A number of writes, not a duration: a loaded machine once made only 19 in 30 s.
    let mut writes = 0;
    while writes < 25 {
        writes += 1;
        let lsn = format!("0/{:X}", 0x100_0000 + writes * 0x1000);
        let condition = serde_json::json!([{"type": "Ready", "status": "True",
            "reason": "Ready", "message": format!("write {writes}"),
            "lastTransitionTime": "2026-01-01T00:00:00Z"}]);
        set_status(
            &clusters,
            serde_json::json!({"instances": instances(&lsn, writes % 2 == 0),
                               "readyReplicas": 1 + writes % 2, "conditions": condition}),
        )
        .await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let (primary_sent, standby_sent) = (
        primary_requests.since(primary_mark),
        standby_requests.since(standby_mark),
    );
    eprintln!(
        "{writes} status writes in {:?}; the primary sent {} requests ({:?}...), the standby {} ({:?})",
        steady.elapsed(),
        primary_sent.len(),
        primary_sent.first(),
        standby_sent.len(),
        standby_sent
    );
    assert_eq!(
        primary_requests.reads_since(primary_mark),
        Vec::<String>::new(),
        "the primary read"
    );
    assert_eq!(
        standby_requests.reads_since(standby_mark),
        Vec::<String>::new(),
        "the standby read"
    );
    // The primary's only requests are its Lease renewals (an update every 2 s), and
    // perhaps a watch started again.
    assert!(
        primary_sent
            .iter()
            .all(|r| r.starts_with("PUT ") && r.contains("/leases/") || common::is_watch(r)),
        "{primary_sent:?}"
    );
    assert!(
        standby_sent.iter().all(|r| common::is_watch(r)),
        "{standby_sent:?}"
    );

    // A switchover: the status names demo-2. Both managers act on it within seconds, far
    // sooner than their 60 s resync.
    let named = Instant::now();
    set_status(&clusters, serde_json::json!({"targetPrimary": "demo-2"})).await?;
    eventually("demo-2 promoted", Duration::from_secs(30), || async {
        (standby.role().await? == "primary").then_some(())
    })
    .await;
    eprintln!("targetPrimary to demo-2 promoted: {:?}", named.elapsed());
    set_status(&clusters, serde_json::json!({"currentPrimary": "demo-2"})).await?;
    eventually("demo-1 rejoined as a standby", wait, || async {
        (primary.role().await? == "replica").then_some(())
    })
    .await;
    primary.stop().await?;
    standby.stop().await?;
    ns.delete().await?;
    Ok(())
}

/// The major upgrade as the operator drives it, through `pgop instance run`: 15's data
/// with a column pg_upgrade refuses is not upgraded (the refusal on `/pg/status`, alive,
/// not ready, PostgreSQL stopped); without an upgrade request 18 never starts 15's data;
/// 15 still runs it; once the column is gone the upgrade (by copy) runs before the first
/// start and the primary runs 18 with its data, on the next timeline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instance_run_upgrades_the_primary_in_place_or_reports_why_not() -> Result {
    if pgop_instance::Binaries::for_major(18, None).is_err() {
        panic!("PostgreSQL 18 is missing: run hack/install-postgres18.sh");
    }
    let plane = pgop_testenv::shared().await?;
    let client = plane.client()?;
    common::install_crds(&client).await?;
    let ns = pgop_testenv::TestNamespace::create(plane.config(), "instance-upgrade").await?;
    let clusters = cluster(
        &client,
        ns.name(),
        serde_json::json!({"replicas": 1, "storage": {"size": "1Gi"}}),
    )
    .await?;
    set_status(
        &clusters,
        serde_json::json!({"targetPrimary": "demo-1", "currentPrimary": "demo-1"}),
    )
    .await?;
    let on = |major: u32, upgrade: Option<&str>| {
        let mut env = vec![("PGOP_POSTGRES_MAJOR", major.to_string())];
        if let Some(mode) = upgrade {
            env.push(("PGOP_UPGRADE_FROM", "15".to_string()));
            env.push(("PGOP_UPGRADE_MODE", mode.to_string()));
        }
        env
    };
    let mut manager = Manager::spawn_with(
        plane,
        ns.name(),
        "demo-1",
        "127.0.0.1",
        free_port()?,
        on(15, None),
    )?;
    let pg_port = manager.pg_port;
    let wait = Duration::from_secs(60);
    eventually("the primary on 15", wait, || ready_primary(&manager)).await;
    let app15 = app("127.0.0.1", pg_port).await.ok_or("no app connection")?;
    app15
        .batch_execute(
            "CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t SELECT generate_series(1, 100);
             CREATE TABLE grants (a aclitem); INSERT INTO grants VALUES ('app=r/app')",
        )
        .await?;
    drop(app15);
    manager.terminate().await?;

    // Refused by pg_upgrade: reported, the manager stays up, PostgreSQL stays stopped.
    manager.env = on(18, Some("link"));
    manager.restart(plane, ns.name())?;
    let status = eventually("majorUpgradeError", wait, || async {
        let status = manager.pg_status()?;
        status["majorUpgradeError"].is_string().then_some(status)
    })
    .await;
    let error = status["majorUpgradeError"].as_str().unwrap_or_default();
    assert!(error.contains("aclitem"), "{status}");
    assert_eq!(status["running"], false, "{status}");
    assert_eq!(manager.get("/healthz").map(|(c, _)| c), Some(200));
    assert_eq!(manager.get("/readyz").map(|(c, _)| c), Some(503));
    assert!(
        manager.child.try_wait()?.is_none(),
        "the manager keeps running"
    );
    manager.terminate().await?;
    assert_eq!(
        std::fs::read_to_string(manager.pgdata().join("PG_VERSION"))?.trim(),
        "15"
    );

    // 18 without an upgrade request: 15's data is never started, and the primary says so.
    manager.env = on(18, None);
    manager.restart(plane, ns.name())?;
    let status = eventually("majorUpgradeError", wait, || async {
        let status = manager.pg_status()?;
        status["majorUpgradeError"].is_string().then_some(status)
    })
    .await;
    assert!(
        status["majorUpgradeError"]
            .as_str()
            .is_some_and(|e| e.contains("no major upgrade was requested")),
        "{status}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(manager.pg_status().ok_or("no status")?["running"], false);
    manager.terminate().await?;

    // Back on 15 to drop the column, then the upgrade.
    manager.env = on(15, None);
    manager.restart(plane, ns.name())?;
    eventually("the primary on 15 again", wait, || ready_primary(&manager)).await;
    let app15 = app("127.0.0.1", pg_port).await.ok_or("no app connection")?;
    app15.batch_execute("DROP TABLE grants").await?;
    drop(app15);
    manager.terminate().await?;

    manager.env = on(18, Some("copy"));
    manager.restart(plane, ns.name())?;
    eventually("the primary on 18", Duration::from_secs(120), || {
        ready_primary(&manager)
    })
    .await;
    let status = manager.pg_status().ok_or("no status")?;
    assert!(
        status["postgresVersion"]
            .as_str()
            .is_some_and(|v| v.starts_with("18")),
        "{status}"
    );
    assert_eq!(status["timeline"], 2, "{status}");
    assert!(status.get("majorUpgradeError").is_none(), "{status}");
    assert_eq!(count("127.0.0.1", pg_port).await, Some(100));
    let exit = manager.terminate().await?;
    assert!(exit.success(), "{exit:?}");
    ns.delete().await?;
    Ok(())
}
