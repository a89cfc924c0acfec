//! `pgop operator`: runs the controllers against the cluster in the kubeconfig or the
//! in-cluster service account.
//!
//! Why this file stays whole: it is one idea, the `pgop operator` command: its flags, how
//! they are checked and how they become the operator's options (`Args::options`); about 320
//! of its lines are the unit tests of that.

use pgop_operator::leader::DEFAULT_LEASE_NAME;
use pgop_operator::{LeaderElection, Options, Settings};
use std::net::{Ipv4Addr, SocketAddr};

/// `pgop operator`'s metrics address when `--metrics-bind-address` is not given.
pub const DEFAULT_METRICS_BIND_ADDRESS: SocketAddr = SocketAddr::new(
    std::net::IpAddr::V4(Ipv4Addr::UNSPECIFIED),
    pgop_api::constants::OPERATOR_METRICS_PORT,
);

/// A `--metrics-bind-address` value: an address, or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindAddress {
    Off,
    At(SocketAddr),
}

/// `IP:PORT`, `:PORT` (all interfaces), or `0` / the empty string for no HTTP server.
pub fn parse_bind_address(value: &str) -> Result<BindAddress, String> {
    let value = value.trim();
    if value.is_empty() || value == "0" {
        return Ok(BindAddress::Off);
    }
    let full = match value.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => value.to_string(),
    };
    full.parse().map(BindAddress::At).map_err(|_| {
        format!("{value:?} is not IP:PORT, :PORT, or 0 (off), e.g. 0.0.0.0:8080 or 127.0.0.1:0")
    })
}

/// A `--namespace` value: a namespace name, an RFC 1123 label (at most 63 lowercase
/// letters, digits and `-`, starting and ending with a letter or digit).
pub fn parse_namespace(value: &str) -> Result<String, String> {
    let value = value.trim();
    // An RFC 1123 label is a subdomain of one label.
    let valid =
        value.len() <= 63 && !value.contains('.') && pgop_api::formats::is_dns_subdomain(value);
    if valid {
        Ok(value.to_string())
    } else {
        Err(format!(
            "{value:?} is not a namespace name (an RFC 1123 label: at most 63 lowercase \
             letters, digits and '-', starting and ending with a letter or digit)"
        ))
    }
}

/// The namespaces in the order first given, each once.
fn unique(namespaces: Vec<String>) -> Vec<String> {
    let mut seen = std::collections::BTreeSet::new();
    namespaces
        .into_iter()
        .filter(|ns| seen.insert(ns.clone()))
        .collect()
}

/// `--instance-otlp-endpoint`: an http:// or https:// URL (checked as the managers will
/// read it), or empty for none.
fn parse_otlp_endpoint(value: &str) -> Result<String, String> {
    let value = value.trim();
    if value.is_empty() {
        return Ok(String::new());
    }
    pgop_telemetry::check_endpoint(value)?;
    Ok(value.to_string())
}

