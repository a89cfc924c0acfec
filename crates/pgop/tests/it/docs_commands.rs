//! Every command of the guides in docs/ works, run as a reader would paste it.
//!
//! - docs/troubleshooting.md: its `sh` blocks, against a real API server with pgop's
//!   operator, the local node and a running two-instance cluster `example`.
//! - docs/day-one.md: its `sh` blocks, in order, against a real API server with pgop's
//!   operator, the local node and a real S3 server (the cluster is the guide's own), and
//!   its `sh-install` blocks (install and upgrade pgop with helm) against a second API
//!   server with no nodes, where the release's objects are created but nothing runs them.
//!
//! A guide's commands of one kind run in one bash session (variables carry from one block
//! to the next), with kubectl (testenv's), helm (testenv's) and `kubectl pgop` (this build,
//! as `kubectl-pgop`) on the PATH, a kubeconfig whose context namespace is the test's, and
//! a working directory that shows the repository's `charts/`, `deploy/` and `examples/`.
//! Each command must exit 0; the first that does not fails the test with the transcript.

use crate::common;

use common::*;
use pgop_testenv::binaries::{Binary, locate};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read_doc(name: &str) -> Result<String> {
    Ok(std::fs::read_to_string(repo().join("docs").join(name))?)
}

/// The commands of the blocks fenced with ```` ```tag ```` of a Markdown file, in order:
/// each line, but blank lines and comments; a line ending in `\` joined with the next; a
/// here-document (`<<EOF`, `<<'EOF'`) with its lines, up to its terminator, as one command.
fn commands(markdown: &str, tag: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    let mut current = String::new();
    let mut heredoc: Option<String> = None;
    for line in markdown.lines() {
        let trimmed = line.trim();
        if heredoc.is_none() && trimmed.starts_with("```") {
            inside = !inside && trimmed == format!("```{tag}");
            continue;
        }
        if !inside {
            continue;
        }
        if let Some(end) = &heredoc {
            current.push('\n');
            current.push_str(line);
            if trimmed == end {
                heredoc = None;
                out.push(std::mem::take(&mut current));
            }
            continue;
        }
        if current.is_empty() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        if !current.is_empty() {
            current.push('\n');
        }
        current.push_str(trimmed);
        if trimmed.ends_with('\\') {
            continue;
        }
        if let Some((_, word)) = trimmed.split_once("<<") {
            let word = word.trim_start_matches('-').trim();
            let word = word.split_whitespace().next().unwrap_or_default();
            heredoc = Some(word.trim_matches(|c| c == '\'' || c == '"').to_string());
            continue;
        }
        out.push(std::mem::take(&mut current));
    }
    assert!(
        heredoc.is_none(),
        "an unterminated here-document: {current}"
    );
    out
}

#[test]
fn commands_are_lines_here_documents_and_continued_lines_of_one_kind_of_block() {
    let markdown = "```sh\n# a comment\na one\n\nb <<EOF\n  indented: $X\n# kept\nEOF\nc \\\n  continued\n```\n\n```sh-install\nd\n```\n```text\ne\n```\n";
    assert_eq!(
        commands(markdown, "sh"),
        [
            "a one",
            "b <<EOF\n  indented: $X\n# kept\nEOF",
            "c \\\ncontinued"
        ]
    );
    assert_eq!(commands(markdown, "sh-install"), ["d"]);
}

/// The variables the ```` ```env ```` blocks of a Markdown file export.
fn exported(markdown: &str) -> Vec<String> {
    commands(markdown, "env")
        .iter()
        .filter_map(|c| c.strip_prefix("export "))
        .filter_map(|c| c.split_once('='))
        .map(|(name, _)| name.to_string())
        .collect()
}

/// `kubeconfig` with `namespace` as its contexts' namespace, written into `dir`.
fn kubeconfig(kubeconfig: &Path, namespace: &str, dir: &Path) -> Result<PathBuf> {
    let text = std::fs::read_to_string(kubeconfig)?;
    let mut config: serde_yaml::Value = serde_yaml::from_str(&text)?;
    let contexts = config
        .get_mut("contexts")
        .and_then(|c| c.as_sequence_mut())
        .ok_or("no contexts in the kubeconfig")?;
    for context in contexts {
        if let Some(c) = context.get_mut("context").and_then(|c| c.as_mapping_mut()) {
            c.insert("namespace".into(), namespace.into());
        }
    }
    let path = dir.join("kubeconfig");
    std::fs::write(&path, serde_yaml::to_string(&config)?)?;
    Ok(path)
}

