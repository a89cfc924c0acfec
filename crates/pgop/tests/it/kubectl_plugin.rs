//! `kubectl pgop` end to end: the pgop binary run as `kubectl-pgop` (a symlink, as kubectl
//! finds plugins) against testenv with the local node and real PostgreSQL, each
//! subcommand's output checked and its effect on the cluster waited for: status (text and
//! JSON), a misspelled name, promote, restart of one instance, a logical backup, fence and
//! unfence, hibernate and resume; and the same binary as `pgop kubectl status`.

use crate::common;

use common::*;
use kube::ResourceExt;
use pgop_api::PostgresBackup;
use pgop_api::cluster::ClusterPhase;
use serde_json::json;
use std::path::{Path, PathBuf};

/// Runs `program args...` with the environment's kubeconfig; exit status, stdout, stderr.
async fn run(env: &Env, program: &Path, args: &[&str]) -> Result<(bool, String, String)> {
    let kubeconfig = env.plane.kubeconfig().to_path_buf();
    let program = program.to_path_buf();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(program)
            .args(args)
            .env("KUBECONFIG", kubeconfig)
            .env_remove("RUST_LOG")
            .output()
    })
    .await??;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// `kubectl-pgop args... -n <namespace>`, which must succeed; its stdout.
async fn plugin(env: &Env, bin: &Path, args: &[&str]) -> Result<String> {
    let mut all = args.to_vec();
    all.extend(["-n", env.n()]);
    let (ok, out, err) = run(env, bin, &all).await?;
    if !ok {
        return Err(format!("kubectl pgop {args:?} failed: {err}").into());
    }
    Ok(out)
}