/// `pgop operator --log-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, clap::Args)]
#[group(id = "operator")]
pub struct Args {
    /// Watch only these namespaces: `--namespace a,b`, or the flag repeated [default: all
    /// namespaces]. Each watched namespace gets controllers of its own, and
    /// `--concurrency` applies to each.
    #[arg(long, env = "PGOP_NAMESPACE", value_name = "NS", value_delimiter = ',', value_parser = parse_namespace)]
    namespace: Vec<String>,
    /// Manage only the PostgresClusters whose labels match this label selector (`kubectl
    /// -l` syntax: `key=value`, `key!=value`, `key`, `!key`, `key in (a,b)`, `key notin
    /// (a,b)`, joined by commas), and the PostgresBackups of those clusters [default:
    /// every cluster]. Two operators with complementary selectors, such as
    /// `pgop.example.com/channel=canary` and `pgop.example.com/channel!=canary`, split the
    /// clusters between them.
    #[arg(long, env = "PGOP_CLUSTER_SELECTOR", value_name = "SELECTOR", value_parser = pgop_operator::selector::parse)]
    cluster_selector: Option<kube::core::Selector>,
    /// Most clusters reconciled at the same time, per watched namespace (and as many
    /// backups).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..))]
    concurrency: u16,
    /// Image of PostgreSQL instance pods when a cluster does not name one (PostgreSQL
    /// plus the pgop binary) [default: pgop:<this binary's version>].
    #[arg(long, env = "PGOP_IMAGE")]
    image: Option<String>,
    /// uid instance containers run as (PostgreSQL refuses to run as root) [default: 26;
    /// `pgop dev`: the local `postgres` user].
    #[arg(long, value_parser = clap::value_parser!(i64).range(1..))]
    pub instance_uid: Option<i64>,
    /// gid instance containers run as, also their fsGroup [default: 26; `pgop dev`: the
    /// local `postgres` group].
    #[arg(long, value_parser = clap::value_parser!(i64).range(1..))]
    pub instance_gid: Option<i64>,
    /// The OTLP/HTTP endpoint (http:// or https://, the collector's port 4318) the
    /// instance managers export traces to: set as OTEL_EXPORTER_OTLP_ENDPOINT in every
    /// instance container, so a change restarts every instance (rolling). The operator's
    /// own traces follow its OTEL_EXPORTER_OTLP_ENDPOINT (docs/operator.md, "Traces").
    #[arg(long, env = "PGOP_INSTANCE_OTLP_ENDPOINT", value_name = "URL", value_parser = parse_otlp_endpoint)]
    pub instance_otlp_endpoint: Option<String>,
    /// The log format on stderr: `text` (one line per event, readable in a terminal) or
    /// `json` (one JSON object per line, for a log pipeline). Every line of a cluster's
    /// reconcile carries its cluster and namespace (the `reconcile` span's fields).
    #[arg(long, env = "PGOP_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Where to serve /metrics (Prometheus), /healthz and /readyz: IP:PORT, :PORT, or `0`
    /// (or empty) for none; port 0 picks a free port [default: 0.0.0.0:8080; `pgop dev`:
    /// 127.0.0.1:0].
    #[arg(long, env = "PGOP_METRICS_BIND_ADDRESS", value_name = "ADDR", value_parser = parse_bind_address)]
    pub metrics_bind_address: Option<BindAddress>,
    /// Run the controllers only while holding the leader Lease, so that several replicas
    /// may run: `--leader-elect`, `--leader-elect=true|false` [default: true when
    /// POD_NAMESPACE is set (in a cluster), else false; `pgop dev`: false].
    #[arg(long, env = "PGOP_LEADER_ELECT", value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub leader_elect: Option<bool>,
    /// Namespace of the leader Lease [default: POD_NAMESPACE].
    #[arg(long, value_name = "NS")]
    leader_election_namespace: Option<String>,
    /// Name of the leader Lease.
    #[arg(long, value_name = "NAME", default_value = DEFAULT_LEASE_NAME)]
    leader_election_name: String,
    /// Where to serve the validating admission webhooks over HTTPS (every replica serves
    /// them, leader or not): IP:PORT, :PORT, or `0` (or empty) for none [default: none;
    /// the chart: :9443].
    #[arg(long, env = "PGOP_WEBHOOK_BIND_ADDRESS", value_name = "ADDR", value_parser = parse_bind_address)]
    webhook_bind_address: Option<BindAddress>,
    /// Serve the webhooks with `tls.crt` and `tls.key` from this directory (a
    /// cert-manager Certificate's Secret, mounted; read again every minute), and leave the
    /// configurations' caBundle to cert-manager [default: pgop's own certificate, kept in
    /// --webhook-secret].
    #[arg(long, value_name = "DIR")]
    webhook_cert_dir: Option<std::path::PathBuf>,
    /// The Secret (in POD_NAMESPACE, or --webhook-secret-namespace) where pgop keeps the
    /// webhooks' authority and serving certificate, shared by every replica.
    #[arg(long, value_name = "NAME", default_value = "pgop-webhook-tls")]
    webhook_secret: String,
    /// Namespace of --webhook-secret [default: POD_NAMESPACE].
    #[arg(long, value_name = "NS", value_parser = parse_namespace)]
    webhook_secret_namespace: Option<String>,
    /// A name the webhooks' certificate is for (the Service's DNS names, such as
    /// pgop-webhook.pgop-system.svc, or an IP address); repeat the flag or separate by
    /// commas.
    #[arg(long = "webhook-name", value_name = "NAME", value_delimiter = ',')]
    webhook_names: Vec<String>,
    /// A ValidatingWebhookConfiguration whose webhooks' caBundle pgop keeps (with its
    /// own certificate); repeat the flag or separate by commas.
    #[arg(
        long = "webhook-configuration",
        value_name = "NAME",
        value_delimiter = ','
    )]
    webhook_configurations: Vec<String>,
    /// A CustomResourceDefinition whose conversion webhook's caBundle pgop keeps (with its
    /// own certificate), when the CRD converts by webhook; repeat the flag or separate by
    /// commas.
    #[arg(
        long = "webhook-conversion-crd",
        value_name = "NAME",
        value_delimiter = ','
    )]
    webhook_conversion_crds: Vec<String>,
    /// The Service in front of this operator's webhooks, as NAMESPACE/NAME or
    /// NAMESPACE/NAME:PORT (port 443 unless given): written into each
    /// --webhook-conversion-crd with the caBundle, so that the API server calls this
    /// release of pgop to convert (a CRD names one conversion webhook). Unset: the CRD's own.
    #[arg(long, value_name = "NAMESPACE/NAME[:PORT]", value_parser = conversion_service)]
    webhook_conversion_service: Option<pgop_operator::webhook::cert::ConversionClient>,
    /// Days a serving certificate pgop makes is valid; it is renewed with a third of
    /// that left.
    #[arg(long, value_name = "DAYS", default_value_t = 365, value_parser = clap::value_parser!(i64).range(3..=3650))]
    webhook_cert_validity_days: i64,
}

pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// `--webhook-conversion-service`: NAMESPACE/NAME[:PORT], each name a DNS label.
fn conversion_service(
    value: &str,
) -> Result<pgop_operator::webhook::cert::ConversionClient, String> {
    let form =
        "expected NAMESPACE/NAME or NAMESPACE/NAME:PORT, such as pgop-system/pgop-operator-webhook";
    let (namespace, rest) = value
        .split_once('/')
        .ok_or_else(|| format!("{value:?}: {form}"))?;
    let (name, port) = match rest.split_once(':') {
        Some((name, port)) => {
            let port: i32 = port
                .parse()
                .ok()
                .filter(|p| (1..=65535).contains(p))
                .ok_or_else(|| format!("{value:?}: the port {port:?} is not 1 to 65535; {form}"))?;
            (name, port)
        }
        None => (rest, 443),
    };
    for (what, part) in [("namespace", namespace), ("Service name", name)] {
        if !pgop_api::formats::is_dns_label(part) {
            return Err(format!(
                "{value:?}: the {what} {part:?} is not a DNS label (lowercase letters, digits and '-'); {form}"
            ));
        }
    }
    Ok(pgop_operator::webhook::cert::ConversionClient::Service {
        namespace: namespace.to_string(),
        name: name.to_string(),
        port,
    })
}

/// What leader election defaults come from: the Pod (downward API) or the process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Env {
    /// `POD_NAMESPACE`: the operator's namespace.
    pub pod_namespace: Option<String>,
    /// `POD_NAME`: this replica's identity.
    pub pod_name: Option<String>,
    /// The host name and process id: the identity outside a Pod.
    pub hostname: String,
    pub pid: u32,
}

impl Env {
    /// This process's environment (unset and empty variables alike are `None`).
    pub fn current() -> Self {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .or_else(|| var("HOSTNAME"))
            .unwrap_or_else(|| "pgop".to_string());
        Self {
            pod_namespace: var("POD_NAMESPACE"),
            pod_name: var("POD_NAME"),
            hostname,
            pid: std::process::id(),
        }
    }
}

impl Args {
    /// Whether and how to elect a leader: on when `--leader-elect` says so, else when
    /// `POD_NAMESPACE` is set; the Lease's namespace from `--leader-election-namespace`,
    /// else `POD_NAMESPACE`; the identity `POD_NAME`, else `<hostname>-<pid>`.
    pub fn leader_election(&self, env: &Env) -> Result<Option<LeaderElection>, String> {
        let on = self.leader_elect.unwrap_or(env.pod_namespace.is_some());
        if !on {
            return Ok(None);
        }
        let namespace = self
            .leader_election_namespace
            .clone()
            .filter(|ns| !ns.trim().is_empty())
            .or_else(|| env.pod_namespace.clone())
            .ok_or(
                "leader election is on but its namespace is unknown: set \
                 --leader-election-namespace (or POD_NAMESPACE), or turn it off with \
                 --leader-elect=false",
            )?;
        let name = self.leader_election_name.trim();
        if name.is_empty() {
            return Err("--leader-election-name must not be empty".to_string());
        }
        let identity = env
            .pod_name
            .clone()
            .unwrap_or_else(|| format!("{}-{}", env.hostname, env.pid));
        Ok(Some(LeaderElection {
            namespace,
            name: name.to_string(),
            identity,
        }))
    }

