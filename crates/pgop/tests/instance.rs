//! `pgop instance run` as a pod runs it, against a real API server (testenv) and a real
//! PostgreSQL: it reads its role from the PostgresCluster status and its credentials from
//! the cluster's Secrets, follows spec changes, and stops cleanly on SIGTERM.

use k8s_openapi::api::core::v1::Secret;
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
}

impl Manager {
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
}

impl Drop for Manager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(pid) = self.postmaster_pid() {
            // SAFETY: kill has no memory-safety preconditions; -pid is the server's group.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
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

async fn show_work_mem(pg_port: u16) -> Option<String> {
    let (client, connection) = tokio_postgres::Config::new()
        .host("127.0.0.1")
        .port(pg_port)
        .user("app")
        .password(PASSWORD)
        .dbname("app")
        .connect(tokio_postgres::NoTls)
        .await
        .ok()?;
    tokio::spawn(connection);
    client
        .query_one("SHOW work_mem", &[])
        .await
        .ok()?
        .try_get(0)
        .ok()
}

fn secret(name: &str, data: &[(&str, &str)]) -> Result<Secret> {
    let data: serde_json::Map<String, serde_json::Value> = data
        .iter()
        .map(|(k, v)| (k.to_string(), (*v).into()))
        .collect();
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "stringData": data,
    }))?)
}

async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instance_run_becomes_the_primary_the_cluster_status_names_and_stops_on_sigterm() -> Result
{
    let plane = pgop_testenv::shared().await?;
    let client = plane.client()?;
    pgop_testenv::crds::install(&client, pgop_api::crds()).await?;
    let ns = pgop_testenv::TestNamespace::create(plane.config(), "instance-run").await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns.name());
    let pp = PostParams::default();
    secrets
        .create(
            &pp,
            &secret(
                "demo-app",
                &[
                    ("username", "app"),
                    ("password", PASSWORD),
                    ("dbname", "app"),
                ],
            )?,
        )
        .await?;
    secrets
        .create(
            &pp,
            &secret(
                "demo-replication",
                &[("username", "streaming_replica"), ("password", "r")],
            )?,
        )
        .await?;
    let clusters: Api<PostgresCluster> = Api::namespaced(client.clone(), ns.name());
    let cluster: PostgresCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "database.example.com/v1alpha1",
        "kind": "PostgresCluster",
        "metadata": {"name": "demo"},
        "spec": {"replicas": 1, "storage": {"size": "1Gi"},
                 "postgresql": {"parameters": {"work_mem": "8MB"}}},
    }))?;
    clusters.create(&pp, &cluster).await?;

    let dir = std::env::temp_dir().join(format!("pgop-instance-run-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    postgres_dir(&dir)?;
    postgres_dir(&dir.join("data"))?;
    postgres_dir(&dir.join("run"))?;
    let (pg_port, http_port) = (free_port()?, free_port()?);
    let child = Command::new(env!("CARGO_BIN_EXE_pgop"))
        .args(["instance", "run", "--resync", "1"])
        .env("KUBECONFIG", plane.kubeconfig())
        .env("POD_NAME", "demo-1")
        .env("POD_NAMESPACE", ns.name())
        .env("POD_IP", "127.0.0.1")
        .env("PGOP_CLUSTER", "demo")
        .env("PGDATA", dir.join("data/pgdata"))
        .env("PGOP_SOCKET_DIR", dir.join("run"))
        .env("PGOP_PG_PORT", pg_port.to_string())
        .env("PGOP_LISTEN", format!("127.0.0.1:{http_port}"))
        .env("PGOP_STOP_TIMEOUT", "3")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()?;
    let mut manager = Manager { child, dir };

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

    let status =
        serde_json::json!({"status": {"targetPrimary": "demo-1", "currentPrimary": "demo-1"}});
    clusters
        .patch_status("demo", &PatchParams::default(), &Patch::Merge(&status))
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

    let postmaster = manager.postmaster_pid().ok_or("no postmaster.pid")?;
    let sigterm = Instant::now();
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(manager.child.id() as i32, libc::SIGTERM) };
    let exit = loop {
        if let Some(exit) = manager.child.try_wait()? {
            break exit;
        }
        assert!(
            sigterm.elapsed() < Duration::from_secs(15),
            "pgop instance run ignored SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(exit.success(), "{exit:?}");
    // SAFETY: signal 0 only checks that the process group exists.
    assert!(
        unsafe { libc::kill(-postmaster, 0) } != 0,
        "PostgreSQL outlived its manager"
    );
    assert!(
        !manager.pgdata().join("postmaster.pid").exists(),
        "not a clean shutdown"
    );
    ns.delete().await?;
    Ok(())
}
