//! `kubectl pgop`: the kubectl plugin. The same binary answers as `kubectl-pgop` (a
//! symlink or copy of `pgop` under that name on the PATH, which kubectl finds) and as
//! `pgop kubectl`. Everything it does goes through the API server, as a user with kubectl
//! would: it reads the cluster, its instances' status and its PostgresBackups, and asks for
//! changes the way the docs describe (the switchover and restart annotations, a
//! PostgresBackup, `spec.fencedInstances`, `spec.hibernate`); the operator does the rest.

use jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use pgop_api::PostgresBackup;
use pgop_api::cluster::InstanceRole;
use pgop_api::constants::{
    ANNOTATION_RESTART, ANNOTATION_RESTART_INSTANCE, ANNOTATION_SWITCHOVER_TO,
};
use pgop_api::v1beta1::PostgresCluster;
use serde_json::json;
use std::io::Write;

pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// `kubectl pgop` (or `pgop kubectl`).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The namespace of the cluster [default: the kubeconfig context's, else `default`].
    #[arg(short = 'n', long, global = true)]
    namespace: Option<String>,
    /// The kubeconfig context to use [default: the current one].
    #[arg(long, global = true)]
    context: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// One screen about a cluster: instances (role, readiness, LSNs, lag), the primary and
    /// since when, backups and the recoverability window, conditions.
    Status {
        /// The PostgresCluster.
        cluster: String,
        /// `text` (the default; colours only on a terminal) or `json`, for scripts.
        #[arg(short = 'o', long, default_value = "text")]
        output: Output,
    },
    /// Switch the primary over to INSTANCE (the `switchover-to` annotation).
    Promote { cluster: String, instance: String },
    /// Restart every instance one at a time, standbys first, or only INSTANCE.
    Restart {
        cluster: String,
        instance: Option<String>,
    },
    /// Take a backup now: a PostgresBackup of the cluster.
    Backup {
        cluster: String,
        /// `base` (a base backup, the default) or `logical` (`pg_dump`).
        #[arg(long, default_value = "base")]
        method: Method,
    },
    /// Stop PostgreSQL in INSTANCE and keep its Pod (`spec.fencedInstances`).
    Fence { cluster: String, instance: String },
    /// Start PostgreSQL in a fenced INSTANCE again.
    Unfence { cluster: String, instance: String },
    /// Delete the cluster's Pods and keep its volumes (`spec.hibernate: true`).
    Hibernate { cluster: String },
    /// Bring a hibernated cluster back (`spec.hibernate: false`).
    Resume { cluster: String },
    /// Write a tarball of what support needs about a cluster: the cluster, its status
    /// screen, Pods, claims, Services, Events, PostgresBackups, its Secrets with every value
    /// redacted, and the Pods' logs.
    Report {
        cluster: String,
        /// Where to write it [default: `report-<cluster>-<UTC time>.tar` here].
        #[arg(long)]
        output: Option<std::path::PathBuf>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Output {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Method {
    Base,
    Logical,
}

/// Whether this process was started as the kubectl plugin (`kubectl-pgop`).
pub fn invoked_as_plugin() -> bool {
    std::env::args_os()
        .next()
        .and_then(|a| {
            std::path::Path::new(&a)
                .file_name()
                .map(|n| n.to_string_lossy().starts_with("kubectl-pgop"))
        })
        .unwrap_or(false)
}

/// The plugin's command line when started as `kubectl-pgop`.
#[derive(Debug, clap::Parser)]
#[command(name = "kubectl pgop", version = crate::VERSION, about = "pgop's kubectl plugin")]
pub struct PluginCli {
    #[command(flatten)]
    pub args: Args,
}

pub async fn run(args: Args) -> Result<(), Error> {
    let options = kube::config::KubeConfigOptions {
        context: args.context.clone(),
        ..Default::default()
    };
    let config = match kube::Config::from_kubeconfig(&options).await {
        Ok(c) => c,
        Err(_) if args.context.is_none() => kube::Config::infer().await?,
        Err(e) => return Err(format!("kubeconfig context {:?}: {e}", args.context).into()),
    };
    let namespace = args
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let config = crate::with_user_agent(config, "kubectl")?;
    let client = Client::try_from(config)?;
    let mut out = std::io::stdout().lock();
    let colour = std::io::IsTerminal::is_terminal(&std::io::stdout());
    execute(&client, &namespace, args.command, &mut out, colour).await
}

async fn execute(
    client: &Client,
    ns: &str,
    command: Command,
    out: &mut impl Write,
    colour: bool,
) -> Result<(), Error> {
    let clusters: Api<PostgresCluster> = Api::namespaced(client.clone(), ns);
    match command {
        Command::Status { cluster, output } => {
            let c = find(client, ns, &cluster).await?;
            let backups = Api::<PostgresBackup>::namespaced(client.clone(), ns)
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .filter(|b| b.spec.cluster.name == cluster)
                .collect::<Vec<_>>();
            let mut view = view(&c, &backups, Timestamp::now());
            match certificates(client, ns, &cluster, Timestamp::now()).await {
                Ok(c) => view.certificates = c,
                Err(e) => view.certificates_error = Some(e),
            }
            match output {
                Output::Json => writeln!(out, "{}", serde_json::to_string_pretty(&view)?)?,
                Output::Text => render(&view, out, colour)?,
            }
        }
        Command::Promote { cluster, instance } => {
            let c = find(client, ns, &cluster).await?;
            let instance = member(&c, &instance)?;
            let status = c.status.as_ref();
            if status.and_then(|s| s.current_primary.as_deref()) == Some(instance.as_str()) {
                return Err(format!("{instance} is the primary of {cluster} already").into());
            }
            annotate(&clusters, &cluster, ANNOTATION_SWITCHOVER_TO, &instance).await?;
            writeln!(
                out,
                "switchover of {cluster} to {instance} requested; `kubectl pgop status {cluster} -n {ns}` follows it"
            )?;
        }
        Command::Restart { cluster, instance } => {
            let c = find(client, ns, &cluster).await?;
            match instance {
                Some(instance) => {
                    let instance = member(&c, &instance)?;
                    annotate(&clusters, &cluster, ANNOTATION_RESTART_INSTANCE, &instance).await?;
                    writeln!(out, "restart of {instance} requested")?;
                }
                None => {
                    let at = Timestamp::now().to_string();
                    annotate(&clusters, &cluster, ANNOTATION_RESTART, &at).await?;
                    writeln!(
                        out,
                        "restart of every instance of {cluster} requested: one at a time, standbys first"
                    )?;
                }
            }
        }
        Command::Backup { cluster, method } => {
            find(client, ns, &cluster).await?;
            let (method, word) = match method {
                Method::Base => ("baseBackup", "base"),
                Method::Logical => ("logical", "logical"),
            };
            let stamp = Timestamp::now().strftime("%Y%m%d%H%M%S").to_string();
            let name = backup_name(&cluster, word, &stamp);
            let backup: PostgresBackup = serde_json::from_value(json!({
                "apiVersion": "database.example.com/v1alpha1",
                "kind": "PostgresBackup",
                "metadata": {"name": name},
                "spec": {"cluster": {"name": cluster}, "method": method},
            }))?;
            Api::<PostgresBackup>::namespaced(client.clone(), ns)
                .create(&PostParams::default(), &backup)
                .await?;
            writeln!(
                out,
                "postgresbackup/{name} created; `kubectl get pgb {name} -n {ns} -w` follows it"
            )?;
        }
        Command::Fence { cluster, instance } => {
            fence(&clusters, client, ns, &cluster, &instance, true, out).await?;
        }
        Command::Unfence { cluster, instance } => {
            fence(&clusters, client, ns, &cluster, &instance, false, out).await?;
        }
        Command::Report { cluster, output } => {
            let c = find(client, ns, &cluster).await?;
            let stamp = Timestamp::now().strftime("%Y%m%dT%H%M%SZ").to_string();
            let path = output.unwrap_or_else(|| format!("report-{cluster}-{stamp}.tar").into());
            let files = report(client, ns, &c).await?;
            let count = files.len();
            std::fs::write(&path, tar(&files, Timestamp::now().as_second()))
                .map_err(|e| format!("writing {}: {e}", path.display()))?;
            writeln!(
                out,
                "{} written: {count} files, Secrets' values redacted",
                path.display()
            )?;
        }
        Command::Hibernate { cluster } => {
            hibernate(&clusters, client, ns, &cluster, true, out).await?
        }
        Command::Resume { cluster } => {
            hibernate(&clusters, client, ns, &cluster, false, out).await?
        }
    }
    Ok(())
}

/// `fence` (`on`) or `unfence`: the instance added to or removed from
/// `spec.fencedInstances`; the write carries the resourceVersion read, so that it fails
/// rather than drop a concurrent change of the list.
async fn fence(
    clusters: &Api<PostgresCluster>,
    client: &Client,
    ns: &str,
    cluster: &str,
    instance: &str,
    on: bool,
    out: &mut impl Write,
) -> Result<(), Error> {
    let c = find(client, ns, cluster).await?;
    let instance = member(&c, instance)?;
    let mut fenced = c.spec.fenced_instances.clone();
    let word = if on { "fenced" } else { "unfenced" };
    if fenced.contains(&instance) == on {
        writeln!(
            out,
            "{instance} is {word} already (spec.fencedInstances: {fenced:?})"
        )?;
        return Ok(());
    }
    if on {
        fenced.push(instance.clone());
    } else {
        fenced.retain(|i| *i != instance);
    }
    let patch = json!({
        "metadata": {"resourceVersion": c.resource_version()},
        "spec": {"fencedInstances": fenced},
    });
    clusters
        .patch(cluster, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    writeln!(out, "{instance} {word} (spec.fencedInstances: {fenced:?})")?;
    Ok(())
}

/// `hibernate` (`on`) or `resume`: `spec.hibernate`.
async fn hibernate(
    clusters: &Api<PostgresCluster>,
    client: &Client,
    ns: &str,
    cluster: &str,
    on: bool,
    out: &mut impl Write,
) -> Result<(), Error> {
    let c = find(client, ns, cluster).await?;
    if c.spec.hibernate == on {
        let word = if on { "hibernating" } else { "not hibernating" };
        writeln!(out, "{cluster} is {word} already (spec.hibernate: {on})")?;
        return Ok(());
    }
    let patch = json!({"spec": {"hibernate": on}});
    clusters
        .patch(cluster, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let word = if on { "hibernates" } else { "resumes" };
    writeln!(out, "{cluster} {word}")?;
    Ok(())
}

/// The files of `report`: name and content.
async fn report(
    client: &Client,
    ns: &str,
    c: &PostgresCluster,
) -> Result<Vec<(String, Vec<u8>)>, Error> {
    use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim, Pod, Secret, Service};
    let name = c.name_any();
    let selector = ListParams::default().labels(&format!("{}={name}", pgop_api::labels::CLUSTER));
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    let mut cluster = c.clone();
    cluster.metadata.managed_fields = None;
    files.push((
        "cluster.yaml".into(),
        serde_yaml::to_string(&cluster)?.into_bytes(),
    ));
    let backups: Vec<PostgresBackup> = Api::<PostgresBackup>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|b| b.spec.cluster.name == name)
        .collect();
    let mut v = view(c, &backups, Timestamp::now());
    match certificates(client, ns, &name, Timestamp::now()).await {
        Ok(c) => v.certificates = c,
        Err(e) => v.certificates_error = Some(e),
    }
    let mut screen = Vec::new();
    render(&v, &mut screen, false)?;
    files.push(("status.txt".into(), screen));
    files.push(("status.json".into(), serde_json::to_vec_pretty(&v)?));
    files.push(("backups.yaml".into(), yaml_list(&backups)?));
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&selector)
        .await?
        .items;
    files.push(("pods.yaml".into(), yaml_list(&pods)?));
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .list(&selector)
        .await?
        .items;
    files.push(("pvcs.yaml".into(), yaml_list(&claims)?));
    let services = Api::<Service>::namespaced(client.clone(), ns)
        .list(&selector)
        .await?
        .items;
    files.push(("services.yaml".into(), yaml_list(&services)?));
    // Secrets: which exist and their keys, never a value.
    let secrets: Vec<Secret> = Api::<Secret>::namespaced(client.clone(), ns)
        .list(&selector)
        .await?
        .items
        .into_iter()
        .map(redact)
        .collect();
    files.push(("secrets.yaml".into(), yaml_list(&secrets)?));
    let prefix = format!("{name}-");
    let events: Vec<Event> = Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| {
            e.involved_object
                .name
                .as_deref()
                .is_some_and(|n| n == name || n.starts_with(&prefix))
        })
        .collect();
    files.push(("events.yaml".into(), yaml_list(&events)?));
    let logs = Api::<Pod>::namespaced(client.clone(), ns);
    for pod in &pods {
        let pod = pod.name_any();
        let params = kube::api::LogParams {
            tail_lines: Some(2000),
            ..Default::default()
        };
        match logs.logs(&pod, &params).await {
            Ok(text) => files.push((format!("logs/{pod}.log"), text.into_bytes())),
            Err(e) => files.push((
                format!("logs/{pod}.unavailable"),
                format!("the API server gave no log for {pod}: {e}\n").into_bytes(),
            )),
        }
    }
    Ok(files)
}

