//! Every command of docs/troubleshooting.md works: each line of its `sh` blocks is run
//! with `sh -c`, as a reader would paste it, against a real API server with pgop's operator,
//! the local node and a running two-instance cluster `example`, with kubectl (testenv's)
//! and `kubectl pgop` (this build, as `kubectl-pgop`) on the PATH and a kubeconfig whose
//! context namespace is the test's. Each must exit 0.

mod common;

use common::*;
use serde_json::json;
use std::path::{Path, PathBuf};

/// The commands of the ```sh blocks of a Markdown file, in order.
fn commands(markdown: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    for line in markdown.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with("```") {
            inside = !inside && trimmed == "```sh";
            continue;
        }
        if inside && !trimmed.is_empty() && !trimmed.starts_with('#') {
            out.push(trimmed.to_string());
        }
    }
    out
}

/// The environment's kubeconfig with the test namespace as its context's namespace.
fn kubeconfig(env: &Env, dir: &Path) -> Result<PathBuf> {
    let text = std::fs::read_to_string(env.plane.kubeconfig())?;
    let mut config: serde_yaml::Value = serde_yaml::from_str(&text)?;
    let contexts = config
        .get_mut("contexts")
        .and_then(|c| c.as_sequence_mut())
        .ok_or("no contexts in the kubeconfig")?;
    for context in contexts {
        if let Some(c) = context.get_mut("context").and_then(|c| c.as_mapping_mut()) {
            c.insert("namespace".into(), env.n().into());
        }
    }
    let path = dir.join("kubeconfig");
    std::fs::write(&path, serde_yaml::to_string(&config)?)?;
    Ok(path)
}

#[tokio::test]
async fn every_command_of_the_troubleshooting_guide_runs() -> Result {
    let _serial = SERIAL.lock().await;
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/troubleshooting.md");
    let commands = commands(&std::fs::read_to_string(&docs)?);
    assert!(commands.len() >= 10, "{commands:?}");
    let kubectl = pgop_testenv::binaries::locate(pgop_testenv::binaries::Binary::Kubectl)
        .map_err(|e| format!("{e}: run hack/install-testenv.sh"))?;

    let env = start("docs").await?;
    env.create(
        "example",
        json!({"replicas": 2, "storage": {"size": "1Gi"}}),
    )
    .await?;
    env.wait_ready("example", 2).await?;
    assert_eq!(env.current_primary("example").await?, "example-1");
    let dir = env.plane.dir().join("docs-commands");
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin)?;
    std::os::unix::fs::symlink(&kubectl, bin.join("kubectl"))?;
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_pgop"), bin.join("kubectl-pgop"))?;
    let config = kubeconfig(&env, &dir)?;
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );

    let mut outputs = Vec::new();
    for command in &commands {
        let (line, path, config) = (command.clone(), path.clone(), config.clone());
        let out = tokio::task::spawn_blocking(move || {
            std::process::Command::new("sh")
                .arg("-c")
                .arg(&line)
                .env("PATH", path)
                .env("KUBECONFIG", config)
                .env_remove("RUST_LOG")
                .output()
        })
        .await??;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        eprintln!("$ {command}\n{stdout}{stderr}");
        assert!(
            out.status.success(),
            "`{command}` failed ({}):\n{stdout}{stderr}",
            out.status
        );
        outputs.push((command.clone(), stdout));
    }
    // And they showed what the guide says they show.
    let shown = |prefix: &str| {
        outputs
            .iter()
            .find(|(c, _)| c.starts_with(prefix))
            .map(|(_, o)| o.clone())
            .unwrap_or_default()
    };
    assert!(shown("kubectl get pgc example").contains("example"));
    assert!(shown("kubectl pgop status example").contains("Conditions"));
    assert!(shown("kubectl get pgc example -o jsonpath").contains("Ready=True"));
    assert!(shown("tar -tf").contains("report/cluster.yaml"));
    assert!(shown("kubectl get pods,pvc").contains("example-2"));
    env.wait_cluster("example", "example-2 the primary", TIMEOUT, |s| {
        s.current_primary.as_deref() == Some("example-2")
    })
    .await?;
    // The guide writes its report where a reader would; not left behind by the test.
    let _ = std::fs::remove_file("/tmp/example-report.tar");
    env.stop().await
}