    /// The webhooks' configuration: off without --webhook-bind-address; the certificate
    /// from --webhook-cert-dir, else pgop's own (which needs a namespace for its Secret and
    /// at least one --webhook-name).
    pub fn webhook(&self, env: &Env) -> Result<Option<pgop_operator::webhook::Config>, String> {
        use pgop_operator::webhook::{Config, cert};
        let Some(BindAddress::At(listen)) = self.webhook_bind_address else {
            return Ok(None);
        };
        let certificate = match &self.webhook_cert_dir {
            Some(dir) => cert::Source::Files {
                dir: dir.clone(),
                check_every: std::time::Duration::from_secs(60),
            },
            None => {
                let namespace = self
                    .webhook_secret_namespace
                    .clone()
                    .or_else(|| env.pod_namespace.clone())
                    .ok_or(
                        "the webhooks' certificate Secret needs a namespace: set \
                         --webhook-secret-namespace (or POD_NAMESPACE), or give \
                         --webhook-cert-dir",
                    )?;
                let names: Vec<String> = self
                    .webhook_names
                    .iter()
                    .map(|n| n.trim().to_string())
                    .filter(|n| !n.is_empty())
                    .collect();
                if names.is_empty() {
                    return Err(
                        "--webhook-name is needed for pgop's own webhook certificate: \
                                the Service's DNS name (e.g. pgop-webhook.pgop-system.svc) \
                                or the address the API server calls"
                            .to_string(),
                    );
                }
                for name in &names {
                    let ok = name.parse::<std::net::IpAddr>().is_ok()
                        || (name.len() <= 253 && pgop_api::formats::is_dns_subdomain(name));
                    if !ok {
                        return Err(format!(
                            "--webhook-name {name:?} is neither a DNS name (lowercase letters, digits, '-' and '.') nor an IP address"
                        ));
                    }
                }
                let secret = self.webhook_secret.trim();
                if !(secret.len() <= 253 && pgop_api::formats::is_dns_subdomain(secret)) {
                    return Err(format!("--webhook-secret {secret:?} is not a Secret name"));
                }
                cert::Source::Managed(cert::Managed {
                    namespace,
                    secret: secret.to_string(),
                    names,
                    configurations: self
                        .webhook_configurations
                        .iter()
                        .map(|n| n.trim().to_string())
                        .filter(|n| !n.is_empty())
                        .collect(),
                    conversion_crds: self
                        .webhook_conversion_crds
                        .iter()
                        .map(|n| n.trim().to_string())
                        .filter(|n| !n.is_empty())
                        .collect(),
                    conversion_client: self.webhook_conversion_service.clone(),
                    validity_days: self.webhook_cert_validity_days,
                    renew_before_days: self.webhook_cert_validity_days / 3,
                    check_every: std::time::Duration::from_secs(60),
                })
            }
        };
        Ok(Some(Config {
            listen,
            certificate,
        }))
    }

    pub fn options(self, env: &Env) -> Result<Options, String> {
        let leader_election = self.leader_election(env)?;
        let webhook = self.webhook(env)?;
        Ok(Options {
            namespaces: unique(self.namespace),
            cluster_selector: self.cluster_selector,
            concurrency: self.concurrency,
            settings: Settings {
                image: self
                    .image
                    .filter(|i| !i.trim().is_empty())
                    .unwrap_or_else(default_image),
                run_as_user: self.instance_uid.unwrap_or(Settings::default().run_as_user),
                run_as_group: self
                    .instance_gid
                    .unwrap_or(Settings::default().run_as_group),
                operator_namespace: env.pod_namespace.clone(),
                instance_otlp_endpoint: self.instance_otlp_endpoint.filter(|u| !u.is_empty()),
            },
            metrics_bind_address: match self.metrics_bind_address {
                None => Some(DEFAULT_METRICS_BIND_ADDRESS),
                Some(BindAddress::At(addr)) => Some(addr),
                Some(BindAddress::Off) => None,
            },
            leader_election,
            version: crate::VERSION.to_string(),
            webhook,
        })
    }
}