/// A Secret with every value replaced by its length (under `stringData`, readable).
fn redact(mut secret: k8s_openapi::api::core::v1::Secret) -> k8s_openapi::api::core::v1::Secret {
    secret.metadata.managed_fields = None;
    if let Some(annotations) = secret.metadata.annotations.as_mut() {
        // kubectl apply keeps the whole object, values included, in this annotation.
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
    let mut redacted = std::collections::BTreeMap::new();
    for (key, value) in secret.data.take().unwrap_or_default() {
        redacted.insert(key, format!("<redacted: {} bytes>", value.0.len()));
    }
    for (key, value) in secret.string_data.take().unwrap_or_default() {
        redacted.insert(key, format!("<redacted: {} bytes>", value.len()));
    }
    secret.string_data = Some(redacted);
    secret
}

/// Objects as one YAML list, their managedFields left out.
fn yaml_list<K: kube::Resource + serde::Serialize + Clone>(items: &[K]) -> Result<Vec<u8>, Error> {
    let items: Vec<K> = items
        .iter()
        .cloned()
        .map(|mut k| {
            k.meta_mut().managed_fields = None;
            k
        })
        .collect();
    Ok(serde_yaml::to_string(&items)?.into_bytes())
}

/// An uncompressed tar archive (POSIX ustar) of `files` under `report/`, every file mode
/// 0644 and time `mtime`.
fn tar(files: &[(String, Vec<u8>)], mtime: i64) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, content) in files {
        let mut header = [0u8; 512];
        let path = format!("report/{name}");
        let field = |header: &mut [u8; 512], at: usize, len: usize, value: &[u8]| {
            let n = value.len().min(len);
            header[at..at + n].copy_from_slice(&value[..n]);
        };
        field(&mut header, 0, 100, path.as_bytes());
        field(&mut header, 100, 8, b"0000644\0");
        field(&mut header, 108, 8, b"0000000\0");
        field(&mut header, 116, 8, b"0000000\0");
        field(
            &mut header,
            124,
            12,
            format!("{:011o}\0", content.len()).as_bytes(),
        );
        field(
            &mut header,
            136,
            12,
            format!("{:011o}\0", mtime.max(0)).as_bytes(),
        );
        header[156] = b'0';
        field(&mut header, 257, 8, b"ustar\x0000");
        // The checksum is computed with its own field as spaces.
        header[148..156].copy_from_slice(b"        ");
        let sum: u32 = header.iter().map(|&b| u32::from(b)).sum();
        field(&mut header, 148, 8, format!("{sum:06o}\0 ").as_bytes());
        out.extend_from_slice(&header);
        out.extend_from_slice(content);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.resize(out.len() + 1024, 0);
    out
}

