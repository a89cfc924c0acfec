//! The instance Role, proven where a single instance can show it: `pgop instance run`
//! (a real manager and PostgreSQL, as a pod runs them) under the Role the operator builds
//! for a cluster, less one verb at a time. With the whole Role it becomes the primary and
//! renews the primary Lease; without a verb, the API server refuses the manager (the
//! `cannot <verb> resource` of the 403, in its log) and a step then does not happen.
//!
//! The operator itself (as the administrator) creates the cluster's Secrets, its
//! ServiceAccount and its Role, then stops; the test plays its part from there (the
//! cluster status naming the primary) and edits the Role per case.
//!
//! `get` on Pods is shown with `db-1` as a standby: the cluster status names `db-2` the
//! primary, a Pod object with an address where nothing listens; with the whole Role the
//! manager reads that address and tries to clone from it.
//!
//! The manager keeps its cluster, its Secrets and the primary's Pod from watches (a list
//! and a watch narrowed to one name) and reads one with a GET only while its watch is
//! refused: `get` is shown by removing it together with `list`.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role};
use kube::Api;
use kube::api::{Patch, PatchParams};
use pgop_api::PostgresCluster;
use std::io::Read;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

type Result<T = (), E = Box<dyn std::error::Error + Send + Sync>> = std::result::Result<T, E>;

const DB: &str = "db";
const INSTANCE: &str = "db-1";
/// How long a step may take with the whole Role (initdb and a first start included).
const STEP_TIMEOUT: Duration = Duration::from_secs(90);
/// How long after the refusal a step that must not happen is watched for.
const NEVER: Duration = Duration::from_secs(10);

/// What a case checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// The manager runs PostgreSQL as the primary and is ready.
    ReadyPrimary,
    /// The primary Lease, once held, is renewed (its renewTime moves).
    LeaseRenewed,
    /// As a standby (the cluster status names `db-2` the primary), the manager clones the
    /// primary at its Pod's address: `pg_basebackup` fails naming [`PRIMARY_IP`], where
    /// nothing listens.
    ClonesPrimary,
}

/// The address of the primary `db-2` (a Pod object only) in the standby cases.
const PRIMARY_IP: &str = "127.0.0.9";

/// The Role less `verb` (and the verbs `also`) of `resource` (in `group`); the refusal of
/// `verb` the manager's log then shows; the step that then does not happen (`None`: the
/// refusal is the whole effect).
struct Case {
    group: &'static str,
    resource: &'static str,
    verb: &'static str,
    also: &'static [&'static str],
    never: Option<Step>,
}

impl Case {
    /// Whether `db-1` runs as a standby of `db-2` (instead of as the primary): only a
    /// standby reads a Pod.
    fn standby(&self) -> bool {
        self.never == Some(Step::ClonesPrimary) || self.resource == "pods"
    }
}

#[rustfmt::skip]
fn cases() -> Vec<Case> {
    use Step::*;
    vec![
        // Its cluster, read at every step of the manager's loop (from its watch, with a GET
        // while the watch is refused): without either, no role, no PostgreSQL.
        Case { group: "database.example.com", resource: "postgresclusters", verb: "get", also: &["list"], never: Some(ReadyPrimary) },
        // Its credentials and certificates (the same): it waits for them before anything else.
        Case { group: "", resource: "secrets", verb: "get", also: &["list"], never: Some(ReadyPrimary) },
        // The primary Lease: without create, get or update no primary runs or stays.
        Case { group: "coordination.k8s.io", resource: "leases", verb: "create", also: &[], never: Some(ReadyPrimary) },
        Case { group: "coordination.k8s.io", resource: "leases", verb: "get", also: &[], never: Some(ReadyPrimary) },
        Case { group: "coordination.k8s.io", resource: "leases", verb: "update", also: &[], never: Some(LeaseRenewed) },
        // The watch of the Lease: without it a standby's takeover clock starts at its
        // first read instead of the Lease's last change (a refused watch, retried).
        Case { group: "coordination.k8s.io", resource: "leases", verb: "list", also: &[], never: None },
        Case { group: "coordination.k8s.io", resource: "leases", verb: "watch", also: &[], never: None },
        // The watches of its cluster and its Secrets: they keep what a pass reads and wake
        // the manager at a change (refused, retried with back-off; without the list the
        // manager reads with a GET at every pass, without the watch it keeps what the
        // list found; either way no step is lost).
        Case { group: "database.example.com", resource: "postgresclusters", verb: "list", also: &[], never: None },
        Case { group: "database.example.com", resource: "postgresclusters", verb: "watch", also: &[], never: None },
        Case { group: "", resource: "secrets", verb: "list", also: &[], never: None },
        Case { group: "", resource: "secrets", verb: "watch", also: &[], never: None },
        // The primary's Pod, for its address (the same): a standby never clones (nor
        // follows) it.
        Case { group: "", resource: "pods", verb: "get", also: &["list"], never: Some(ClonesPrimary) },
        Case { group: "", resource: "pods", verb: "list", also: &[], never: None },
        Case { group: "", resource: "pods", verb: "watch", also: &[], never: None },
    ]
}

