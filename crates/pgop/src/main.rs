//! `pgop`: the one binary of the pgop PostgreSQL operator.

mod backup;
mod crd;
mod dev;
mod instance;
mod kubectl;
mod migrate;
mod operator;
mod pooler;

use clap::{Parser, Subcommand};
use pgop_api::error_chain;
use std::process::ExitCode;

/// The version this binary reports: `pgop --version`, the operator's log and its
/// `pgop_operator_build_info` metric, the instance manager's `managerVersion` on
/// `/pg/status`, and the default instance image `pgop:<version>`. The workspace version,
/// unless `PGOP_VERSION` was set when this crate was compiled: `hack/build-images.sh
/// --next-version` builds a second image that way, to test upgrades (docs/images.md).
pub const VERSION: &str = match option_env!("PGOP_VERSION") {
    Some(v) if !v.is_empty() => v,
    _ => env!("CARGO_PKG_VERSION"),
};

/// pgop: a Kubernetes operator for highly available PostgreSQL.
#[derive(Debug, Parser)]
#[command(name = "pgop", version = VERSION, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a local development environment: a real Kubernetes control plane (etcd,
    /// kube-apiserver, kube-controller-manager, kube-scheduler) on loopback ports, usable
    /// with kubectl until Ctrl-C. Needs the binaries built by `hack/install-testenv.sh`.
    Dev(dev::Args),
    /// Run the operator: reconcile PostgresClusters into instance Pods, PVCs, Services,
    /// Secrets, a PodDisruptionBudget and RBAC, and report their status. Uses the
    /// kubeconfig (KUBECONFIG) or the in-cluster service account.
    Operator(operator::Args),
    /// The instance manager (PID 1 of every PostgreSQL pod): `pgop instance run`.
    Instance(instance::Args),
    /// The pooler manager (PID 1 of every PgBouncer pooler pod of `spec.poolers`): `pgop
    /// pooler run`.
    Pooler(pooler::Args),
    /// Base and logical backups, restores and retention in a backup store (`pgop backup
    /// --help`).
    Backup(backup::Args),
    /// Print the CustomResourceDefinitions (PostgresCluster, PostgresBackup) as YAML.
    Crd,
    /// Write every PostgresCluster and PostgresBackup again in its CRD's storage version,
    /// then drop the other versions from the CRD's status.storedVersions (docs/api.md,
    /// "Upgrading"). Safe to run twice and while the operator runs; needs the operator's
    /// conversion webhook up. Uses the kubeconfig (KUBECONFIG).
    MigrateStorage(migrate::Args),
    /// The kubectl plugin (`kubectl pgop`, when this binary is on the PATH as
    /// `kubectl-pgop`): status, promote, restart, backup, fence, hibernate (docs/kubectl.md).
    Kubectl(kubectl::Args),
}

/// `RUST_LOG` wins; otherwise `default`. JSON lines for the instance and pooler managers,
/// whose output is a pod's log (PostgreSQL's and PgBouncer's own lines are JSON there
/// too), and for the operator with `--log-format json`. With `service`, spans are in traces (pgop_telemetry): exported
/// over OTLP when the OpenTelemetry variables name an endpoint; the exporter returned is
/// shut down (flushed) when the command ends.
fn init_tracing(
    default: &str,
    json: bool,
    service: Option<&str>,
) -> Result<Option<pgop_telemetry::Exporter>, String> {
    use tracing_subscriber::Layer;
    use tracing_subscriber::filter::{FilterExt, filter_fn};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    // RUST_LOG filters the log; traces take pgop's spans whatever it says (each layer
    // its own filter).
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default))
            .and(filter_fn(pgop_telemetry::for_logs))
    };
    // Colours only on a terminal: a Pod's log file gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    // One list of boxed layers over the registry: a Vec of layers is a layer, whatever
    // the output format.
    let mut layers: Vec<Box<dyn Layer<tracing_subscriber::Registry> + Send + Sync>> = Vec::new();
    if json {
        layers.push(
            tracing_subscriber::fmt::layer()
                .json()
                .with_writer(std::io::stderr)
                .with_filter(filter())
                .boxed(),
        );
    } else {
        layers.push(
            tracing_subscriber::fmt::layer()
                .with_ansi(ansi)
                .with_writer(std::io::stderr)
                .with_filter(filter())
                .boxed(),
        );
    }
    let mut exporter = None;
    if let Some(service) = service {
        let (layer, started) = pgop_telemetry::from_env(service, VERSION)?;
        layers.push(
            layer
                .with_filter(filter_fn(pgop_telemetry::for_traces))
                .boxed(),
        );
        exporter = started;
    }
    tracing_subscriber::registry().with(layers).init();
    Ok(exporter)
}