/// Where a guide's commands run: `dir/work` as the working directory (with the repository's
/// `charts`, `deploy` and `examples` linked in), `dir/bin` first on the PATH (kubectl, helm,
/// kubectl-pgop), the kubeconfig `plane_kubeconfig` with `namespace` as its context's
/// namespace, and `vars` set.
struct Shell {
    work: PathBuf,
    path: String,
    kubeconfig: PathBuf,
    vars: Vec<(String, String)>,
}

impl Shell {
    fn new(
        dir: &Path,
        plane_kubeconfig: &Path,
        namespace: &str,
        vars: Vec<(String, String)>,
    ) -> Result<Self> {
        let bin = dir.join("bin");
        let work = dir.join("work");
        std::fs::create_dir_all(&bin)?;
        std::fs::create_dir_all(&work)?;
        let missing = |e| format!("{e}: run hack/install-testenv.sh");
        std::os::unix::fs::symlink(
            locate(Binary::Kubectl).map_err(missing)?,
            bin.join("kubectl"),
        )?;
        std::os::unix::fs::symlink(locate(Binary::Helm).map_err(missing)?, bin.join("helm"))?;
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_pgop"), bin.join("kubectl-pgop"))?;
        for linked in ["charts", "deploy", "examples"] {
            std::os::unix::fs::symlink(repo().join(linked).canonicalize()?, work.join(linked))?;
        }
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        Ok(Self {
            work,
            path,
            kubeconfig: kubeconfig(plane_kubeconfig, namespace, dir)?,
            vars,
        })
    }

    /// Runs `commands` in order in one bash session; each command with its output (stdout
    /// and stderr). The whole transcript goes to stderr; the first command that exits
    /// non-zero, or a session that outlasts `timeout`, is an error that names it.
    async fn run(&self, commands: &[String], timeout: Duration) -> Result<Vec<(String, String)>> {
        // Each command is preceded by a marker line on stdout, and followed by a check of
        // its exit status: a shell session as a reader's, that stops at the first failure.
        let mut script = String::from("exec 2>&1\nset -o pipefail\n");
        for (i, command) in commands.iter().enumerate() {
            script.push_str(&format!(
                "printf '\\n\\036%d\\n' {i}\n{command}\nrc=$?; if [ $rc -ne 0 ]; then printf '\\n\\036failed %d\\n' $rc; exit 1; fi\n"
            ));
        }
        let file = self.work.join(".commands.sh");
        std::fs::write(&file, &script)?;
        // The transcript goes to a file, so that a session cut short still shows it.
        let log = self.work.join(".transcript");
        let mut cmd = tokio::process::Command::new("bash");
        cmd.arg(&file)
            .current_dir(&self.work)
            .env("PATH", &self.path)
            .env("KUBECONFIG", &self.kubeconfig)
            .env_remove("RUST_LOG")
            .stdin(std::process::Stdio::null())
            .stdout(std::fs::File::create(&log)?)
            .kill_on_drop(true);
        for (name, value) in &self.vars {
            cmd.env(name, value);
        }
        let mut child = cmd.spawn()?;
        let status = tokio::time::timeout(timeout, child.wait()).await;
        if status.is_err() {
            let _ = child.kill().await;
        }
        let transcript = String::from_utf8_lossy(&std::fs::read(&log)?).into_owned();
        // Split at the markers: [(index, output)], and the failure's exit status.
        let mut outputs: Vec<(String, String)> = Vec::new();
        let mut failed = None;
        for part in transcript.split("\n\u{1e}").skip(1) {
            let (head, body) = part.split_once('\n').unwrap_or((part, ""));
            if let Some(rc) = head.strip_prefix("failed ") {
                failed = Some(rc.to_string());
            } else if let Some(command) = head.parse::<usize>().ok().and_then(|i| commands.get(i)) {
                outputs.push((command.clone(), body.to_string()));
            }
        }
        for (command, output) in &outputs {
            eprintln!("$ {command}\n{output}");
        }
        let status = match status {
            Ok(status) => status?,
            Err(_) => {
                let last = outputs.last().map(|(c, _)| c.as_str()).unwrap_or_default();
                return Err(format!(
                    "the commands did not finish within {timeout:?}; the last was `{last}`"
                )
                .into());
            }
        };
        match (failed, outputs.last()) {
            (Some(rc), Some((command, output))) => {
                Err(format!("`{command}` failed (exit {rc}):\n{output}").into())
            }
            _ if !status.success() => {
                Err(format!("the session failed ({status}):\n{transcript}").into())
            }
            _ => {
                assert_eq!(outputs.len(), commands.len(), "{transcript}");
                Ok(outputs)
            }
        }
    }
}