/// `rules` less `verb` of `resource` in `group`; an error when they do not grant it.
fn without(
    rules: &[PolicyRule],
    group: &str,
    resource: &str,
    verb: &str,
) -> Result<Vec<PolicyRule>> {
    let mut found = false;
    let mut out = Vec::new();
    for rule in rules {
        let matches = rule.api_groups.iter().flatten().any(|g| g == group)
            && rule.resources.iter().flatten().any(|r| r == resource)
            && rule.verbs.iter().any(|v| v == verb);
        if !matches {
            out.push(rule.clone());
            continue;
        }
        found = true;
        if rule.api_groups.as_ref().is_some_and(|g| g.len() > 1)
            || rule.resources.as_ref().is_some_and(|r| r.len() > 1)
        {
            return Err(format!("a rule of several groups or resources: {rule:?}").into());
        }
        let verbs: Vec<String> = rule.verbs.iter().filter(|v| *v != verb).cloned().collect();
        if !verbs.is_empty() {
            out.push(PolicyRule {
                verbs,
                ..rule.clone()
            });
        }
    }
    if !found {
        return Err(format!("the instance Role grants no {verb} on {group}/{resource}").into());
    }
    Ok(out)
}

/// A fresh directory PostgreSQL may use.
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

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn http_get(port: u16, path: &str) -> Option<u16> {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    response.split(' ').nth(1)?.parse().ok()
}

/// `pgop instance run` as the pod `db-1` with the cluster's ServiceAccount (through a
/// kubeconfig impersonating it); killed, with its PostgreSQL, and its directory removed on
/// drop.
struct Manager {
    child: Child,
    dir: PathBuf,
    http_port: u16,
}