/// A PostgresBackup name for a backup taken now, within the 253 characters of a name.
fn backup_name(cluster: &str, method: &str, stamp: &str) -> String {
    format!("{cluster}-{method}-{stamp}")
}

async fn annotate(
    clusters: &Api<PostgresCluster>,
    cluster: &str,
    key: &str,
    value: &str,
) -> Result<(), Error> {
    let patch = json!({"metadata": {"annotations": {key: value}}});
    clusters
        .patch(cluster, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// The cluster `name` of `ns`, or an error that says what to do: the closest name in the
/// namespace, or the namespaces that have one of that name.
async fn find(client: &Client, ns: &str, name: &str) -> Result<PostgresCluster, Error> {
    let here: Api<PostgresCluster> = Api::namespaced(client.clone(), ns);
    if let Some(c) = here.get_opt(name).await? {
        return Ok(c);
    }
    let names: Vec<String> = here
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|c| c.name_any())
        .collect();
    let mut message = format!("cluster {name:?} not found in namespace {ns}");
    if let Some(close) = closest(name, &names) {
        message.push_str(&format!("; did you mean {close:?}?"));
    } else {
        // Elsewhere? Only when this user may list across namespaces.
        let elsewhere: Vec<String> = Api::<PostgresCluster>::all(client.clone())
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
            .iter()
            .filter(|c| c.name_any() == name)
            .filter_map(|c| c.namespace())
            .collect();
        if !elsewhere.is_empty() {
            message.push_str(&format!(
                "; it exists in namespace {} (use -n)",
                elsewhere.join(", ")
            ));
        } else if names.is_empty() {
            message.push_str(" (no PostgresCluster there)");
        }
    }
    Err(message.into())
}

/// `instance` if it is one of the cluster's instances, or an error listing them. A bare
/// serial (`2`) stands for `<cluster>-2`.
fn member(c: &PostgresCluster, instance: &str) -> Result<String, Error> {
    let name = if !instance.is_empty() && instance.bytes().all(|b| b.is_ascii_digit()) {
        format!("{}-{instance}", c.name_any())
    } else {
        instance.to_string()
    };
    let instances: Vec<&str> = c
        .status
        .iter()
        .flat_map(|s| &s.instances)
        .map(|i| i.name.as_str())
        .collect();
    if instances.contains(&name.as_str()) {
        return Ok(name);
    }
    Err(format!(
        "{name:?} is not an instance of {}; its instances: {}",
        c.name_any(),
        if instances.is_empty() {
            "none yet".to_string()
        } else {
            instances.join(", ")
        }
    )
    .into())
}

/// The name of `names` closest to `name` (edit distance at most a third of its length,
/// at least 2), if any.
fn closest<'a>(name: &str, names: &'a [String]) -> Option<&'a str> {
    let limit = (name.chars().count() / 3).max(2);
    names
        .iter()
        .map(|n| (distance(name, n), n))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, n)| n.as_str())
}

