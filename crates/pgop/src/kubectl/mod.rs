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
use pgop_api::constants::{
    ANNOTATION_RESTART, ANNOTATION_RESTART_INSTANCE, ANNOTATION_SWITCHOVER_TO,
};
use pgop_api::v1beta1::PostgresCluster;
use serde_json::json;
use std::io::Write;

mod logs;
mod psql;
mod report;
mod status;

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
    /// Switch the primary over to INSTANCE (the `switchover-to` annotation); without
    /// INSTANCE, promote a replica cluster (`spec.replica.enabled: false`: it stops
    /// following its source and takes writes, once pgop has checked it).
    Promote {
        cluster: String,
        instance: Option<String>,
    },
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
    /// This machine's psql, logged in with the cluster's app Secret (no password on any
    /// command line), to the primary, a standby or a pooler, through `kubectl
    /// port-forward`; arguments after `--` go to psql.
    Psql {
        cluster: String,
        /// A ready standby instead of the primary.
        #[arg(long)]
        replica: bool,
        /// A ready Pod of the pooler NAME (`spec.poolers`) instead of an instance.
        #[arg(long, value_name = "NAME", conflicts_with = "replica")]
        pooler: Option<String>,
        #[arg(last = true)]
        psql_args: Vec<String>,
    },
    /// The logs of every instance Pod, merged in time order.
    Logs {
        cluster: String,
        /// `text` (the default: time, Pod, level, message) or `json` (one object a line).
        #[arg(short = 'o', long, default_value = "text")]
        output: Output,
        /// Only the last N lines of each Pod.
        #[arg(long)]
        tail: Option<i64>,
    },
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
    if let Command::Psql {
        cluster,
        replica,
        pooler,
        psql_args,
    } = &args.command
    {
        let c = find(&client, &namespace, cluster).await?;
        let to = match pooler {
            Some(name) => psql::To::Pooler(name.clone()),
            None if *replica => psql::To::Replica,
            None => psql::To::Primary,
        };
        let code = psql::run(
            &client,
            &namespace,
            args.context.as_deref(),
            &c,
            &to,
            psql_args,
        )
        .await?;
        if code != 0 {
            std::process::exit(code);
        }
        return Ok(());
    }
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
        Command::Psql { .. } => return Err("psql runs from `run`".into()),
        Command::Logs {
            cluster,
            output,
            tail,
        } => {
            find(client, ns, &cluster).await?;
            logs::print(client, ns, &cluster, tail, output == Output::Json, out).await?;
        }
        Command::Status { cluster, output } => {
            let c = find(client, ns, &cluster).await?;
            let view = status::read(client, ns, &c).await?;
            match output {
                Output::Json => writeln!(out, "{}", serde_json::to_string_pretty(&view)?)?,
                Output::Text => status::render(&view, out, colour)?,
            }
        }
        Command::Promote {
            cluster,
            instance: None,
        } => {
            let c = find(client, ns, &cluster).await?;
            if !c.spec.replica.as_ref().is_some_and(|r| r.enabled) {
                return Err(format!(
                    "{cluster} is no replica cluster (spec.replica.enabled): name the INSTANCE to switch over to"
                )
                .into());
            }
            clusters
                .patch(
                    &cluster,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"replica": {"enabled": false}}})),
                )
                .await?;
            writeln!(
                out,
                "promotion of replica cluster {cluster} requested; `kubectl pgop status {cluster} -n {ns}` follows it (ReplicaPromoted)"
            )?;
        }
        Command::Promote {
            cluster,
            instance: Some(instance),
        } => {
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
                "postgresbackup/{name} created; `kubectl get postgresbackup {name} -n {ns} -w` follows it"
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
            let files = report::files(client, ns, &c).await?;
            let count = files.len();
            std::fs::write(&path, report::tar(&files, Timestamp::now().as_second()))
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

/// Attempts of a read-modify-write that meets a concurrent write (409 Conflict) before
/// it gives up: the operator writes the cluster's status often.
const CONFLICT_ATTEMPTS: usize = 5;

/// `fence` (`on`) or `unfence`: the instance added to or removed from
/// `spec.fencedInstances`; the write carries the resourceVersion read, so that it fails
/// rather than drop a concurrent change of the list, and is then made again on a fresh
/// read (a status write in between is enough to conflict).
async fn fence(
    clusters: &Api<PostgresCluster>,
    client: &Client,
    ns: &str,
    cluster: &str,
    instance: &str,
    on: bool,
    out: &mut impl Write,
) -> Result<(), Error> {
    let word = if on { "fenced" } else { "unfenced" };
    let mut attempt = 0;
    loop {
        attempt += 1;
        let c = find(client, ns, cluster).await?;
        let instance = member(&c, instance)?;
        let mut fenced = c.spec.fenced_instances.clone();
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
        match clusters
            .patch(cluster, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                writeln!(out, "{instance} {word} (spec.fencedInstances: {fenced:?})")?;
                return Ok(());
            }
            Err(kube::Error::Api(e)) if e.code == 409 && attempt < CONFLICT_ATTEMPTS => continue,
            Err(e) => return Err(e.into()),
        }
    }
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
}