/// The image of instance pods when neither `--image` nor the cluster names one.
pub fn default_image() -> String {
    format!("pgop:{}", crate::VERSION)
}

pub async fn run(args: Args) -> Result<(), Error> {
    let options = args.options(&Env::current())?;
    let client = crate::kube_client("operator").await?;
    tracing::info!(version = crate::VERSION, namespaces = %if options.namespaces.is_empty() { "(all)".to_string() } else { options.namespaces.join(",") }, cluster_selector = ?options.cluster_selector.as_ref().map(ToString::to_string), concurrency = options.concurrency, image = %options.settings.image, metrics = ?options.metrics_bind_address, leader_election = ?options.leader_election, "starting pgop operator");
    pgop_operator::run(client, options, shutdown_signal())
        .await
        .map_err(|e| pgop_operator::error_chain(&e))?;
    tracing::info!("pgop operator stopped");
    Ok(())
}

/// Resolves on SIGTERM or Ctrl-C; the controller then finishes the reconciles in flight.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {},
                _ = term.recv() => {},
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn args(flags: &[&str]) -> Args {
        let argv = std::iter::once("pgop-operator").chain(flags.iter().copied());
        Cli::try_parse_from(argv).expect("valid flags").args
    }

    fn in_pod() -> Env {
        Env {
            pod_namespace: Some("pgop-system".into()),
            pod_name: Some("pgop-operator-abc12".into()),
            hostname: "pgop-operator-abc12".into(),
            pid: 1,
        }
    }

    fn outside() -> Env {
        Env {
            pod_namespace: None,
            pod_name: None,
            hostname: "laptop".into(),
            pid: 4242,
        }
    }

    #[test]
    fn the_instance_otlp_endpoint_is_a_url_or_nothing() {
        let endpoint = |flags: &[&str]| {
            args(flags)
                .options(&outside())
                .expect("options")
                .settings
                .instance_otlp_endpoint
        };
        assert_eq!(endpoint(&[]), None);
        assert_eq!(endpoint(&["--instance-otlp-endpoint="]), None);
        assert_eq!(
            endpoint(&["--instance-otlp-endpoint", "http://otel.obs:4318"]).as_deref(),
            Some("http://otel.obs:4318")
        );
        for bad in ["otel:4318", "file:///etc/passwd", "http://a b", "$(reboot)"] {
            let argv = ["pgop-operator", "--instance-otlp-endpoint", bad];
            let error = Cli::try_parse_from(argv).err().map(|e| e.to_string());
            assert!(
                error
                    .as_deref()
                    .is_some_and(|e| e.contains("--instance-otlp-endpoint")),
                "{bad}: {error:?}"
            );
        }
    }

    #[test]
    fn leader_election_is_on_in_a_pod_and_off_outside_by_default() {
        let election = args(&[]).leader_election(&in_pod()).expect("resolved");
        assert_eq!(
            election,
            Some(LeaderElection {
                namespace: "pgop-system".into(),
                name: "pgop-operator".into(),
                identity: "pgop-operator-abc12".into(),
            })
        );
        assert_eq!(args(&[]).leader_election(&outside()), Ok(None));
        assert_eq!(
            args(&["--leader-elect=false"]).leader_election(&in_pod()),
            Ok(None)
        );
        assert_eq!(
            args(&["--leader-elect=0"]).leader_election(&in_pod()),
            Ok(None)
        );
    }

    #[test]
    fn webhooks_are_off_by_default_and_their_flags_are_checked() {
        use pgop_operator::webhook::cert::Source;
        assert!(args(&[]).webhook(&in_pod()).expect("resolved").is_none());
        let on = |extra: &[&str]| {
            let mut flags = vec!["--webhook-bind-address=:9443"];
            flags.extend_from_slice(extra);
            args(&flags).webhook(&in_pod())
        };
        let config = on(&[
            "--webhook-name=pgop-webhook.pgop-system.svc,pgop-webhook.pgop-system.svc.cluster.local",
            "--webhook-configuration=pgop",
        ])
        .expect("valid")
        .expect("on");
        assert_eq!(config.listen.port(), 9443);
        match config.certificate {
            Source::Managed(m) => {
                assert_eq!(m.namespace, "pgop-system");
                assert_eq!(m.secret, "pgop-webhook-tls");
                assert_eq!(m.names.len(), 2);
                assert_eq!(m.configurations, ["pgop"]);
                assert_eq!((m.validity_days, m.renew_before_days), (365, 121));
            }
            other => panic!("{other:?}"),
        }
        let missing = on(&[]).expect_err("no name");
        assert!(missing.contains("--webhook-name"), "{missing}");
        let hostile = on(&["--webhook-name=a\nb"]).expect_err("a newline");
        assert!(hostile.contains("neither a DNS name"), "{hostile}");
        assert!(on(&["--webhook-name=127.0.0.1"]).is_ok());
        let unplaced = args(&["--webhook-bind-address=:9443", "--webhook-name=x"])
            .webhook(&outside())
            .expect_err("no namespace");
        assert!(
            unplaced.contains("--webhook-secret-namespace"),
            "{unplaced}"
        );
        let files = args(&["--webhook-bind-address=:9443", "--webhook-cert-dir=/certs"])
            .webhook(&outside())
            .expect("valid")
            .expect("on");
        assert!(matches!(files.certificate, Source::Files { .. }));
    }

    #[test]
    fn the_conversion_service_is_namespace_slash_name_and_a_port() {
        use pgop_operator::webhook::cert::ConversionClient;
        let service = |namespace: &str, name: &str, port| ConversionClient::Service {
            namespace: namespace.into(),
            name: name.into(),
            port,
        };
        assert_eq!(
            conversion_service("pgop-system/pgop-operator-webhook"),
            Ok(service("pgop-system", "pgop-operator-webhook", 443))
        );
        assert_eq!(
            conversion_service("ops/hooks:8443"),
            Ok(service("ops", "hooks", 8443))
        );
        for hostile in [
            "ops",
            "ops/",
            "/hooks",
            "ops/hooks:0",
            "ops/hooks:x",
            "ops/../hooks",
            "ops/ho\nks",
            "Ops/hooks",
            "ops/$(id)",
            "ops/hooks#x",
        ] {
            let e = conversion_service(hostile).expect_err(hostile);
            assert!(e.contains("NAMESPACE/NAME"), "{hostile}: {e}");
        }
        let config = args(&[
            "--webhook-bind-address=:9443",
            "--webhook-name=x.ops.svc",
            "--webhook-conversion-crd=postgresclusters.database.example.com",
            "--webhook-conversion-service=ops/hooks",
        ])
        .webhook(&in_pod())
        .expect("valid")
        .expect("on");
        match config.certificate {
            pgop_operator::webhook::cert::Source::Managed(m) => {
                assert_eq!(m.conversion_client, Some(service("ops", "hooks", 443)));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn leader_election_flags_override_the_pod() {
        let election = args(&[
            "--leader-elect",
            "--leader-election-namespace",
            "ops",
            "--leader-election-name",
            "pgop-a",
        ])
        .leader_election(&in_pod())
        .expect("resolved")
        .expect("on");
        assert_eq!(election.namespace, "ops");
        assert_eq!(election.name, "pgop-a");
        assert_eq!(election.identity, "pgop-operator-abc12");
        // Outside a Pod: the namespace must be given; the identity is host and pid.
        let election = args(&["--leader-elect=true", "--leader-election-namespace=ops"])
            .leader_election(&outside())
            .expect("resolved")
            .expect("on");
        assert_eq!(election.namespace, "ops");
        assert_eq!(election.identity, "laptop-4242");
    }

    #[test]
    fn leader_election_without_a_namespace_is_an_error_naming_the_flag() {
        let err = args(&["--leader-elect"])
            .leader_election(&outside())
            .expect_err("no namespace");
        assert!(err.contains("--leader-election-namespace"), "{err}");
        let err = args(&["--leader-elect"])
            .options(&outside())
            .expect_err("no namespace");
        assert!(err.contains("--leader-election-namespace"), "{err}");
        let err = args(&["--leader-election-name="])
            .leader_election(&in_pod())
            .expect_err("empty name");
        assert!(err.contains("--leader-election-name"), "{err}");
    }

    #[test]
    fn options_carry_the_leader_election() {
        let options = args(&["--leader-election-name=x"])
            .options(&in_pod())
            .expect("valid");
        assert_eq!(
            options.leader_election.map(|e| (e.namespace, e.name)),
            Some(("pgop-system".to_string(), "x".to_string()))
        );
        assert!(
            args(&[])
                .options(&outside())
                .expect("valid")
                .leader_election
                .is_none()
        );
    }

    #[test]
    fn the_instance_image_defaults_to_this_version() {
        let options = args(&[]).options(&outside()).expect("valid");
        assert_eq!(options.settings.image, format!("pgop:{}", crate::VERSION));
        assert_eq!(options.version, crate::VERSION);
        let options = args(&["--image=registry.example/pgop:1.2.3"])
            .options(&outside())
            .expect("valid");
        assert_eq!(options.settings.image, "registry.example/pgop:1.2.3");
    }

    #[test]
    fn the_cluster_selector_reaches_the_options_and_a_bad_one_names_the_flag() {
        let options = args(&[]).options(&outside()).expect("valid");
        assert!(options.cluster_selector.is_none());
        let options = args(&["--cluster-selector=pgop.example.com/channel!=canary"])
            .options(&outside())
            .expect("valid");
        assert_eq!(
            options.cluster_selector.map(|s| s.to_string()).as_deref(),
            Some("pgop.example.com/channel!=canary")
        );
        let refused = Cli::try_parse_from(["pgop", "--cluster-selector=a=$(reboot)"])
            .expect_err("a hostile value");
        let message = refused.to_string();
        assert!(
            message.contains("--cluster-selector") && message.contains("not a label value"),
            "{message}"
        );
    }

    #[test]
    fn namespaces_are_a_list_repeated_or_comma_separated_each_once() {
        let namespaces =
            |flags: &[&str]| args(flags).options(&outside()).expect("valid").namespaces;
        assert_eq!(namespaces(&[]), Vec::<String>::new(), "all namespaces");
        assert_eq!(namespaces(&["--namespace", "prod"]), ["prod"]);
        assert_eq!(namespaces(&["--namespace=prod,dev-2"]), ["prod", "dev-2"]);
        assert_eq!(
            namespaces(&[
                "--namespace=prod",
                "--namespace",
                "dev,prod",
                "--namespace=0ps"
            ]),
            ["prod", "dev", "0ps"]
        );
    }

    #[test]
    fn a_bad_namespace_names_the_flag() {
        let long = "a".repeat(64);
        for bad in [
            "--namespace=Prod",
            "--namespace=prod,",
            "--namespace=",
            "--namespace=-prod",
            "--namespace=prod-",
            "--namespace=a.b",
            "--namespace=a_b",
            "--namespace=prod,$(reboot)",
        ]
        .into_iter()
        .map(String::from)
        .chain([format!("--namespace={long}")])
        {
            let refused = Cli::try_parse_from(["pgop", bad.as_str()]).expect_err(&bad);
            let message = refused.to_string();
            assert!(
                message.contains("--namespace") && message.contains("not a namespace name"),
                "{bad}: {message}"
            );
        }
        assert_eq!(parse_namespace(&"a".repeat(63)), Ok("a".repeat(63)));
    }

    #[test]
    fn bind_addresses() {
        let at = |s: &str| BindAddress::At(s.parse().expect("an address"));
        assert_eq!(parse_bind_address("0"), Ok(BindAddress::Off));
        assert_eq!(parse_bind_address(""), Ok(BindAddress::Off));
        assert_eq!(parse_bind_address(":9090"), Ok(at("0.0.0.0:9090")));
        assert_eq!(parse_bind_address("127.0.0.1:0"), Ok(at("127.0.0.1:0")));
        assert_eq!(parse_bind_address("[::1]:8080"), Ok(at("[::1]:8080")));
        assert!(parse_bind_address("localhost:8080").is_err());
        assert!(parse_bind_address("8080").is_err());
    }
}