/// Levenshtein distance.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut previous = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous + usize::from(ca != *cb);
            previous = row[j + 1];
            row[j + 1] = substitution.min(row[j] + 1).min(row[j + 1] + 1);
        }
    }
    row[b.len()]
}

/// What `status` shows, as `-o json` prints it.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct View {
    cluster: String,
    namespace: String,
    phase: Option<String>,
    postgres_version: Option<i32>,
    instances_wanted: i32,
    instances_ready: i32,
    primary: Option<String>,
    primary_since: Option<String>,
    primary_for_seconds: Option<i64>,
    instances: Vec<InstanceView>,
    backups: BackupsView,
    /// The cluster's certificates (from their Secrets' `database.example.com/not-after`).
    certificates: Vec<CertificateView>,
    /// Why they could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    certificates_error: Option<String>,
    conditions: Vec<ConditionView>,
}

#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct CertificateView {
    secret: String,
    not_after: String,
    expires_in_days: i64,
}

#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct InstanceView {
    name: String,
    role: String,
    ready: bool,
    fenced: bool,
    timeline: Option<i64>,
    /// Primary: the current WAL LSN; standby: the last received.
    lsn: Option<String>,
    replayed_lsn: Option<String>,
    /// Standby: bytes of WAL the primary has written that it has not replayed.
    lag_bytes: Option<u64>,
    postgres_version: Option<String>,
}