impl Manager {
    fn spawn(plane: &pgop_testenv::ControlPlane, namespace: &str) -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("pgop-instance-rbac-{namespace}"));
        let _ = std::fs::remove_dir_all(&dir);
        postgres_dir(&dir)?;
        postgres_dir(&dir.join("data"))?;
        postgres_dir(&dir.join("run"))?;
        let mut kubeconfig: serde_yaml::Value =
            serde_yaml::from_str(&std::fs::read_to_string(plane.kubeconfig())?)?;
        let user = format!("system:serviceaccount:{namespace}:{DB}");
        for entry in kubeconfig["users"]
            .as_sequence_mut()
            .ok_or("a kubeconfig without users")?
        {
            entry["user"]["as"] = serde_yaml::Value::String(user.clone());
        }
        let config_path = dir.join("kubeconfig");
        std::fs::write(&config_path, serde_yaml::to_string(&kubeconfig)?)?;
        let http_port = free_port()?;
        let child = Command::new(env!("CARGO_BIN_EXE_pgop"))
            .args(["instance", "run", "--resync", "1"])
            .env("KUBECONFIG", &config_path)
            .env("POD_NAME", INSTANCE)
            .env("POD_NAMESPACE", namespace)
            .env("POD_IP", "127.0.0.1")
            .env("PGOP_CLUSTER", DB)
            .env("PGDATA", dir.join("data/pgdata"))
            .env("PGOP_SOCKET_DIR", dir.join("run"))
            .env("PGOP_PG_PORT", free_port()?.to_string())
            .env("PGOP_LISTEN", format!("127.0.0.1:{http_port}"))
            .env("PGOP_STOP_TIMEOUT", "3")
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("log"))?)
            .spawn()?;
        Ok(Self {
            child,
            dir,
            http_port,
        })
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }

    /// Whether the log shows the API server refusing `verb` on `resource`.
    fn refused(&self, verb: &str, resource: &str) -> bool {
        self.log()
            .contains(&format!("cannot {verb} resource \\\"{resource}\\\""))
            || self
                .log()
                .contains(&format!("cannot {verb} resource \"{resource}\""))
    }

    fn postmaster_pid(&self) -> Option<i32> {
        std::fs::read_to_string(self.dir.join("data/pgdata/postmaster.pid"))
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

/// Polls `check` every 250 ms until it holds or `timeout` passes.
async fn within<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn ready_primary(admin: &kube::Client, ns: &str, manager: &Manager) -> bool {
    if http_get(manager.http_port, "/readyz") != Some(200) {
        return false;
    }
    holder(admin, ns).await.is_some_and(|(h, _)| h == INSTANCE)
}

/// The primary Lease's holder and renewTime.
async fn holder(admin: &kube::Client, ns: &str) -> Option<(String, String)> {
    let lease = Api::<Lease>::namespaced(admin.clone(), ns)
        .get_opt(DB)
        .await
        .ok()??;
    let spec = lease.spec?;
    Some((
        spec.holder_identity?,
        spec.renew_time.map(|t| t.0.to_string()).unwrap_or_default(),
    ))
}

async fn happened(admin: &kube::Client, ns: &str, manager: &Manager, step: Step) -> bool {
    match step {
        Step::ReadyPrimary => ready_primary(admin, ns, manager).await,
        Step::ClonesPrimary => {
            let log = manager.log();
            log.contains("cloning the primary") && log.contains(PRIMARY_IP)
        }
        Step::LeaseRenewed => {
            let Some((_, first)) = holder(admin, ns).await else {
                return false;
            };
            within(Duration::from_secs(8), || async {
                holder(admin, ns).await.is_some_and(|(_, now)| now != first)
            })
            .await
        }
    }
}

/// A namespace with the cluster `db` the operator set up (Secrets, ServiceAccount, Role),
/// its status naming `db-1` the primary; returns the instance Role's rules.
async fn prepare(admin: &kube::Client, ns: &str, standby: bool) -> Result<Vec<PolicyRule>> {
    let clusters: Api<PostgresCluster> = Api::namespaced(admin.clone(), ns);
    let cluster: PostgresCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "database.example.com/v1alpha1",
        "kind": "PostgresCluster",
        "metadata": {"name": DB},
        "spec": {"replicas": 1, "storage": {"size": "1Gi"}}
    }))?;
    clusters.create(&Default::default(), &cluster).await?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let operator = tokio::spawn(pgop_operator::run(
        admin.clone(),
        pgop_operator::Options {
            namespaces: vec![ns.to_string()],
            ..pgop_operator::Options::default()
        },
        async move {
            let _ = stopped.await;
        },
    ));
    // The Pod comes after every Secret, the ServiceAccount and the Role.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    let created = within(Duration::from_secs(60), || async {
        matches!(pods.get_opt(INSTANCE).await, Ok(Some(_)))
    })
    .await;
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(15), operator).await;
    if !created {
        return Err("the operator did not create the instance".into());
    }
    let primary = if standby {
        // The primary `db-2`: a Pod object with an address, never run.
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "db-2"},
            "spec": {"containers": [{"name": "postgres", "image": "none"}]}
        }))?;
        pods.create(&Default::default(), &pod).await?;
        let status = serde_json::json!({"status": {
            "phase": "Running", "podIP": PRIMARY_IP, "podIPs": [{"ip": PRIMARY_IP}]
        }});
        pods.patch_status("db-2", &PatchParams::default(), &Patch::Merge(&status))
            .await?;
        "db-2"
    } else {
        INSTANCE
    };
    let mut instances = vec![serde_json::json!({"name": INSTANCE, "serial": 1})];
    if standby {
        instances.push(serde_json::json!({"name": "db-2", "serial": 2}));
    }
    let patch = serde_json::json!({"status": {
        "targetPrimary": primary, "currentPrimary": primary, "instances": instances
    }});
    clusters
        .patch_status(DB, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let role = Api::<Role>::namespaced(admin.clone(), ns).get(DB).await?;
    Ok(role.rules.unwrap_or_default())
}