#[tokio::test]
async fn kubectl_pgop_subcommands_report_and_act_on_a_running_cluster() -> Result {
    let _serial = SERIAL.lock().await;
    let env = start("kubectl").await?;
    let dir = tempdir(&env)?;
    let bin = dir.join("kubectl-pgop");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_pgop"), &bin)?;
    let name = "shop";
    env.create(name, json!({"replicas": 2, "storage": {"size": "1Gi"}}))
        .await?;
    env.wait_ready(name, 2).await?;
    let primary = env.current_primary(name).await?;
    let standby = if primary == "shop-1" {
        "shop-2"
    } else {
        "shop-1"
    };

    // status, as text: no colour off a terminal.
    let text = plugin(&env, &bin, &["status", name]).await?;
    eprintln!("{text}");
    let n = env.n();
    for part in [
        format!("Cluster shop (namespace {n})  phase Ready  PostgreSQL 15  2/2 instances ready"),
        format!("Primary {primary}, for "),
        "NAME    ROLE     READY  TIMELINE  LSN".to_string(),
        "Backups".to_string(),
        "next base backup:     not scheduled".to_string(),
        "Conditions".to_string(),
        "Certificates".to_string(),
        "shop-server-tls: expires ".to_string(),
    ] {
        assert!(text.contains(&part), "{part:?} in\n{text}");
    }
    assert!(
        text.lines()
            .any(|l| l.contains(&primary) && l.contains("primary") && l.contains("yes")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.contains(standby) && l.contains("standby") && l.trim_end().ends_with('B')),
        "the standby's lag in bytes:\n{text}"
    );
    assert!(!text.contains('\x1b'));

    // status -o json, for scripts.
    let doc: serde_json::Value =
        serde_json::from_str(&plugin(&env, &bin, &["status", name, "-o", "json"]).await?)?;
    assert_eq!(doc["primary"], json!(primary));
    assert_eq!(doc["phase"], json!("Ready"));
    assert_eq!(doc["instances"].as_array().map(Vec::len), Some(2));
    let standby_doc = doc["instances"]
        .as_array()
        .and_then(|a| a.iter().find(|i| i["name"] == json!(standby)))
        .ok_or("the standby in the JSON")?;
    assert_eq!(standby_doc["role"], json!("standby"));
    assert!(standby_doc["lagBytes"].is_u64(), "{standby_doc}");
    let certs = doc["certificates"]
        .as_array()
        .ok_or("certificates in the JSON")?;
    assert!(
        certs.iter().any(|c| c["secret"] == json!("shop-server-tls")
            && c["expiresInDays"].as_i64().is_some_and(|d| d > 0)),
        "{doc}"
    );
    assert!(
        doc["conditions"]
            .as_array()
            .is_some_and(|c| c.iter().any(|k| k["type"] == json!("Ready"))),
        "{doc}"
    );

    // A misspelled name says what to do.
    let (ok, _, err) = run(&env, &bin, &["status", "shpo", "-n", n]).await?;
    assert!(!ok);
    assert!(
        err.contains(&format!(
            "cluster \"shpo\" not found in namespace {n}; did you mean \"shop\"?"
        )),
        "{err}"
    );
    let (ok, _, err) = run(&env, &bin, &["promote", name, "shop-7", "-n", n]).await?;
    assert!(!ok);
    assert!(
        err.contains("\"shop-7\" is not an instance of shop; its instances: "),
        "{err}"
    );
    // Without an instance, promote is for a replica cluster only.
    let (ok, _, err) = run(&env, &bin, &["promote", name, "-n", n]).await?;
    assert!(!ok);
    assert!(
        err.contains("shop is no replica cluster (spec.replica.enabled): name the INSTANCE"),
        "{err}"
    );

    // promote: a switchover to the standby (by its serial).
    let serial = standby.trim_start_matches("shop-");
    let out = plugin(&env, &bin, &["promote", name, serial]).await?;
    assert!(
        out.contains(&format!("switchover of shop to {standby} requested")),
        "{out}"
    );
    env.wait_cluster(name, "the standby promoted", TIMEOUT, |s| {
        s.current_primary.as_deref() == Some(standby) && s.ready_replicas == 2
    })
    .await?;

    // restart of one instance: pgop takes the request (and removes the annotation).
    let out = plugin(&env, &bin, &["restart", name, &primary]).await?;
    assert!(
        out.contains(&format!("restart of {primary} requested")),
        "{out}"
    );
    eventually("the restart request taken", TIMEOUT, || async {
        let c = env.clusters().get(name).await.ok()?;
        (!c.annotations()
            .contains_key(pgop_api::constants::ANNOTATION_RESTART_INSTANCE))
        .then_some(())
    })
    .await;

    // backup: a PostgresBackup of the cluster.
    let out = plugin(&env, &bin, &["backup", name, "--method", "logical"]).await?;
    let created = out
        .split_whitespace()
        .find_map(|w| w.strip_prefix("postgresbackup/"))
        .ok_or(format!("no backup named in {out:?}"))?;
    assert!(created.starts_with("shop-logical-"), "{out}");
    let backup = kube::Api::<PostgresBackup>::namespaced(env.client.clone(), n)
        .get(created)
        .await?;
    assert_eq!(backup.spec.cluster.name, "shop");
    assert_eq!(
        backup.spec.method,
        Some(pgop_api::backup::BackupMethod::Logical)
    );

    // fence and unfence.
    let out = plugin(&env, &bin, &["fence", name, &primary]).await?;
    assert!(out.contains(&format!("{primary} fenced")), "{out}");
    env.wait_cluster(name, "fenced", TIMEOUT, |s| {
        s.instances.iter().any(|i| i.name == primary && i.fenced)
    })
    .await?;
    let text = plugin(&env, &bin, &["status", name]).await?;
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with(primary.as_str()) && l.contains("fenced")),
        "{text}"
    );
    let out = plugin(&env, &bin, &["unfence", name, &primary]).await?;
    assert!(out.contains(&format!("{primary} unfenced")), "{out}");
    env.wait_cluster(name, "unfenced", TIMEOUT, |s| {
        s.instances.iter().all(|i| !i.fenced) && s.ready_replicas == 2
    })
    .await?;

    // hibernate and resume.
    assert!(
        plugin(&env, &bin, &["hibernate", name])
            .await?
            .contains("shop hibernates")
    );
    env.wait_cluster(name, "hibernated", TIMEOUT, |s| {
        s.phase == Some(ClusterPhase::Hibernated)
    })
    .await?;
    assert!(
        plugin(&env, &bin, &["resume", name])
            .await?
            .contains("shop resumes")
    );
    env.wait_ready(name, 2).await?;

    // report: a tarball with the cluster, its children, Events and logs, and no secret
    // value anywhere in it.
    let tarball = dir.join("shop.tar");
    let path = tarball.to_string_lossy().into_owned();
    let out = plugin(&env, &bin, &["report", name, "--output", &path]).await?;
    assert!(out.contains("Secrets' values redacted"), "{out}");
    let bytes = std::fs::read(&tarball)?;
    let password = env.password(name).await?;
    assert!(
        !bytes
            .windows(password.len())
            .any(|w| w == password.as_bytes()),
        "the app password is in the report"
    );
    let unpacked = dir.join("unpacked");
    std::fs::create_dir_all(&unpacked)?;
    let status = std::process::Command::new("tar")
        .arg("-xf")
        .arg(&tarball)
        .arg("-C")
        .arg(&unpacked)
        .status()?;
    assert!(status.success(), "tar -xf of the report");
    let read = |f: &str| std::fs::read_to_string(unpacked.join("report").join(f));
    assert!(read("cluster.yaml")?.contains("kind: PostgresCluster"));
    assert!(read("status.txt")?.contains("Cluster shop"));
    let secrets = read("secrets.yaml")?;
    assert!(
        secrets.contains("shop-app") && secrets.contains("<redacted: "),
        "{secrets}"
    );
    assert!(read("pods.yaml")?.contains("shop-1"));
    assert!(read("events.yaml")?.contains("SwitchoverCompleted"));
    assert!(read("backups.yaml")?.contains(created));
    let logs: Vec<String> = std::fs::read_dir(unpacked.join("report/logs"))?
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    assert_eq!(logs.len(), 2, "one log (or why not) per Pod: {logs:?}");

    // The same binary as `pgop kubectl`.
    let pgop = Path::new(env!("CARGO_BIN_EXE_pgop"));
    let (ok, out, err) = run(&env, pgop, &["kubectl", "status", name, "-n", n]).await?;
    assert!(ok, "{err}");
    assert!(out.contains("phase Ready"), "{out}");
    env.stop().await
}

/// A directory for the plugin's symlink, inside the environment's (removed with it).
fn tempdir(env: &Env) -> Result<PathBuf> {
    let dir = env.plane.dir().join("kubectl-plugin");
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