#[derive(Debug, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct BackupsView {
    last_base_backup: Option<String>,
    last_logical_backup: Option<String>,
    /// The earliest time the cluster can be restored to (the oldest base backup kept).
    recoverable_from: Option<String>,
    next_base_backup: Option<String>,
    next_logical_backup: Option<String>,
    /// The cluster's PostgresBackups by phase.
    by_phase: std::collections::BTreeMap<String, usize>,
    running: Vec<String>,
}

#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct ConditionView {
    #[serde(rename = "type")]
    type_: String,
    status: String,
    reason: String,
    message: String,
}

fn view(c: &PostgresCluster, backups: &[PostgresBackup], now: Timestamp) -> View {
    let status = c.status.clone().unwrap_or_default();
    let lsn = |s: &Option<String>| s.as_deref().and_then(pgop_api::instance_status::parse_lsn);
    let primary_lsn = status
        .instances
        .iter()
        .find(|i| i.role == Some(InstanceRole::Primary))
        .and_then(|i| lsn(&i.received_lsn));
    let instances = status
        .instances
        .iter()
        .map(|i| InstanceView {
            name: i.name.clone(),
            role: match i.role {
                Some(InstanceRole::Primary) => "primary",
                Some(InstanceRole::Replica) => "standby",
                None => "unknown",
            }
            .to_string(),
            ready: i.ready,
            fenced: i.fenced,
            timeline: i.timeline,
            lsn: i.received_lsn.clone(),
            replayed_lsn: i.replayed_lsn.clone(),
            lag_bytes: match (i.role, primary_lsn, lsn(&i.replayed_lsn)) {
                (Some(InstanceRole::Replica), Some(p), Some(r)) => Some(p.saturating_sub(r)),
                _ => None,
            },
            postgres_version: i.postgres_version.clone(),
        })
        .collect();
    let since = status.target_primary_since.as_ref().map(|t| t.0);
    let next = |schedule: Option<&String>| {
        let schedule = schedule?;
        let timezone = c.spec.backup.as_ref().and_then(|b| b.timezone.as_deref());
        pgop_operator::backup::schedule::Schedule::parse(schedule, timezone)
            .ok()?
            .next_after(now)
            .map(|t| t.to_string())
    };
    let mut by_phase = std::collections::BTreeMap::new();
    let mut running = Vec::new();
    for b in backups {
        let phase = b
            .status
            .as_ref()
            .and_then(|s| s.phase)
            .map_or_else(|| "New".to_string(), |p| format!("{p:?}"));
        if phase == "Running" {
            running.push(b.name_any());
        }
        *by_phase.entry(phase).or_insert(0) += 1;
    }
    View {
        cluster: c.name_any(),
        namespace: c.namespace().unwrap_or_default(),
        phase: status.phase.map(|p| format!("{p:?}")),
        postgres_version: status.postgres_version,
        instances_wanted: c.spec.instances,
        instances_ready: status.ready_replicas,
        primary: status.current_primary.clone(),
        primary_since: since.map(|t| t.to_string()),
        primary_for_seconds: since.map(|t| (now - t).get_seconds()).map(|s| s.max(0)),
        instances,
        backups: BackupsView {
            last_base_backup: status.last_backup_time.as_ref().map(|t| t.0.to_string()),
            last_logical_backup: status
                .last_logical_backup_time
                .as_ref()
                .map(|t| t.0.to_string()),
            recoverable_from: status
                .first_recoverability_point
                .as_ref()
                .map(|t| t.0.to_string()),
            next_base_backup: next(
                c.spec
                    .backup
                    .as_ref()
                    .and_then(|b| b.base.schedule.as_ref()),
            ),
            next_logical_backup: next(
                c.spec
                    .backup
                    .as_ref()
                    .and_then(|b| b.logical.schedule.as_ref()),
            ),
            by_phase,
            running,
        },
        certificates: Vec::new(),
        certificates_error: None,
        conditions: status
            .conditions
            .iter()
            .map(|k| ConditionView {
                type_: k.type_.clone(),
                status: k.status.clone(),
                reason: k.reason.clone(),
                message: k.message.clone(),
            })
            .collect(),
    }
}