/// Replaces the instance Role's rules.
async fn set_rules(admin: &kube::Client, ns: &str, rules: Vec<PolicyRule>) -> Result {
    let roles: Api<Role> = Api::namespaced(admin.clone(), ns);
    let mut role = roles.get(DB).await?;
    role.rules = Some(rules);
    roles.replace(DB, &Default::default(), &role).await?;
    Ok(())
}

async fn run_case(
    plane: &'static pgop_testenv::ControlPlane,
    admin: kube::Client,
    case: Option<Case>,
    standby: bool,
) -> Result<String> {
    let ns = pgop_testenv::TestNamespace::create(plane.config(), "instance-rbac").await?;
    let n = ns.name().to_string();
    let label = match &case {
        None if standby => "control (standby)".to_string(),
        None => "control".to_string(),
        Some(c) => format!(
            "{}{} {}/{} → never {:?}",
            c.verb,
            c.also.iter().map(|v| format!("+{v}")).collect::<String>(),
            c.group,
            c.resource,
            c.never
        ),
    };
    let result = async {
        let rules = prepare(&admin, &n, standby).await?;
        if let Some(c) = &case {
            let mut rules = without(&rules, c.group, c.resource, c.verb)?;
            for verb in c.also {
                rules = without(&rules, c.group, c.resource, verb)?;
            }
            set_rules(&admin, &n, rules).await?;
        }
        let manager = Manager::spawn(plane, &n)?;
        match &case {
            None => {
                let steps = if standby {
                    vec![Step::ClonesPrimary]
                } else {
                    vec![Step::ReadyPrimary, Step::LeaseRenewed]
                };
                for step in steps {
                    if !within(STEP_TIMEOUT, || happened(&admin, &n, &manager, step)).await {
                        return Err(format!(
                            "{step:?} not with the whole Role:\n{}",
                            manager.log()
                        )
                        .into());
                    }
                }
                if manager.log().contains("cannot ") {
                    return Err(format!("refused with the whole Role:\n{}", manager.log()).into());
                }
            }
            Some(c) => {
                if !within(STEP_TIMEOUT, || async {
                    manager.refused(c.verb, c.resource)
                })
                .await
                {
                    return Err(format!(
                        "no refusal of {} {}:\n{}",
                        c.verb,
                        c.resource,
                        manager.log()
                    )
                    .into());
                }
                if let Some(step) = c.never
                    && within(NEVER, || happened(&admin, &n, &manager, step)).await
                {
                    return Err(format!("{step:?} happened all the same").into());
                }
            }
        }
        Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
    }
    .await;
    let _ = ns.delete().await;
    result
        .map(|()| label.clone())
        .map_err(|e| format!("{label}: {e}").into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_instance_role_is_needed_verb_by_verb() -> Result {
    let plane = pgop_testenv::shared().await?;
    let admin = plane.client()?;
    pgop_testenv::crds::install_converting(
        &admin,
        pgop_api::crds(),
        pgop_api::v1beta1::review_json,
        pgop_api::CONVERT_PATH,
    )
    .await?;
    let started = Instant::now();
    // Four at a time: most cases never start PostgreSQL, a few do.
    let permits = std::sync::Arc::new(tokio::sync::Semaphore::new(4));
    let mut runs = tokio::task::JoinSet::new();
    let runs_of = [(None, false), (None, true)]
        .into_iter()
        .chain(cases().into_iter().map(|c| {
            let standby = c.standby();
            (Some(c), standby)
        }));
    for (case, standby) in runs_of {
        let (admin, permits) = (admin.clone(), permits.clone());
        runs.spawn(async move {
            let _permit = permits.acquire_owned().await;
            run_case(plane, admin, case, standby).await
        });
    }
    let mut results = Vec::new();
    while let Some(joined) = runs.join_next().await {
        results.push(joined.map_err(|e| e.to_string())?);
    }
    let mut failures = Vec::new();
    for r in results {
        match r {
            Ok(label) => eprintln!("ok   {label}"),
            Err(e) => failures.push(e.to_string()),
        }
    }
    eprintln!("{:.1}s", started.elapsed().as_secs_f64());
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    Ok(())
}