/// The output of the first command that starts with `prefix`.
fn shown(outputs: &[(String, String)], prefix: &str) -> String {
    outputs
        .iter()
        .find(|(c, _)| c.starts_with(prefix))
        .map(|(_, o)| o.clone())
        .unwrap_or_default()
}

#[tokio::test]
async fn every_command_of_the_troubleshooting_guide_runs() -> Result {
    let _serial = SERIAL.lock().await;
    let commands = commands(&read_doc("troubleshooting.md")?, "sh");
    assert!(commands.len() >= 10, "{commands:?}");

    let env = start("docs").await?;
    env.create(
        "example",
        json!({"replicas": 2, "storage": {"size": "1Gi"}}),
    )
    .await?;
    env.wait_ready("example", 2).await?;
    assert_eq!(env.current_primary("example").await?, "example-1");
    let dir = env.plane.dir().join("docs-commands");
    let shell = Shell::new(&dir, env.plane.kubeconfig(), env.n(), Vec::new())?;
    let outputs = shell.run(&commands, Duration::from_secs(600)).await?;

    // And they showed what the guide says they show.
    let shown = |prefix| shown(&outputs, prefix);
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

#[tokio::test]
async fn every_command_of_the_day_one_guide_runs() -> Result {
    use pgop_testenv::s3::{ACCESS_KEY, BUCKET, S3Server, SECRET_KEY};
    let _serial = SERIAL.lock().await;
    let guide = read_doc("day-one.md")?;
    let install = commands(&guide, "sh-install");
    let commands = commands(&guide, "sh");
    assert!(install.len() >= 5, "{install:?}");
    assert!(commands.len() >= 20, "{commands:?}");
    let new_version = concat!(env!("CARGO_PKG_VERSION"), "-next");
    let vars = |s3_endpoint: &str| {
        [
            ("S3_ENDPOINT", s3_endpoint),
            ("S3_BUCKET", BUCKET),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
            ("PGOP_NEW_VERSION", new_version),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .to_vec()
    };
    // The test sets exactly what the guide asks the reader to set.
    let mut asked = exported(&guide);
    asked.sort();
    let mut set: Vec<String> = vars("").into_iter().map(|(k, _)| k).collect();
    set.sort();
    assert_eq!(
        asked, set,
        "the guide's ```env block and the test's variables"
    );

    // Install and upgrade: helm against an API server of its own, with no nodes.
    let plane = pgop_testenv::ControlPlane::start(pgop_testenv::Options::default()).await?;
    let shell = Shell::new(
        &plane.dir().join("day-one-install"),
        plane.kubeconfig(),
        "default",
        vars(""),
    )?;
    let outputs = shell.run(&install, Duration::from_secs(300)).await?;
    assert!(shown(&outputs, "helm status").contains("STATUS: deployed"));
    assert!(shown(&outputs, "kubectl get crd").contains("postgresclusters.database.example.com"));
    let history = shown(&outputs, "helm history");
    assert!(
        history.contains("Install complete") && history.contains("Upgrade complete"),
        "{history}"
    );
    assert!(shown(&outputs, "helm rollback").contains("Rollback was a success"));
    drop(plane);

    // Everything else: the operator, the local node, real PostgreSQL and a real S3 server.
    let env = start("dayone").await?;
    let s3 = S3Server::start(&env.plane.dir().join("s3"))?;
    let shell = Shell::new(
        &env.plane.dir().join("day-one"),
        env.plane.kubeconfig(),
        env.n(),
        vars(&s3.endpoint()),
    )?;
    let outputs = match shell.run(&commands, Duration::from_secs(1200)).await {
        Ok(outputs) => outputs,
        Err(e) => {
            env.print_pod_logs("example");
            env.print_pod_logs("example-restored");
            return Err(e);
        }
    };
    let shown = |prefix| shown(&outputs, prefix);
    assert!(shown("kubectl get pgc example").contains("Ready"));
    assert!(shown("kubectl pgop status example").contains("Conditions"));
    let backups = shown("kubectl get postgresbackups");
    assert!(backups.contains("example-backup"), "{backups}");
    assert!(backups.contains("example-base-"), "{backups}");
    // The restored cluster has the row written before the backup.
    assert!(
        shown("PGPASSWORD=$(kubectl get secret example-restored-app")
            .contains("hello from day one")
    );
    // The promoted standby is the primary, and took the write.
    let primary = env.current_primary("example").await?;
    assert_ne!(primary, "example-1");
    assert!(
        shown("kubectl get pgc example -o jsonpath='{range .status.instances")
            .contains(env!("CARGO_PKG_VERSION"))
    );
    env.stop().await
}