/// When each certificate of the cluster expires: the `database.example.com/not-after`
/// annotation of its Secrets (read as metadata only: no value leaves the API server).
async fn certificates(
    client: &Client,
    ns: &str,
    cluster: &str,
    now: Timestamp,
) -> Result<Vec<CertificateView>, String> {
    let selector =
        ListParams::default().labels(&format!("{}={cluster}", pgop_api::labels::CLUSTER));
    let secrets = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), ns)
        .list_metadata(&selector)
        .await
        .map_err(|e| format!("the Secrets could not be listed: {e}"))?;
    let mut out: Vec<CertificateView> = secrets
        .items
        .iter()
        .filter_map(|s| {
            let at: Timestamp = s
                .annotations()
                .get(pgop_api::constants::ANNOTATION_NOT_AFTER)?
                .parse()
                .ok()?;
            Some(CertificateView {
                secret: s.name_any(),
                not_after: at.to_string(),
                expires_in_days: (at - now).get_seconds().div_euclid(86_400),
            })
        })
        .collect();
    out.sort_by(|a, b| a.secret.cmp(&b.secret));
    Ok(out)
}

/// `3m12s`, `2h05m`, `4d3h`.
fn human(seconds: i64) -> String {
    let s = seconds.max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{}h", s / 86400, (s % 86400) / 3600),
    }
}

fn bytes(b: u64) -> String {
    match b {
        0..1024 => format!("{b} B"),
        1024..1_048_576 => format!("{:.1} KiB", b as f64 / 1024.0),
        _ => format!("{:.1} MiB", b as f64 / 1_048_576.0),
    }
}

/// ANSI colours, only when writing to a terminal.
fn paint(text: &str, code: &str, colour: bool) -> String {
    if colour {
        format!("\x1b[{code}m{text}\x1b[0m")
    } else {
        text.to_string()
    }
}

const GREEN: &str = "32";
const YELLOW: &str = "33";
const RED: &str = "31";
const BOLD: &str = "1";