/// `User-Agent: pgop-<component>/<version>`: every request a pgop component sends says
/// which one sent it, in the API server's audit log and request logs.
pub fn with_user_agent(
    mut config: kube::Config,
    component: &str,
) -> Result<kube::Config, http::header::InvalidHeaderValue> {
    let agent = http::HeaderValue::from_str(&format!("pgop-{component}/{VERSION}"))?;
    config
        .headers
        .retain(|(name, _)| name != http::header::USER_AGENT);
    config.headers.push((http::header::USER_AGENT, agent));
    Ok(config)
}

/// A client from the kubeconfig (KUBECONFIG) or the in-cluster service account, with
/// [`with_user_agent`].
pub async fn kube_client(component: &str) -> Result<kube::Client, String> {
    let config = kube::Config::infer()
        .await
        .map_err(|e| format!("failed to connect to Kubernetes: {e}"))?;
    let config = with_user_agent(config, component).map_err(|e| e.to_string())?;
    kube::Client::try_from(config).map_err(|e| format!("failed to connect to Kubernetes: {e}"))
}

#[tokio::main]
async fn main() -> ExitCode {
    if kubectl::invoked_as_plugin() {
        // What fails reaches the user as an error or in the report, not as client logs.
        if let Err(e) = init_tracing("warn,kube_client=off", false, None) {
            eprintln!("kubectl pgop: {e}");
            return ExitCode::FAILURE;
        }
        let cli = kubectl::PluginCli::parse();
        return match kubectl::run(cli.args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("kubectl pgop: {}", error_chain(&*err));
                ExitCode::FAILURE
            }
        };
    }
    let cli = Cli::parse();
    // The dev environment polls components until they answer; their refusals are noise.
    let json = match &cli.command {
        Command::Instance(_) | Command::Pooler(_) => true,
        Command::Operator(args) => args.log_format == operator::LogFormat::Json,
        Command::Dev(args) => args.operator.log_format == operator::LogFormat::Json,
        _ => false,
    };
    // Traces from the two long-running components (docs/observability.md, "Traces").
    let service = match &cli.command {
        Command::Operator(_) => Some("pgop-operator"),
        Command::Instance(_) => Some("pgop-instance"),
        _ => None,
    };
    let exporter = match init_tracing(
        match cli.command {
            Command::Dev(_) => "warn,kube_client=off",
            Command::Operator(_)
            | Command::Instance(_)
            | Command::Pooler(_)
            | Command::Backup(_) => "info",
            Command::Kubectl(_) => "warn,kube_client=off",
            Command::Crd | Command::MigrateStorage(_) => "warn",
        },
        json,
        service,
    ) {
        Ok(exporter) => exporter,
        Err(e) => {
            eprintln!("pgop: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        Command::Dev(args) => dev::run(args).await,
        Command::Operator(args) => operator::run(args).await,
        Command::Instance(args) => instance::run(args).await,
        Command::Pooler(args) => pooler::run(args).await,
        Command::Backup(args) => backup::run(args).await,
        Command::Crd => crd::run(),
        Command::MigrateStorage(args) => migrate::run(args).await,
        Command::Kubectl(args) => kubectl::run(args).await,
    };
    if let Some(exporter) = exporter {
        exporter.shutdown(std::time::Duration::from_secs(5)).await;
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("pgop: {}", error_chain(&*err));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn every_request_names_the_component_and_version() {
        let config = kube::Config::new("https://127.0.0.1:6443".parse().expect("uri"));
        let config = super::with_user_agent(config, "operator").expect("a header value");
        let agents: Vec<_> = config
            .headers
            .iter()
            .filter(|(n, _)| n == http::header::USER_AGENT)
            .map(|(_, v)| v.to_str().unwrap_or_default().to_string())
            .collect();
        assert_eq!(agents, [format!("pgop-operator/{}", super::VERSION)]);
    }

    #[test]
    fn the_command_line_is_well_formed() {
        super::Cli::command().debug_assert();
        super::kubectl::PluginCli::command().debug_assert();
    }
}
