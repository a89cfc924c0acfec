//! `pgop operator`: runs the controllers against the cluster in the kubeconfig or the
//! in-cluster service account.

use pgop_operator::{DEFAULT_IMAGE, Options, Settings};
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

#[derive(Debug, clap::Args)]
#[group(id = "operator")]
pub struct Args {
    /// Watch only this namespace (all namespaces when unset).
    #[arg(long, env = "PGOP_NAMESPACE")]
    namespace: Option<String>,
    /// Most clusters reconciled at the same time.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..))]
    concurrency: u16,
    /// Image of PostgreSQL instance pods when a cluster does not name one (PostgreSQL
    /// plus the pgop binary).
    #[arg(long, env = "PGOP_IMAGE", default_value = DEFAULT_IMAGE)]
    image: String,
    /// uid instance containers run as (PostgreSQL refuses to run as root) [default: 26;
    /// `pgop dev`: the local `postgres` user].
    #[arg(long, value_parser = clap::value_parser!(i64).range(1..))]
    pub instance_uid: Option<i64>,
    /// gid instance containers run as, also their fsGroup [default: 26; `pgop dev`: the
    /// local `postgres` group].
    #[arg(long, value_parser = clap::value_parser!(i64).range(1..))]
    pub instance_gid: Option<i64>,
    /// Where to serve /metrics (Prometheus), /healthz and /readyz: IP:PORT, :PORT, or `0`
    /// (or empty) for none; port 0 picks a free port [default: 0.0.0.0:8080; `pgop dev`:
    /// 127.0.0.1:0].
    #[arg(long, env = "PGOP_METRICS_BIND_ADDRESS", value_name = "ADDR", value_parser = parse_bind_address)]
    pub metrics_bind_address: Option<BindAddress>,
}

pub type Error = Box<dyn std::error::Error + Send + Sync>;

impl Args {
    pub fn options(self) -> Options {
        Options {
            namespace: self.namespace,
            concurrency: self.concurrency,
            settings: Settings {
                image: self.image,
                run_as_user: self.instance_uid.unwrap_or(Settings::default().run_as_user),
                run_as_group: self
                    .instance_gid
                    .unwrap_or(Settings::default().run_as_group),
            },
            metrics_bind_address: match self.metrics_bind_address {
                None => Some(DEFAULT_METRICS_BIND_ADDRESS),
                Some(BindAddress::At(addr)) => Some(addr),
                Some(BindAddress::Off) => None,
            },
        }
    }
}

pub async fn run(args: Args) -> Result<(), Error> {
    let client = kube::Client::try_default()
        .await
        .map_err(|e| format!("failed to connect to Kubernetes: {e}"))?;
    let options = args.options();
    tracing::info!(namespace = ?options.namespace, concurrency = options.concurrency, image = %options.settings.image, metrics = ?options.metrics_bind_address, "starting pgop operator");
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