fn render(v: &View, out: &mut impl Write, colour: bool) -> std::io::Result<()> {
    let phase = v.phase.as_deref().unwrap_or("Unknown");
    let phase_colour = match phase {
        "Ready" => GREEN,
        "Degraded" | "Invalid" => RED,
        _ => YELLOW,
    };
    writeln!(
        out,
        "{} {} (namespace {})  phase {}  PostgreSQL {}  {}/{} instances ready",
        paint("Cluster", BOLD, colour),
        v.cluster,
        v.namespace,
        paint(phase, phase_colour, colour),
        v.postgres_version
            .map_or("?".to_string(), |m| m.to_string()),
        v.instances_ready,
        v.instances_wanted,
    )?;
    match (&v.primary, &v.primary_since, v.primary_for_seconds) {
        (Some(p), Some(since), Some(s)) => writeln!(
            out,
            "{} {p}, for {} (since {since})",
            paint("Primary", BOLD, colour),
            human(s)
        )?,
        (Some(p), _, _) => writeln!(out, "{} {p}", paint("Primary", BOLD, colour))?,
        _ => writeln!(out, "{} none", paint("Primary", BOLD, colour))?,
    }
    writeln!(out)?;
    writeln!(out, "{}", paint("Instances", BOLD, colour))?;
    let mut rows = vec![[
        "NAME".to_string(),
        "ROLE".to_string(),
        "READY".to_string(),
        "TIMELINE".to_string(),
        "LSN".to_string(),
        "REPLAYED".to_string(),
        "LAG".to_string(),
    ]];
    for i in &v.instances {
        // A fenced instance's PostgreSQL is stopped: no role to report.
        let role = match (i.fenced, i.role.as_str()) {
            (true, "unknown") => "fenced".to_string(),
            (true, role) => format!("{role} (fenced)"),
            (false, role) => role.to_string(),
        };
        rows.push([
            i.name.clone(),
            role,
            if i.ready { "yes" } else { "no" }.to_string(),
            i.timeline.map_or("-".into(), |t| t.to_string()),
            i.lsn.clone().unwrap_or_else(|| "-".into()),
            i.replayed_lsn.clone().unwrap_or_else(|| "-".into()),
            i.lag_bytes.map_or("-".into(), bytes),
        ]);
    }
    table(&rows, out)?;
    writeln!(out)?;
    writeln!(out, "{}", paint("Backups", BOLD, colour))?;
    let b = &v.backups;
    let or_none = |s: &Option<String>| s.clone().unwrap_or_else(|| "none".into());
    writeln!(
        out,
        "  last base backup:     {}",
        or_none(&b.last_base_backup)
    )?;
    writeln!(
        out,
        "  recoverable from:     {}",
        or_none(&b.recoverable_from)
    )?;
    writeln!(
        out,
        "  next base backup:     {}",
        b.next_base_backup
            .clone()
            .unwrap_or_else(|| "not scheduled".into())
    )?;
    writeln!(
        out,
        "  last logical backup:  {}",
        or_none(&b.last_logical_backup)
    )?;
    writeln!(
        out,
        "  next logical backup:  {}",
        b.next_logical_backup
            .clone()
            .unwrap_or_else(|| "not scheduled".into())
    )?;
    let counts: Vec<String> = b.by_phase.iter().map(|(p, n)| format!("{n} {p}")).collect();
    writeln!(
        out,
        "  PostgresBackups:      {}",
        if counts.is_empty() {
            "none".to_string()
        } else {
            counts.join(", ")
        }
    )?;
    writeln!(out)?;
    writeln!(out, "{}", paint("Certificates", BOLD, colour))?;
    match (&v.certificates_error, v.certificates.as_slice()) {
        (Some(why), _) => writeln!(out, "  {why}")?,
        (None, []) => writeln!(out, "  none found")?,
        (None, certs) => {
            for c in certs {
                let days = c.expires_in_days;
                let left = format!("in {days} days");
                let left = match days {
                    ..0 => paint("expired", RED, colour),
                    0..30 => paint(&left, YELLOW, colour),
                    _ => left,
                };
                writeln!(out, "  {}: expires {} ({left})", c.secret, c.not_after)?;
            }
        }
    }
    writeln!(out)?;
    writeln!(out, "{}", paint("Conditions", BOLD, colour))?;
    let mut rows = vec![[
        "TYPE".to_string(),
        "STATUS".to_string(),
        "REASON".to_string(),
        "MESSAGE".to_string(),
    ]];
    for k in &v.conditions {
        rows.push([
            k.type_.clone(),
            k.status.clone(),
            k.reason.clone(),
            k.message.clone(),
        ]);
    }
    table(&rows, out)
}

