//! `kubectl pgop psql`: this machine's `psql`, logged in as the application owner with the
//! cluster's app Secret, connected to the primary (a ready standby with `--replica`, a
//! ready Pod of a pooler with `--pooler NAME`) through `kubectl port-forward`. The password
//! goes into a password file (mode 0600, in a private temporary directory removed
//! afterwards), never onto a command line; TLS is verified against the cluster's authority
//! (the Secret's `ca.crt`) and the name of the `-rw` (`-ro`, `-pooler-<name>`) Service,
//! which libpq checks while it connects to the forwarded local port (`hostaddr`).

use super::Error;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use pgop_api::cluster::InstanceRole;
use pgop_api::v1beta1::PostgresCluster;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// What psql connects to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum To {
    Primary,
    Replica,
    /// A pooler of `spec.poolers`, by name.
    Pooler(String),
}

/// The pooler `name` of the cluster's spec, or an error naming `--pooler` and the ones
/// there are.
pub fn pooler<'a>(c: &'a PostgresCluster, name: &str) -> Result<&'a str, Error> {
    let names: Vec<&str> = c.spec.poolers.iter().map(|p| p.name.as_str()).collect();
    if let Some(found) = names.iter().find(|n| **n == name) {
        return Ok(found);
    }
    Err(if names.is_empty() {
        format!(
            "--pooler {name:?}: {} has no poolers (spec.poolers)",
            c.name_any()
        )
    } else {
        format!(
            "--pooler {name:?}: {} has no such pooler (spec.poolers: {})",
            c.name_any(),
            names.join(", ")
        )
    }
    .into())
}

/// The first ready Pod (by name) of `pods`, a pooler's; not one being deleted.
pub fn ready_pod(pods: &[Pod]) -> Option<String> {
    let mut ready: Vec<String> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| pgop_operator::cluster::pods::pod_ready(p))
        .map(ResourceExt::name_any)
        .collect();
    ready.sort();
    ready.into_iter().next()
}

/// The instance to connect to: the primary, or with `replica` a ready standby.
pub fn target(c: &PostgresCluster, replica: bool) -> Result<String, Error> {
    let status = c.status.clone().unwrap_or_default();
    if replica {
        return status
            .instances
            .iter()
            .find(|i| i.ready && i.role == Some(InstanceRole::Replica))
            .map(|i| i.name.clone())
            .ok_or_else(|| format!("{} has no ready standby", c.name_any()).into());
    }
    status
        .current_primary
        .filter(|p| {
            status
                .instances
                .iter()
                .any(|i| &i.name == p && i.role == Some(InstanceRole::Primary))
        })
        .ok_or_else(|| format!("{} has no running primary now", c.name_any()).into())
}

/// A line of a password file: `*:*:*:*:password`, with `:` and `\` escaped.
pub fn passfile_line(password: &str) -> String {
    let escaped = password.replace('\\', "\\\\").replace(':', "\\:");
    format!("*:*:*:*:{escaped}\n")
}