/// Left-aligned columns two spaces apart, indented by two; the last column unpadded.
fn table<const N: usize>(rows: &[[String; N]], out: &mut impl Write) -> std::io::Result<()> {
    let mut widths = [0usize; N];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for row in rows {
        let mut line = String::from(" ");
        for (k, (cell, w)) in row.iter().zip(widths).enumerate() {
            line.push(' ');
            if k + 1 == N {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$} "));
            }
        }
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_misspelled_name_finds_the_closest_and_nothing_far() {
        let names = vec!["orders".to_string(), "billing".to_string()];
        assert_eq!(closest("oders", &names), Some("orders"));
        assert_eq!(closest("biling", &names), Some("billing"));
        assert_eq!(closest("inventory", &names), None);
        assert_eq!(distance("kitten", "sitting"), 3);
    }

    #[test]
    fn the_status_screen_shows_roles_lag_backups_and_conditions_without_colour() {
        let c: PostgresCluster = serde_json::from_value(json!({
            "apiVersion": "database.example.com/v1beta1", "kind": "PostgresCluster",
            "metadata": {"name": "shop", "namespace": "prod"},
            "spec": {"instances": 2, "storage": {"size": "1Gi"},
                "backup": {"base": {"schedule": "0 3 * * *"}}},
            "status": {"phase": "Ready", "currentPrimary": "shop-1", "readyReplicas": 2,
                "postgresVersion": 15, "targetPrimarySince": "2026-12-04T10:00:00Z",
                "lastBackupTime": "2026-12-04T03:00:05Z",
                "instances": [
                    {"name": "shop-1", "serial": 1, "role": "primary", "ready": true,
                     "timeline": 1, "receivedLsn": "0/3000200"},
                    {"name": "shop-2", "serial": 2, "role": "replica", "ready": true,
                     "timeline": 1, "receivedLsn": "0/3000200", "replayedLsn": "0/3000000",
                     "fenced": true}],
                "conditions": [{"type": "Ready", "status": "True", "reason": "AllInstancesReady",
                    "message": "2 of 2 instances are ready",
                    "lastTransitionTime": "2026-12-04T10:00:00Z"}]}
        }))
        .expect("cluster");
        let now: Timestamp = "2026-12-04T10:03:12Z".parse().expect("time");
        let mut v = view(&c, &[], now);
        v.certificates = vec![
            CertificateView {
                secret: "shop-server-tls".into(),
                not_after: "2027-03-01T00:00:00Z".into(),
                expires_in_days: 86,
            },
            CertificateView {
                secret: "shop-replication-tls".into(),
                not_after: "2026-12-20T00:00:00Z".into(),
                expires_in_days: 15,
            },
        ];
        assert_eq!(v.primary_for_seconds, Some(192));
        assert_eq!(v.instances[1].lag_bytes, Some(0x200));
        assert_eq!(
            v.backups.next_base_backup.as_deref(),
            Some("2026-12-05T03:00:00Z")
        );
        let mut out = Vec::new();
        render(&v, &mut out, false).expect("render");
        let text = String::from_utf8(out).expect("utf-8");
        assert!(!text.contains('\x1b'), "no colour off a terminal");
        for part in [
            "Cluster shop (namespace prod)  phase Ready  PostgreSQL 15  2/2 instances ready",
            "Primary shop-1, for 3m12s (since 2026-12-04T10:00:00Z)",
            "shop-2  standby (fenced)  yes    1         0/3000200  0/3000000  512 B",
            "next base backup:     2026-12-05T03:00:00Z",
            "Ready  True    AllInstancesReady  2 of 2 instances are ready",
            "shop-server-tls: expires 2027-03-01T00:00:00Z (in 86 days)",
        ] {
            assert!(text.contains(part), "{part:?} in\n{text}");
        }
        let mut coloured = Vec::new();
        render(&v, &mut coloured, true).expect("render");
        let coloured = String::from_utf8_lossy(&coloured).into_owned();
        assert!(coloured.contains("\x1b[32mReady\x1b[0m"));
        assert!(
            coloured.contains("(\x1b[33min 15 days\x1b[0m)"),
            "{coloured}"
        );
    }
}