/// Runs psql; returns its exit code.
pub async fn run(
    client: &Client,
    ns: &str,
    context: Option<&str>,
    c: &PostgresCluster,
    to: &To,
    psql_args: &[String],
) -> Result<i32, Error> {
    let cluster = c.name_any();
    // The Pod forwarded to, and the Service whose name its certificate is checked against.
    let (pod, service) = match to {
        To::Primary => (target(c, false)?, format!("{cluster}-rw")),
        To::Replica => (target(c, true)?, format!("{cluster}-ro")),
        To::Pooler(name) => {
            let full = pgop_api::pooler::pooler_name(&cluster, pooler(c, name)?);
            let pods = Api::<Pod>::namespaced(client.clone(), ns)
                .list(
                    &ListParams::default().labels(&format!("{}={full}", pgop_api::labels::POOLER)),
                )
                .await
                .map_err(|e| format!("listing the Pods of pooler {full}: {e}"))?;
            let pod =
                ready_pod(&pods.items).ok_or_else(|| format!("pooler {full} has no ready Pod"))?;
            (pod, full)
        }
    };
    let secret_name = format!("{cluster}{}", pgop_api::constants::APP_SECRET_SUFFIX);
    let secret = Api::<Secret>::namespaced(client.clone(), ns)
        .get(&secret_name)
        .await
        .map_err(|e| format!("reading the app Secret {secret_name}: {e}"))?;
    let value = |key: &str| -> Result<String, Error> {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .map(|v| String::from_utf8_lossy(&v.0).into_owned())
            .ok_or_else(|| format!("Secret {secret_name} has no {key:?}").into())
    };
    let (user, password, dbname, ca) = (
        value("username")?,
        value("password")?,
        value("dbname")?,
        value("ca.crt")?,
    );
    let psql = which("psql").ok_or(
        "psql is not on the PATH: install PostgreSQL's client (Debian: apt-get install postgresql-client)",
    )?;
    let dir = private_dir()?;
    let result = (|| -> Result<i32, Error> {
        let passfile = dir.path.join("pgpass");
        write_private(&passfile, passfile_line(&password).as_bytes())?;
        let rootcert = dir.path.join("ca.crt");
        write_private(&rootcert, ca.as_bytes())?;
        let mut forward = Command::new("kubectl");
        if let Some(context) = context {
            forward.args(["--context", context]);
        }
        forward
            .args(["port-forward", "-n", ns, &format!("pod/{pod}"), ":5432"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut forward = Forward(
            forward
                .spawn()
                .map_err(|e| format!("starting kubectl port-forward: {e}"))?,
        );
        let port = forward.local_port()?;
        let status = Command::new(psql)
            .args(psql_args)
            .env("PGHOST", format!("{service}.{ns}.svc"))
            .env("PGHOSTADDR", "127.0.0.1")
            .env("PGPORT", port.to_string())
            .env("PGUSER", &user)
            .env("PGDATABASE", &dbname)
            .env("PGPASSFILE", &passfile)
            .env("PGSSLMODE", "verify-full")
            .env("PGSSLROOTCERT", &rootcert)
            .env("PGAPPNAME", "kubectl-pgop-psql")
            .env_remove("PGPASSWORD")
            .status()
            .map_err(|e| format!("running psql: {e}"))?;
        Ok(status.code().unwrap_or(1))
    })();
    drop(dir);
    result
}

/// `kubectl port-forward`, stopped when dropped.
struct Forward(std::process::Child);

impl Forward {
    /// The local port, from its first line (`Forwarding from 127.0.0.1:PORT -> 5432`).
    fn local_port(&mut self) -> Result<u16, Error> {
        let stdout = self
            .0
            .stdout
            .take()
            .ok_or("kubectl port-forward has no output")?;
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        loop {
            line.clear();
            if reader.read_line(&mut line)? == 0 {
                return Err("kubectl port-forward ended before it forwarded a port".into());
            }
            if let Some(port) = forwarded_port(&line) {
                // Drain the rest in the background (kubectl writes a line per connection).
                std::thread::spawn(move || {
                    let mut sink = String::new();
                    while reader.read_line(&mut sink).unwrap_or(0) > 0 {
                        sink.clear();
                    }
                });
                return Ok(port);
            }
        }
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The local port of a `Forwarding from 127.0.0.1:PORT -> 5432` line.
pub fn forwarded_port(line: &str) -> Option<u16> {
    let rest = line.trim().strip_prefix("Forwarding from 127.0.0.1:")?;
    rest.split_whitespace().next()?.parse().ok()
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(program))
        .find(|p| p.is_file())
}

/// A directory only this user can enter, removed when dropped.
struct PrivateDir {
    path: PathBuf,
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

fn private_dir() -> Result<PrivateDir, Error> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let path = std::env::temp_dir().join(format!(
        "kubectl-pgop-psql-{}-{nanos:x}",
        std::process::id()
    ));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&path)
        .map_err(|e| format!("creating {}: {e}", path.display()))?;
    Ok(PrivateDir { path })
}

fn write_private(path: &Path, content: &[u8]) -> Result<(), Error> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("writing {}: {e}", path.display()))?;
    f.write_all(content)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_file_escapes_and_the_forwarded_port_is_read() {
        assert_eq!(passfile_line("a:b\\c"), "*:*:*:*:a\\:b\\\\c\n");
        assert_eq!(
            forwarded_port("Forwarding from 127.0.0.1:40123 -> 5432\n"),
            Some(40123)
        );
        assert_eq!(forwarded_port("Forwarding from [::1]:40123 -> 5432"), None);
    }

    #[test]
    fn the_target_is_the_running_primary_or_a_ready_standby() {
        let c: PostgresCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "database.example.com/v1beta1", "kind": "PostgresCluster",
            "metadata": {"name": "db"}, "spec": {"storage": {"size": "1Gi"}},
            "status": {"currentPrimary": "db-1", "targetPrimary": "db-1", "instances": [
                {"name": "db-1", "serial": 1, "ready": true, "role": "primary"},
                {"name": "db-2", "serial": 2, "ready": false, "role": "replica"},
                {"name": "db-3", "serial": 3, "ready": true, "role": "replica"}]}
        }))
        .expect("cluster");
        assert_eq!(target(&c, false).expect("primary"), "db-1");
        assert_eq!(target(&c, true).expect("standby"), "db-3");
    }

    #[test]
    fn a_pooler_is_one_of_the_spec_and_its_first_ready_pod_is_taken() {
        let cluster = |poolers: serde_json::Value| -> PostgresCluster {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "database.example.com/v1beta1", "kind": "PostgresCluster",
                "metadata": {"name": "db"},
                "spec": {"storage": {"size": "1Gi"}, "poolers": poolers}
            }))
            .expect("cluster")
        };
        let c = cluster(serde_json::json!([{"name": "rw"}, {"name": "ro", "type": "ro"}]));
        assert_eq!(pooler(&c, "ro").expect("ro"), "ro");
        let unknown = pooler(&c, "x\n$(id)").expect_err("unknown").to_string();
        assert!(
            unknown.contains("--pooler") && unknown.contains("spec.poolers: rw, ro"),
            "{unknown}"
        );
        let none = pooler(&cluster(serde_json::json!([])), "rw")
            .expect_err("none")
            .to_string();
        assert!(none.contains("db has no poolers"), "{none}");

        let pod = |name: &str, ready: &str, deleting: bool| -> Pod {
            let mut p: Pod = serde_json::from_value(serde_json::json!({
                "metadata": {"name": name},
                "status": {"conditions": [{"type": "Ready", "status": ready}]}
            }))
            .expect("pod");
            if deleting {
                p.metadata.deletion_timestamp =
                    Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        jiff::Timestamp::UNIX_EPOCH,
                    ));
            }
            p
        };
        let pods = [
            pod("db-pooler-rw-c", "True", false),
            pod("db-pooler-rw-a", "True", true),
            pod("db-pooler-rw-b", "False", false),
            pod("db-pooler-rw-d", "True", false),
        ];
        assert_eq!(ready_pod(&pods).as_deref(), Some("db-pooler-rw-c"));
        assert_eq!(ready_pod(&pods[1..3]), None);
    }
}
